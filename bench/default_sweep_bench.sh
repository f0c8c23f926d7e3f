#!/usr/bin/env bash
# The README's promise for the first command, measured on this machine in one run: the
# machine (lscpu: model, cores, threads per core), OpenBLAS's sgemm kernel and rate with 1
# and 2 threads (what experiments/RESULTS.md's timing table lists per machine), then the
# default sweep and its plots timed from scratch in a new runs directory, each point's result
# beside RESULTS.md's, and the row this machine would add to its timing table.
#
#   bench/default_sweep_bench.sh [RUNS_DIR]     # from the repository root, after the build
#                                               # and `build/bin/preprocess brown`
#
# RUNS_DIR (default: a new directory under /tmp) must not hold the sweep already: a sweep
# that resumes is not timed from scratch. The OpenBLAS kernel is whatever the programs get
# (OPENBLAS_CORETYPE, if set, picks it; else OpenBLAS, unless it falls back to a kernel
# without AVX2 on a CPU with AVX2, where megabatch picks: docs/performance.md, "The OpenBLAS kernel");
# nothing here changes it. About 6 minutes on the development machine, 14 on a 2-core
# machine at 62 GFLOP/s.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
bin=${MEGABATCH_BIN:-build/bin}
for p in sweep train train_bench; do
  [[ -x $bin/$p ]] || { echo "default_sweep_bench.sh: $bin/$p is missing: build first (README's first command)" >&2; exit 2; }
done
[[ -f data/brown_gpt2_compact_text_document.idx ]] ||
  { echo "default_sweep_bench.sh: data/ has no default dataset: run build/bin/preprocess brown first" >&2; exit 2; }
runs=${1:-$(mktemp -d /tmp/default-sweep-bench.XXXXXX)}
name=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["name"])' experiments/lamb_bsz.json) || exit 2
[[ -e $runs/$name ]] && { echo "default_sweep_bench.sh: $runs/$name exists; give a new RUNS_DIR, the sweep must start from scratch" >&2; exit 2; }
mkdir -p "$runs" || exit 2

lscpu_field() { lscpu | sed -n "s/^$1:[[:space:]]*//p" | head -1; }
model=$(lscpu_field "Model name") cpus=$(lscpu_field "CPU(s)") per_core=$(lscpu_field "Thread(s) per core")
echo "machine: $model; $cpus CPUs, $per_core thread(s) per core$( ((per_core > 1)) && echo " (two vCPUs may be one core's hyperthreads; see experiments/RESULTS.md)")"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (plus uncommitted changes)')"
"$bin/train_bench" --sgemm --threads 1 | tail -1
two=$("$bin/train_bench" --sgemm --threads 2) || exit 2
echo "$two"
kernel=$(head -1 <<<"$two" | sed -n 's/.*sgemm kernel \([A-Za-z0-9]*\).*/\1/p')
rate2=$(sed -n 's/.*threads: \([0-9.]*\) GFLOP.*/\1/p' <<<"$two")

# the first command's sweep and plots, timed as a user sees them
start=$(date +%s.%N)
"$bin/sweep" run experiments/lamb_bsz.json --runs-dir "$runs" >"$runs/sweep-run.log" 2>&1
rc=$?
ran=$(date +%s.%N)
((rc == 0)) && { "$bin/sweep" plot "$runs/$name" >"$runs/sweep-plot.log" 2>&1 || rc=$?; }
end=$(date +%s.%N)
if ((rc != 0)); then
  echo "default_sweep_bench.sh: the sweep or its plots failed (exit $rc): $runs/sweep-run.log, $runs/sweep-plot.log" >&2
  tail -5 "$runs/sweep-run.log" >&2
  exit 1
fi
mmss() { awk -v s="$1" 'BEGIN { s = int(s + 0.5); printf "%d min %d s", s / 60, s % 60 }'; }
sweep_s=$(awk -v a="$start" -v b="$ran" 'BEGIN { print b - a }')
total_s=$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')
"$bin/sweep" status "$runs/$name" | sed -n '1,12p'
echo "experiments/RESULTS.md's table at the same points (final validation loss):"
table=$(sed -n '/^| global batch | 8 | 16/,/^| adamw/{p;/^| adamw/q}' experiments/RESULTS.md)  # (the first table)
[[ -n $table ]] || { echo "default_sweep_bench.sh: experiments/RESULTS.md has no '| global batch | 8 | 16 ...' table" >&2; exit 1; }
echo "$table"
echo
echo "default sweep: $(mmss "$sweep_s") (sweep run), $(mmss "$total_s") with sweep plot; the README says about six minutes on two cores of a current Xeon or EPYC"
echo "RESULTS.md row: | $model, OpenBLAS's $kernel kernel | $rate2 GFLOP/s | $(mmss "$total_s") with \`sweep plot\` | $(git rev-parse --short HEAD 2>/dev/null) |"
echo "runs and logs: $runs"
