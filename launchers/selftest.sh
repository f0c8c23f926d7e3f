#!/usr/bin/env bash
# selftest: run this first on a new cluster. A short GPT run in a TP x DP layout, started by
# LAUNCH (the launcher's own mpirun or srun), against the same run in one process: the lm
# loss of every iteration must agree to fp32 tolerance (relative 1e-4 on GPUs: the layout
# sums in another order). Checks that ranks start, find their GPUs, form the TP and DP groups
# and that the collectives (NCCL over NVLink and EFA, or MPI) move the right numbers.
#
#   launchers/selftest.sh [--tp T] [--device cuda|cpu] [--iters N] [--dir DIR] -- LAUNCH...
#   e.g. launchers/selftest.sh --tp 2 -- mpirun -np 4          (launch.sh --selftest,
#        submit.sh --selftest and render.py --selftest build LAUNCH for their cluster)
# Exit status: 0 when the layout matches, 1 when it does not, 2 when a run fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
tp=1 device=cuda iters=10 dir=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --tp|--device|--iters|--dir) [[ $# -ge 2 && $2 != -- ]] || { echo "selftest: $1 needs a value" >&2; exit 2; } ;;&
    --tp) tp=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "selftest: unknown option $1" >&2; sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
[[ $# -gt 0 ]] || { echo "selftest: give the launch command after -- (e.g. -- mpirun -np 4)" >&2; exit 2; }
# the run's 8 heads split over TP
[[ $tp =~ ^[1248]$ ]] || { echo "selftest: --tp must be 1, 2, 4 or 8 (it splits 8 attention heads), got '$tp'" >&2; exit 2; }
[[ $iters =~ ^[1-9][0-9]{0,5}$ ]] || { echo "selftest: --iters must be a whole number >= 1, got '$iters'" >&2; exit 2; }
[[ $device =~ ^(cuda|cpu)$ ]] || { echo "selftest: --device must be cuda or cpu, got '$device'" >&2; exit 2; }
# why a run failed: train's own errors (each once: every rank may say it), else the log's end
failed() {
  echo "selftest: $1 failed: $2" >&2
  grep -E '^train( \(rank [0-9]+\))?: error: ' "$2" | sed -E 's/^train \(rank [0-9]+\)/train/' | sort -u | grep . >&2 ||
    tail -5 "$2" >&2
  exit 2
}
bin=${MEGABATCH_BIN:-$root/build/bin}
[[ -x $bin/train && -x $bin/preprocess ]] || { echo "selftest: $bin/train and $bin/preprocess are needed (build, or set MEGABATCH_BIN)" >&2; exit 2; }
[[ -n $dir ]] || dir=$(mktemp -d "${TMPDIR:-/tmp}/megabatch-selftest.XXXXXX")
mkdir -p "$dir"
[[ -f $dir/data/brown_gpt2_text_document.bin ]] || "$bin/preprocess" brown --output-dir "$dir/data" > "$dir/preprocess.log" 2>&1 ||
  { echo "selftest: preprocess brown failed (assets installed? ./setup.sh): $dir/preprocess.log" >&2; exit 2; }
# 8 heads split by TP 1 to 8; the vocabulary padded to the same rows at every TP
args=(--num-layers 2 --hidden-size 128 --num-attention-heads 8 --seq-length 64 --micro-batch-size 2
      --global-batch-size 16 --train-iters "$iters" --lr 1e-3 --log-interval 1 --eval-iters 0 --device "$device"
      --hidden-dropout 0.1 --attention-dropout 0.1 --data-path "$dir/data/brown_gpt2_text_document")
"$bin/train" "${args[@]}" --make-vocab-size-divisible-by 1024 --run-dir "$dir/one" > "$dir/one.log" 2>&1 ||
  failed "the one-process run" "$dir/one.log"
"$@" "$bin/train" "${args[@]}" --tensor-model-parallel-size "$tp" --make-vocab-size-divisible-by $((1024 / tp)) \
  --run-dir "$dir/layout" > "$dir/layout.log" 2>&1 || failed "the layout run" "$dir/layout.log"
layout=$(grep -o '[0-9]* ranks: TP [0-9]* x DP [0-9]*' "$dir/layout.log" | head -1 || true)
collectives=$(grep -o '> collectives: .*' "$dir/layout.log" | head -1 | cut -c16- || true)
py=${MEGABATCH_PYTHON:-/usr/bin/python3}
"$py" - "$dir" "${layout:-1 rank}" "${collectives:-local}" <<'PY'
import sys
import h5py
d, layout, coll = sys.argv[1:4]
one = h5py.File(d + "/one/metrics.h5", "r")["train/lm_loss"][:]
lay = h5py.File(d + "/layout/metrics.h5", "r")["train/lm_loss"][:]
tol = 1e-4
print(f"selftest: {layout} ({coll}) against one process, lm loss per iteration (relative tolerance {tol:g})")
print(f"{'iteration':>9} {'one process':>14} {'layout':>14} {'rel diff':>10}")
bad = len(one) != len(lay)
for i, (a, b) in enumerate(zip(one, lay)):
    r = abs(b - a) / abs(a)
    bad |= not r <= tol
    print(f"{i + 1:>9} {a:>14.6f} {b:>14.6f} {r:>10.2e}{'  <-' if not r <= tol else ''}")
print("selftest: " + ("FAILED: the layout does not reproduce one process" if bad else "passed"))
sys.exit(1 if bad else 0)
PY
