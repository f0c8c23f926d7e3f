#!/usr/bin/env bash
# dp_memory_bench: the memory of a data-parallel rank with and without the distributed
# optimizer, in one run: `train` under mpirun -np DP (CPU, MPI), mixed precision, LAMB,
# the same model and batch both ways; the run without --use-distributed-optimizer is the
# reference. Every rank's resident memory (VmRSS) is sampled every 0.1 s from its third
# iteration on (the steady state: every buffer allocated and touched); the table gives the
# largest rank's median of those samples and its peak over the whole run (VmHWM), beside
# what train's "> memory:" line estimates. Each rank is one process with one thread.
#
#   bench/dp_memory_bench.sh [DP=4] [MODEL=gpt2-124m] [DTYPE=bf16]      (BUILD=build by default)
set -euo pipefail
cd "$(dirname "$0")/.."
dp=${1:-4}; model=${2:-gpt2-124m}; dtype=${3:-bf16}; bin=${BUILD:-build}/bin
data=${MEGABATCH_DATA:-data/brown_gpt2_text_document}
[[ -f $data.bin ]] || { echo "dp_memory_bench: no $data.bin (run $bin/preprocess brown)" >&2; exit 1; }
mpirun=${MEGABATCH_MPIRUN:-mpirun}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
iters=6
run() {  # name, extra flags -> "steady_MiB peak_MiB estimate" of the largest rank
  local name=$1 log=$tmp/$1.log samples=$tmp/$1.rss extra
  read -ra extra <<< "${2:-}"  # the extra flags, one word each
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$mpirun" -np "$dp" --oversubscribe --bind-to none \
    "$bin/train" --model "$model" --"$dtype" --seq-length 64 --micro-batch-size 1 --global-batch-size "$dp" \
    --train-iters "$iters" --lr 1e-4 --log-interval 1 --eval-iters 0 --threads 1 --optimizer lamb \
    --data-path "$data" --run-dir "$tmp/$name" "${extra[@]}" > "$log" 2>&1 &
  local job=$!
  : > "$samples"
  while kill -0 "$job" 2> /dev/null; do
    for pid in $(pgrep -f -- "--run-dir $tmp/$name" || true); do
      [[ $(tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null) == "$bin/train"* ]] || continue  # the ranks, not mpirun
      steady=$(grep -c "iteration  *[3-9]/" "$log" || true)
      awk -v p="$pid" -v s="$steady" '/VmRSS|VmHWM/ {v[$1] = int($2 / 1024)}
        END {if (v["VmRSS:"]) print p, s, v["VmRSS:"], v["VmHWM:"]}' "/proc/$pid/status" 2> /dev/null >> "$samples" || true
    done
    sleep 0.1
  done
  wait "$job" || { echo "dp_memory_bench: $name failed:" >&2; tail -5 "$log" >&2; exit 1; }
  local estimate
  estimate=$(grep -o '> memory: about [0-9.]* [KMG]iB' "$log" | head -1 | sed 's/> memory: about //')
  # per rank: median RSS of the steady samples, last VmHWM; then the largest rank
  awk '{hwm[$1] = $4} $2 > 0 {n[$1]++; r[$1, n[$1]] = $3}
    END {s = 0; h = 0
      for (p in hwm) {
        m = n[p]; if (!m) continue
        k = 0; for (i = 1; i <= m; i++) v[++k] = r[p, i]
        for (i = 2; i <= k; i++) {x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x}
        med = v[int((k + 1) / 2)]; if (med > s) s = med; if (hwm[p] > h) h = hwm[p]}
      print s, h}' "$samples" | { read -r s h; echo "$s $h $estimate"; }
}
read -r ref_s ref_h ref_e <<< "$(run plain "")"
read -r dist_s dist_h dist_e <<< "$(run dist "--use-distributed-optimizer")"
[[ $ref_s -gt 0 && $dist_s -gt 0 ]] || { echo "dp_memory_bench: no steady-state samples (runs too short?)" >&2; exit 1; }
echo "$model, $dtype, LAMB, DP $dp ranks x 1 thread (MPI, CPU); seq 64, micro batch 1; RSS of the largest rank"
printf '%-40s %18s %12s %18s\n' "" "steady RSS (MiB)" "peak (MiB)" "train's estimate"
printf '%-40s %18s %12s %18s\n' "without the distributed optimizer (ref)" "$ref_s" "$ref_h" "$ref_e"
printf '%-40s %18s %12s %18s\n' "--use-distributed-optimizer" "$dist_s" "$dist_h" "$dist_e"
printf '%-40s %18s %12s\n' "saved per rank" "$((ref_s - dist_s))" "$((ref_h - dist_h))"
