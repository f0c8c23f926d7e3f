#!/bin/bash
# Multi-node training on plain EC2 instances: mpirun over a hostfile, one rank per GPU, with
# the EFA (libfabric) and NCCL environment each instance type needs.
#
#   launchers/ec2/launch.sh --instance-type p4d.24xlarge --hostfile hosts [--dry-run] -- \
#       --model bert4 --tensor-model-parallel-size 2 --micro-batch-size 64 --global-batch-size 4096 ...
#
# hosts lists one private IP or name per line (the instances of one cluster placement group,
# reachable by passwordless ssh, megabatch built at the same path on each). Checks that TP
# divides the ranks and stays inside a node (launchers/plan.py checks memory too).
# --ranks-per-node N overrides one rank per GPU; --mpirun-arg ARG passes ARG to mpirun.
# The programs are taken from $MEGABATCH_BIN (default: build/bin of this checkout).
# --selftest (run it first on a new cluster): launchers/selftest.sh over the same mpirun, a
# short TP x DP run checked against one GPU, in ./megabatch-selftest (a shared directory).
#
#   launchers/ec2/launch.sh --instance-type p4d.24xlarge --hostfile hosts --sweep FILE.json [-- SWEEP_RUN_OPTIONS]
# --sweep runs a sweep's points one after another, each over every GPU of the hostfile's
# nodes: `sweep run FILE --ranks NODESxGPUS --jobs 1` with this mpirun (a script in
# ~/.cache/megabatch/mpirun, as MEGABATCH_MPIRUN). Each point must run as a job of that many ranks,
# and fit the GPUs by plan.py's memory estimate (checked first; with more --ranks-per-node
# than GPUs, the layout only); the runs directory (--runs-dir, after --) must be shared by the
# nodes. Run it again to resume; Ctrl-C stops the running point at a checkpoint; `sweep
# status` and `plot` read it (status names this command, with --rerun damaged, for a lost result).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# usage [STATUS]: the header; on stdout for --help (status 0), else on stderr (status 2)
usage() { sed -n '2,/^[^#]/{/^#/p}' "$0" | sed 's/^# \{0,1\}//' >&"$(( ${1:-2} == 0 ? 1 : 2 ))"; exit "${1:-2}"; }
itype="" hostfile="" dry=0 selftest=0 per_node="" extra=() sweep_file=""
given=("$@")  # as typed: the command that runs a sweep again (below)
while [[ $# -gt 0 ]]; do
  case $1 in
    --instance-type) itype=$2; shift 2 ;;
    --hostfile) hostfile=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --selftest) selftest=1; shift ;;                # a short TP x DP run against one GPU first
    --sweep) sweep_file=$2; shift 2 ;;              # a sweep's points, each over the whole cluster
    --ranks-per-node) per_node=$2; shift 2 ;;       # default: one rank per GPU
    --mpirun-arg) extra+=("$2"); shift 2 ;;         # passed to mpirun as is (repeatable)
    --) shift; break ;;
    -h|--help) usage 0 ;;
    *) echo "launch.sh: unknown option $1 (train options go after --)" >&2; usage ;;
  esac
done
[[ -n $itype && -n $hostfile ]] || usage
[[ -f $hostfile ]] || { echo "launch.sh: no hostfile $hostfile" >&2; exit 2; }
bin=${MEGABATCH_BIN:-$root/build/bin}
[[ -x $bin/train ]] || { echo "launch.sh: $bin/train is needed (build first, or set MEGABATCH_BIN)" >&2; exit 2; }
gpus=$(/usr/bin/python3 -c 'import json,sys; t=json.load(open(sys.argv[1])); print(t[sys.argv[2]]["gpus"]) if sys.argv[2] in t else sys.exit("unknown instance type " + sys.argv[2] + "; known: " + ", ".join(k for k in t if not k.startswith("_")))' "$here/../instances.json" "$itype")
count() { [[ $2 =~ ^[1-9][0-9]{0,5}$ ]] || { echo "launch.sh: $1 must be a whole number >= 1, got '$2'" >&2; exit 2; }; }
nodes=$(grep -cv '^\s*\(#\|$\)' "$hostfile" || true)
(( nodes >= 1 )) || { echo "launch.sh: $hostfile lists no host (one private IP or name per line)" >&2; exit 2; }
[[ -z $per_node ]] || count --ranks-per-node "$per_node"
gpus=${per_node:-$gpus}
np=$((nodes * gpus))
# The layout flags as train reads them (--flag value or --flag=value, a --config file): train
# itself resolves the options, so this check cannot read them otherwise than the run will.
tp=1 model="" micro=8 global="" distributed=0
if [[ -z $sweep_file ]] && ((!selftest)); then
  config=$("$bin/train" --print-config "$@") || { echo "launch.sh: train refuses these options (above)" >&2; exit 2; }
  read -r tp model micro global distributed < <(/usr/bin/python3 -c '
import json, sys
c = json.load(sys.stdin)
print(c.get("tensor_model_parallel_size", 1), c.get("model") or "-", c.get("micro_batch_size", 8), c.get("global_batch_size") or "-",
      int(bool(c.get("use_distributed_optimizer"))))' <<< "$config")
  [[ $model == - ]] && model=""
  [[ $global == - ]] && global=""
fi
count --tensor-model-parallel-size "$tp"
(( np % tp == 0 )) || { echo "launch.sh: $nodes nodes x $gpus GPUs = $np ranks is not a multiple of TP $tp" >&2; exit 2; }
(( tp <= gpus )) || { echo "launch.sh: TP $tp would span nodes ($gpus GPUs per node)" >&2; exit 2; }
# With a model preset, the memory estimate too (launchers/plan.py check).
if [[ -n $model ]]; then
  sharded=()
  ((distributed)) && sharded=(--use-distributed-optimizer)
  /usr/bin/python3 "$here/../plan.py" check --instance "$itype" --nodes "$nodes" --model "$model" --tp "$tp" \
    --micro-batch "$micro" ${global:+--global-batch "$global"} --train "$bin/train" \
    ${per_node:+--ranks-per-node "$per_node"} "${sharded[@]}" >&2 || {
    echo "launch.sh: the layout does not fit (above)" >&2; exit 2; }
fi

efa=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]]["efa_interfaces"])' "$here/../instances.json" "$itype")
env=(-x "NCCL_SOCKET_IFNAME=^lo,docker" -x NCCL_DEBUG=WARN -x OMP_NUM_THREADS=1)
if ((efa > 0)); then  # NCCL over EFA (libfabric, aws-ofi-nccl); sizes without EFA use NCCL's sockets
  env+=(-x FI_PROVIDER=efa -x FI_EFA_FORK_SAFE=1)
  case $itype in
    p4d.*|p4de.*|p5.*|p5en.*) env+=(-x FI_EFA_USE_DEVICE_RDMA=1) ;;   # GPUDirect RDMA over EFA
    g4dn.*) env+=(-x FI_EFA_USE_DEVICE_RDMA=0) ;;                       # no GPUDirect on g4dn
  esac
