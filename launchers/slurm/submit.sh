#!/bin/bash
# Submits a sweep to Slurm as a job array: one task per point, at most --max-running at once,
# each task `train` under srun --mpi=pmix on --nodes nodes with --ntasks-per-node ranks,
# requeued (and resumed from its checkpoint) when preempted or near its time limit.
#
#   launchers/slurm/submit.sh experiments/paper/bert4_lamb_bsz.json --partition p4d --time 24:00:00 \
#       [--nodes 2 --ntasks-per-node 8 --gpus-per-node 8] [--max-running 4] [--container IMAGE] [--runs-dir runs] [--dry-run]
#       [--rerun [changed|diverged|damaged]]
#
# Sizes the sweep file's "cluster" names (nodes, gpus_per_node) are the defaults of --nodes,
# --ntasks-per-node and --gpus-per-node (0: ask for no GPUs); else 1 node, 1 task, no GPUs.
# Every point must fit a job of nodes x tasks ranks, and on the cluster's instance type its
# GPUs' memory by launchers/plan.py's estimate (refused before anything is submitted).
# Points write to RUNS_DIR/<sweep>/<id>/ as with `sweep run`, so `sweep status` and
# `sweep plot` work on a Slurm sweep too (RUNS_DIR must be on a shared file system: FSx).
# --rerun, as sweep run's: discards the points whose configuration changed (changed, also a
# bare --rerun), that diverged, or whose result is lost (damaged: a finished point whose
# metrics.h5 no longer reads, as sweep status says), so that their tasks run them afresh.
#   launchers/slurm/submit.sh --selftest --nodes 2 --ntasks-per-node 8 [--gpus-per-node 8] [--device cpu] ...
# (run it first on a new cluster) submits launchers/selftest.sh instead: a short TP x DP run
# under the same srun, checked against one GPU (--device cpu: one CPU process, on a cluster
# without GPUs), in RUNS_DIR/selftest; its table and verdict in RUNS_DIR/selftest-<job>.out.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# usage [STATUS]: the header; on stdout for --help (status 0), else on stderr (status 2)
usage() { sed -n '2,/^[^#]/{/^#/p}' "$0" | sed 's/^# \{0,1\}//' >&"$(( ${1:-2} == 0 ? 1 : 2 ))"; exit "${1:-2}"; }
[[ $# -ge 1 ]] || usage
[[ $1 == -h || $1 == --help ]] && usage 0
sweep_file=""
case $1 in
  --selftest) ;;
  -*) echo "submit.sh: the sweep file (or --selftest) comes first, before $1" >&2; usage ;;
  *) sweep_file=$1 ;;
esac
shift
nodes="" ntasks="" partition="" time_limit="" max_running=4 container="" runs_dir="runs" dry=0 gpus="" device="" rerun=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --ntasks-per-node) ntasks=$2; shift 2 ;;
    --gpus-per-node) gpus=$2; shift 2 ;;
    --partition) partition=$2; shift 2 ;;
    --time) time_limit=$2; shift 2 ;;
    --max-running) max_running=$2; shift 2 ;;
    --container) container=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --runs-dir) runs_dir=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --rerun)  # an optional word, as sweep's own --rerun takes it
      if [[ ${2:-} =~ ^(changed|diverged|damaged)$ ]]; then rerun=(--rerun "$2"); shift 2; else rerun=(--rerun); shift; fi ;;
    -h|--help) usage 0 ;;
    *) echo "submit.sh: unknown option $1" >&2; usage ;;
  esac
