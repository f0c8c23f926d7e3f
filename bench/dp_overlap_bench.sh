#!/usr/bin/env bash
# dp_overlap_bench: the data-parallel step with and without overlapping the gradient
# reduction with the backward pass, in one run: `train` under mpirun -np DP (CPU, MPI),
# one micro-batch per rank per step (the whole reduction is in the last backward pass),
# the same buckets after the backward pass (the reference) and overlapped, and one bucket.
# Prints the median step time of each over the steps after the first two. DEVICE=cuda runs
# the ranks on the GPUs (one each by local rank, or all on one GPU through the host-staged
# MPI communicator where fewer GPUs are visible); MODEL replaces the model's flags.
#
#   bench/dp_overlap_bench.sh [DP=2] [THREADS=1] [STEPS=12]      (BUILD=build by default)
#   DEVICE=cuda MODEL="--num-layers 12 --hidden-size 768 ..." bench/dp_overlap_bench.sh 2
set -euo pipefail
cd "$(dirname "$0")/.."
dp=${1:-2}; threads=${2:-1}; steps=${3:-12}; bin=${BUILD:-build}/bin
data=${MEGABATCH_DATA:-data/brown_gpt2_text_document}
[[ -f $data.bin ]] || { echo "dp_overlap_bench: no $data.bin (run $bin/preprocess brown)" >&2; exit 1; }
mpirun=${MEGABATCH_MPIRUN:-mpirun}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
model=${MODEL:-"--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 128 --micro-batch-size 4"}
device=${DEVICE:-cpu}
micro=$(grep -oE -- '--micro-batch-size [0-9]+' <<<"$model" | awk '{print $2}')
[[ -n $micro ]] || { echo "dp_overlap_bench: MODEL must set --micro-batch-size" >&2; exit 1; }
read -ra model_flags <<< "$model"  # one word each
run() {  # name, extra flags -> median ms of steps 3..
  local extra; read -ra extra <<< "${2:-}"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$mpirun" -np "$dp" --bind-to none "$bin/train" "${model_flags[@]}" \
    --global-batch-size $((micro * dp)) --train-iters "$steps" --lr 1e-4 --log-interval 1 --eval-iters 0 \
    --threads "$threads" --device "$device" --data-path "$data" --run-dir "$tmp/$1" "${extra[@]}" > "$tmp/$1.log" 2>&1 ||
    { echo "dp_overlap_bench: $1 failed:" >&2; tail -5 "$tmp/$1.log" >&2; exit 1; }
  grep -o 'elapsed time per iteration (ms): *[0-9.]*' "$tmp/$1.log" | awk -F': *' 'NR > 2 {print $2}' | sort -n |
    awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'
}
bucket=2000000
one=$(run one "")
after=$(run after "--ddp-bucket-size $bucket")
overlap=$(run overlap "--ddp-bucket-size $bucket --overlap-grad-reduce")
echo "GPT $model; DP $dp ranks x $threads thread(s) on $device; median of $((steps - 2)) steps"
echo "overlapped run: $(grep -E '^> data parallel' "$tmp/overlap.log" | head -1 | sed 's/^> data parallel: //')"
printf '%-44s %12s %10s\n' "" "step ms" "vs ref"
printf '%-44s %12.1f %10s\n' "one bucket, after the backward pass" "$one" "$(awk -v a="$one" -v r="$after" 'BEGIN {printf "%.3f", a / r}')"
printf '%-44s %12.1f %10s\n' "buckets of $bucket, after (reference)" "$after" "1.000"
printf '%-44s %12.1f %10s\n' "buckets of $bucket, overlapped" "$overlap" "$(awk -v a="$overlap" -v r="$after" 'BEGIN {printf "%.3f", a / r}')"
