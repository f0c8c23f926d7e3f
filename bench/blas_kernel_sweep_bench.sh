#!/usr/bin/env bash
# The default sweep with the OpenBLAS kernel a user gets (no OPENBLAS_CORETYPE: OpenBLAS's
# pick, or megabatch's where OpenBLAS falls back; docs/performance.md, "The OpenBLAS kernel") against a
# named kernel (REF, default Prescott: OpenBLAS 0.3.21's fallback) in one run, each sweep on
# two vCPUs of different cores of its own, at the same time, for SECONDS at most (both are
# stopped then; a stopped sweep's points say how far they got). First the sgemm rate of
# each kernel on the first two vCPUs. Needs four cores, the build, data/ (build/bin/preprocess
# brown); on a GPU machine, with a packed bundle: source tests/gpu/unpack.sh, then
# MEGABATCH_BIN=$b/bin (the sweeps run on the CPU: CUDA_VISIBLE_DEVICES is emptied).
#
#   bench/blas_kernel_sweep_bench.sh [SECONDS]       # default 1800
#   SWEEP_CPUS="0 1" REF=Nehalem bench/blas_kernel_sweep_bench.sh 60   # CPUs by hand
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
secs=${1:-1800}; ref=${REF:-Prescott}; bin=${MEGABATCH_BIN:-build/bin}
for p in sweep train train_bench; do
  [[ -x $bin/$p ]] || { echo "blas_kernel_sweep_bench.sh: $bin/$p is missing: build first (README's first command)" >&2; exit 2; }
done
[[ -f data/brown_gpt2_compact_text_document.idx ]] ||
  { echo "blas_kernel_sweep_bench.sh: data/ has no default dataset: run build/bin/preprocess brown first" >&2; exit 2; }
unset OPENBLAS_CORETYPE MEGABATCH_OPENBLAS_CHOICE
# two vCPUs of different cores for each sweep
read -r A B < <(python3 -c '
import os
seen = {}
for c in sorted(os.sched_getaffinity(0)):
    t = f"/sys/devices/system/cpu/cpu{c}/topology/"
    key = (open(t + "physical_package_id").read().strip(), open(t + "core_id").read().strip())
    seen.setdefault(key, c)
cs = list(seen.values())
print(f"{cs[0]},{cs[1]}" if len(cs) >= 2 else "-", f"{cs[2]},{cs[3]}" if len(cs) >= 4 else "-")')
[[ -n ${SWEEP_CPUS:-} ]] && read -r A B <<<"$SWEEP_CPUS"  # "0,1 2,3": each sweep's CPUs, by hand
[[ $B != - ]] || { echo "blas_kernel_sweep_bench.sh: needs four cores (two for each sweep), or SWEEP_CPUS" >&2; exit 2; }
lscpu_field() { lscpu | sed -n "s/^$1:[[:space:]]*//p" | head -1; }
echo "machine: $(lscpu_field "Model name") (family $(lscpu_field "CPU family"), model $(lscpu_field "Model")); sweeps on CPUs $A and $B"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
sgemm() { taskset -c "$A" env "$@" "$bin/train_bench" --sgemm --threads 2; }
own=$(sgemm) || exit 2
echo "$own"
for k in $(printf "%s\n" "$ref" Nehalem Haswell SkylakeX | awk '!seen[$0]++'); do sgemm OPENBLAS_CORETYPE="$k" | tail -1 | sed "s/^/OPENBLAS_CORETYPE=$k: /"; done
runs=$(mktemp -d /tmp/blas-kernel-sweep.XXXXXX)
export CUDA_VISIBLE_DEVICES=
mkdir -p "$runs/own" "$runs/ref"
# run_sweep NAME CPUS [VAR=VALUE...]: one sweep, its seconds and exit status in $runs/NAME.rc
run_sweep() {
  local name=$1 cpus=$2 start=$SECONDS rc; shift 2
  env "$@" timeout "$secs" taskset -c "$cpus" "$bin/sweep" run experiments/lamb_bsz.json --runs-dir "$runs/$name" \
    >"$runs/$name.log" 2>&1
  rc=$?
  echo "$((SECONDS - start)) $rc" >"$runs/$name.rc"
}
run_sweep ref "$B" OPENBLAS_CORETYPE="$ref" &
run_sweep own "$A"
wait
mmss() { printf "%d min %d s" $(($1 / 60)) $(($1 % 60)); }
echo
printf "%-40s %-11s %-24s %s\n" "sweep" "kernel" "time" "points (time each)"
for s in own ref; do
  read -r t rc <"$runs/$s.rc"
  kernel=$(head -1 "$runs/$s"/lamb_bsz/*/stdout.log 2>/dev/null | sed -n 's/.*sgemm kernel \([A-Za-z0-9]*\).*/\1/p' | sort -u | xargs)
  label="as a user gets it"; [[ $s == ref ]] && label="OPENBLAS_CORETYPE=$ref (reference)"
  what="$(mmss "$t")"; ((rc == 0)) || what="stopped at $(mmss "$t")"
  printf "%-40s %-11s %-24s %s\n" "$label" "$kernel" "$what" \
    "$(grep -c '^> done' "$runs/$s.log") of 10 ($(sed -n 's/^> done .* (\(.*\))$/\1/p' "$runs/$s.log" | xargs))"
done
echo "runs and logs: $runs"