fi
placing=(--map-by "ppr:$gpus:node" --bind-to none --mca pml ^ucx --mca btl "tcp,self" "${env[@]}" "${extra[@]}")
launch=(mpirun --hostfile "$hostfile" -np "$np" "${placing[@]}")
if [[ -n $sweep_file ]]; then  # sweep run starts each point as MEGABATCH_MPIRUN -np N train ...
  ((!selftest)) || { echo "launch.sh: --selftest or --sweep, not both" >&2; exit 2; }
  [[ -x $bin/sweep ]] || { echo "launch.sh: $bin/sweep is needed (build first, or set MEGABATCH_BIN)" >&2; exit 2; }
  # each point's layout and memory estimate on these GPUs
  /usr/bin/python3 "$here/../plan.py" check-sweep --instance "$itype" --nodes "$nodes" --train "$bin/train" \
    ${per_node:+--ranks-per-node "$per_node"} --sweep "$sweep_file" >&2 ||
    { echo "launch.sh: the sweep's points do not all fit (above)" >&2; exit 2; }
  # The script is named by its text, in the user's cache: the same launch reuses it, and it
  # outlives this script, which execs the sweep (so that signals reach it).
  hosts=$(realpath -- "$hostfile")
  text=$(echo '#!/bin/bash'; echo "# mpirun over $hosts for sweep run --ranks $np (launchers/ec2/launch.sh --sweep)"
         printf 'exec mpirun --hostfile %q' "$hosts"; printf ' %q' "${placing[@]}"; echo ' "$@"')
  cache=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/megabatch/mpirun
  wrapper=$cache/$(sha256sum <<< "$text" | cut -c1-16)
  # This command as typed, its sweep options without --rerun [WORD], ending in them: sweep run
  # records it, and sweep status names it (with --rerun damaged) for a point whose result is lost.
  again=("$root/launchers/ec2/launch.sh") sweep_opts=0 skip=0
  for w in "${given[@]}"; do
    if ((skip)); then skip=0; [[ $w =~ ^(changed|diverged|damaged)$ ]] && continue; fi
    if ((sweep_opts)) && [[ $w == --rerun ]]; then skip=1; continue; fi
    [[ $w == -- ]] && sweep_opts=1
    again+=("$w")
  done
  ((sweep_opts)) || again+=(--)
  cmd=(env "MEGABATCH_MPIRUN=$wrapper" "MEGABATCH_SWEEP_COMMAND=$(printf '%q ' "${again[@]}")" "$bin/sweep" run
       "$sweep_file" --ranks "$np" --jobs 1 "$@")
  if ((dry)); then  # the mpirun and the command, then the sweep's own dry run: its points, each checked to fit
    echo "$text"; printf '%q ' "${cmd[@]}"; echo
    exec "$bin/sweep" run "$sweep_file" --ranks "$np" --dry-run "$@"
  fi
  if [[ ! -x $wrapper || $(<"$wrapper") != "$text" ]]; then  # written whole, then renamed into place
    mkdir -p "$cache" || { echo "launch.sh: cannot create $cache for the sweep's mpirun script" >&2; exit 2; }
    if ! { part=$(mktemp "$wrapper.XXXXXX") && echo "$text" > "$part" && chmod +x "$part" && mv -f "$part" "$wrapper"; }
    then rm -f "${part:-}"; echo "launch.sh: cannot write $wrapper (the sweep's mpirun script)" >&2; exit 2; fi
  fi
  exec "${cmd[@]}"
fi
if ((selftest)); then  # TP 2 where a node has 2 GPUs, DP over the rest; in a shared directory
  cmd=("$root/launchers/selftest.sh" --tp $((gpus >= 2 ? 2 : 1)) --dir "$PWD/megabatch-selftest" -- "${launch[@]}")
else
  cmd=("${launch[@]}" "$bin/train" "$@")
fi
if ((dry)); then printf '%q ' "${cmd[@]}"; echo; exit 0; fi
exec "${cmd[@]}"
