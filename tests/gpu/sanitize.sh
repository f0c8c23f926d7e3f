#!/usr/bin/env bash
# On a GPU machine: NVIDIA's compute-sanitizer over megabatch's CUDA code, from the bundle
# tests/gpu/pack.sh made (as tests/gpu/run.sh uses it).
#   kernels: test_ops_gpu (every op on the GPU against the CPU reference, f32/bf16/f16)
#            under memcheck (out-of-bounds and misaligned accesses), racecheck
#            (shared-memory hazards), initcheck (reads of device memory never written) and
#            synccheck (barriers not reached by the whole block);
#   trainer: memcheck over three short runs of `train` that reach every layer, loss, optimizer
#            step, evaluation, diagnostics, the noise scale and a checkpoint: GPT fp32 LAMB,
#            BERT bf16 AdamW, T5 fp16 (loss scaler) lamb_noise.
# Each run has its log in LOG_DIR and a line in the summary: the sanitizer's error count, or
# "timed out" (SANITIZE_TIMEOUT seconds each, default 120; racecheck is the slowest;
# SANITIZE_TOOLS="memcheck" runs the kernels under that tool alone, for a short budget). No leak
# check: the device context and the caching allocator's blocks live until exit. Needs
# a GPU whose runtime lets the sanitizer in (a Firecracker VM does, gVisor does not).
# Exit status: 0 when every run reported 0 errors (and every test passed, none skipped, and
# the filter matched some), 1
# otherwise, 2 when it cannot run (no GPU, no sanitizer, no bundle).
#
#   tests/gpu/sanitize.sh LOG_DIR [kernels|trainer|all] [gtest filter]   # from the repository root
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
logs=${1:?usage: tests/gpu/sanitize.sh LOG_DIR [kernels|trainer|all] [gtest filter]}
what=${2:-all}; filter=${3:-*}; limit=${SANITIZE_TIMEOUT:-120}
[[ $what == kernels || $what == trainer || $what == all ]] || { echo "sanitize.sh: kernels, trainer or all, not '$what'" >&2; exit 2; }
tools=${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}
for tool in $tools; do
  [[ $tool =~ ^(memcheck|racecheck|initcheck|synccheck)$ ]] ||
    { echo "sanitize.sh: SANITIZE_TOOLS: '$tool' is none of memcheck racecheck initcheck synccheck" >&2; exit 2; }
done
mkdir -p "$logs"; logs=$(cd "$logs" && pwd)
cs=$(command -v compute-sanitizer || find /usr/local -maxdepth 3 -path '/usr/local/cuda*/bin/compute-sanitizer' 2>/dev/null | head -1)
[[ -n $cs && -x $cs ]] || { echo "sanitize.sh: no compute-sanitizer on PATH or in /usr/local/cuda*/bin" >&2; exit 2; }
nvidia-smi -L >/dev/null 2>&1 || { echo "sanitize.sh: no GPU here (nvidia-smi -L fails): every run would only skip" >&2; exit 2; }
# shellcheck source=tests/gpu/unpack.sh
source tests/gpu/unpack.sh
echo "commit $(cat gpu-bundle/commit 2>/dev/null); $("$cs" --version | grep -i version | head -1)" | tee "$logs/sanitize.txt"

status=0
# sanitize NAME TOOL ARGS...: one run under the sanitizer, its log and its summary line
sanitize() {
  local name=$1 tool=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$b/run.sh" "$cs" --tool "$tool" --error-exitcode 99 --print-limit 50 "$@" >"$logs/$name.log" 2>&1
  local rc=$? errors
  # memcheck, initcheck and synccheck end with "ERROR SUMMARY: N errors"; racecheck with
  # "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)"
  errors=$(grep -oE 'ERROR SUMMARY: [0-9]+|RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+' "$logs/$name.log" |
    tail -1 | grep -oE '[0-9]+$')
  local line
  if ((rc == 124)); then line="timed out after ${limit} s"; status=1
  elif [[ -z $errors ]]; then line="no sanitizer summary (exit $rc): see $name.log"; status=1
  elif ((errors > 0 || rc != 0)); then line="$errors errors (exit $rc)"; status=1
  else line="0 errors"; fi
  local tests  # the gtest tally, where the run was a test program
  tests=$(gtest_tally "$logs/$name.log")
  [[ -n $tests ]] && line="$line; $tests"
  grep -qE '^\[  (FAILED|SKIPPED) +\] [0-9]' "$logs/$name.log" && status=1
  if grep -qE '^\[==========\] 0 tests from' "$logs/$name.log"; then line="$line; the filter matched no test"; status=1; fi
  printf '%-24s %-10s %s (%d s)\n' "$name" "$tool" "$line" $((SECONDS - start)) | tee -a "$logs/sanitize.txt"
}

if [[ $what != trainer ]]; then
  for tool in $tools; do
    sanitize "ops-$tool" "$tool" bin/test_ops_gpu --gtest_filter="$filter"
  done
fi
if [[ $what != kernels ]]; then
  data=$b/data; runs=$b/runs
  "$b/run.sh" bin/preprocess brown --output-dir "$data" >"$logs/preprocess.log" 2>&1 ||
    { echo "sanitize.sh: preprocess brown failed: see $logs/preprocess.log" | tee -a "$logs/sanitize.txt"; exit 2; }
  common="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --micro-batch-size 4 --global-batch-size 8
    --train-iters 4 --lr 1e-3 --lr-warmup-iters 1 --log-interval 1 --eval-interval 2 --eval-iters 1
    --diagnostics-interval 2 --log-noise-scale --save-interval 4 --threads 4 --device cuda"
  # shellcheck disable=SC2086  # $common is a list of flags
  sanitize train-gpt-fp32-lamb memcheck bin/train --model-type gpt --seq-length 32 $common --optimizer lamb \
    --data-path "$data/brown_gpt2_text_document" --run-dir "$runs/gpt" --save "$runs/gpt/ckpt"
  # shellcheck disable=SC2086
  sanitize train-bert-bf16-adamw memcheck bin/train --model-type bert --seq-length 64 $common --bf16 \
    --data-path "$data/brown_bert_text_sentence" --run-dir "$runs/bert" --save "$runs/bert/ckpt"
  # shellcheck disable=SC2086
  sanitize train-t5-fp16-lamb_noise memcheck bin/train --model-type t5 --seq-length 64 --decoder-seq-length 16 $common \
    --fp16 --initial-loss-scale 65536 --optimizer lamb_noise --data-path "$data/brown_bert_text_sentence" \
    --run-dir "$runs/t5" --save "$runs/t5/ckpt"
fi
exit $status