done
count() { [[ $2 =~ ^[1-9][0-9]{0,5}$ ]] || { echo "submit.sh: $1 must be a whole number >= 1, got '$2'" >&2; exit 2; }; }
# shown WORD...: the words as one command line to paste, quoted only where they need it
shown() {
  local w words=()
  for w; do if [[ $w =~ ^[A-Za-z0-9_./:=%,+@-]+$ ]]; then words+=("$w"); else words+=("${w@Q}"); fi; done
  echo "${words[*]}"
}
# last_line TEXT: sweep export-points ends with its "DIR/points.txt: N points ..." line (its
# warnings and --rerun's discards come before it)
last_line() { printf '%s\n' "${1##*$'\n'}"; }
# sweep_points LINE: the N of that line
sweep_points() { local n=${1##*/points.txt: }; echo "${n%% points*}"; }
[[ -z $nodes ]] || count --nodes "$nodes"
[[ -z $ntasks ]] || count --ntasks-per-node "$ntasks"
count --max-running "$max_running"
[[ -z $device || ( -z $sweep_file && $device =~ ^(cuda|cpu)$ ) ]] || {
  echo "submit.sh: --device is the self-test's (--selftest --device cuda|cpu), got '$device'; a sweep's points name their device in the sweep file" >&2; exit 2; }
[[ -n $sweep_file || ${#rerun[@]} == 0 ]] || { echo "submit.sh: --rerun is a sweep's (submit.sh FILE.json --rerun ...), not the self-test's" >&2; exit 2; }
[[ -z $gpus || $gpus =~ ^(0|[1-9][0-9]{0,5})$ ]] || { echo "submit.sh: --gpus-per-node must be a whole number (0: no GPUs), got '$gpus'" >&2; exit 2; }
bin=${MEGABATCH_BIN:-$root/build/bin}
if [[ -n $sweep_file && ( -z $nodes || -z $ntasks || -z $gpus ) ]]; then  # the sizes the sweep was made for
  [[ -x $bin/sweep ]] || { echo "submit.sh: $bin/sweep is needed (build first, or set MEGABATCH_BIN)" >&2; exit 2; }
  cluster=$("$bin/sweep" export-points "$sweep_file" --cluster) || exit 2
  if [[ -n $cluster ]]; then
    read -r c_nodes c_gpus c_type <<< "$cluster"
    given=""  # the sizes the flags gave, which win over the cluster's
    [[ -n $nodes ]] && given+=" --nodes"
    [[ -n $ntasks ]] && given+=" --ntasks-per-node"
    [[ -n $gpus ]] && given+=" --gpus-per-node"
    nodes=${nodes:-$c_nodes} ntasks=${ntasks:-$c_gpus} gpus=${gpus:-$c_gpus}
    echo "submit.sh: sized as the sweep's cluster says ($c_type)${given:+, but${given} as given}: --nodes $nodes --ntasks-per-node $ntasks --gpus-per-node $gpus"
  fi
fi
nodes=${nodes:-1} ntasks=${ntasks:-1}
[[ $gpus == 0 ]] && gpus=""
if [[ -z $sweep_file ]]; then  # --selftest: one job over the same nodes and tasks
  tp=$((ntasks >= 2 ? 2 : 1))
  selftest_dir="$(cd "$runs_dir" 2>/dev/null && pwd || echo "$runs_dir")/selftest"
  run=(env "MEGABATCH_BIN=$bin" "$root/launchers/selftest.sh" --tp "$tp" ${device:+--device "$device"} --dir "$selftest_dir"
       -- srun --mpi=pmix ${container:+"--container-image=$container"})
  args=(--nodes="$nodes" --ntasks-per-node="$ntasks" --job-name=megabatch-selftest --output="$runs_dir/selftest-%j.out")
  [[ -n $partition ]] && args+=(--partition="$partition")
  [[ -n $gpus ]] && args+=(--gpus-per-node="$gpus")
  args+=(--wrap="$(printf '%q ' "${run[@]}")")  # each word quoted for the job's shell: any path survives
  if ((dry)); then shown sbatch "${args[@]}"; exit 0; fi
  mkdir -p "$runs_dir" && exec sbatch "${args[@]}"
fi
[[ -x $bin/sweep && -x $bin/train ]] || { echo "submit.sh: $bin/sweep and $bin/train are needed (build first, or set MEGABATCH_BIN)" >&2; exit 2; }
# On the GPUs of the sweep's cluster (its instance type): each point's layout and memory estimate
# too (launchers/plan.py check-sweep), for the ranks and GPUs a node is given.
if [[ -n ${c_type:-} && -z $gpus ]]; then
  echo "submit.sh: no GPUs asked (--gpus-per-node 0): the points are not checked against the $c_type's GPU memory"
elif [[ -n ${c_type:-} ]]; then
  if ! fit=$(/usr/bin/python3 "$here/../plan.py" check-sweep --instance "$c_type" --nodes "$nodes" \
               --ranks-per-node "$ntasks" --gpus-per-node "$gpus" --train "$bin/train" --sweep "$sweep_file"); then
    echo "$fit" >&2; echo "submit.sh: the sweep's points do not all fit (above); nothing submitted" >&2; exit 2
  fi
  echo "$fit"
fi
export_args=("$sweep_file" --runs-dir "$runs_dir" --ranks $((nodes * ntasks)) "${rerun[@]}")
# the points checked and where they go, with nothing written yet: ".../<name>/points.txt: N points ..."
planned=$("$bin/sweep" export-points "${export_args[@]}" --dry-run) || exit 2
planned_line=$(last_line "$planned")
sweep_dir=$(realpath -m -- "${planned_line%%/points.txt:*}")  # absolute: the tasks' working directory
# pyxis takes --container-mounts=SRC:DST[,SRC:DST...]: a comma or colon in the path would split it
if [[ -n $container && $sweep_dir == *[,:]* ]]; then
  echo "submit.sh: --container mounts the sweep's directory into the container, and pyxis cannot mount $sweep_dir (a comma or colon in its path); give --runs-dir a path without them" >&2; exit 2
fi
# What each task needs, in a file the batch script sources from its working directory (the
# sweep's): values quoted for bash, so that commas, quotes, spaces and $ in paths survive
# (sbatch --export=VAR=value,... splits at commas).
env_text=$(
  printf '# written by launchers/slurm/submit.sh; sourced by point.sbatch\n'
  printf 'SWEEP_DIR=%q\nTRAIN=%q\nSWEEP=%q\n' "$sweep_dir" "$bin/train" "$bin/sweep"
  printf 'CONTAINER_ARGS=('
  [[ -n $container ]] && printf '%q ' "--container-image=$container" "--container-mounts=$sweep_dir:$sweep_dir"
  printf ')\n')
if ((dry)); then  # what would be discarded, written and submitted; nothing is
  echo "$planned"
  exported=$planned_line
else
  # Not while an array of this sweep is queued or running (its tasks run in the sweep's
  # directory): a second would run its points again beside the first, and fail on their
  # locks. Checked before anything is written, or discarded by --rerun.
  # %F: the array's job id, which each of its running tasks (a job id of its own, %A) shares.
  # "ID|DIR" lines: the directory is the rest of the line after the first '|' (spaces and all).
  if queued=$(squeue -h --me -o "%F|%Z" 2>/dev/null); then
    held=$(while IFS= read -r line; do if [[ ${line#*|} == "$sweep_dir" ]]; then echo "${line%%|*}"; fi; done <<< "$queued" |
           sort -u | tr '\n' ' ')
    [[ -z $held ]] || { echo "submit.sh: $sweep_dir is already queued or running as job ${held% }; it goes on by itself (a point near its time limit requeues itself). To submit it again, scancel ${held% } first: each running point stops at a checkpoint and resumes from there" >&2; exit 2; }
  fi
  out=$("$bin/sweep" export-points "${export_args[@]}") || { echo "$out"; exit 2; }
  echo "$out"
  exported=$(last_line "$out")
fi
args=(--array="0-$(( $(sweep_points "$exported") - 1 ))%$max_running" --nodes="$nodes" --ntasks-per-node="$ntasks")
[[ -n $partition ]] && args+=(--partition="$partition")
[[ -n $time_limit ]] && args+=(--time="$time_limit")
[[ -n $gpus ]] && args+=(--gpus-per-node="$gpus")
args+=(--chdir="$sweep_dir" "$here/point.sbatch")
if ((dry)); then
  echo "$sweep_dir/slurm.env would hold:"; echo "$env_text"
  shown sbatch "${args[@]}"; exit 0
fi
printf '%s\n' "$env_text" > "$sweep_dir/slurm.env.tmp" && mv "$sweep_dir/slurm.env.tmp" "$sweep_dir/slurm.env"
sbatch "${args[@]}"
