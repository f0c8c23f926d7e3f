#!/usr/bin/env bash
# On a GPU machine: unpacks gpu-bundle/ (made by tests/gpu/pack.sh) and runs the `gpu`
# label (test_ops_gpu: every op on the GPU against the CPU reference; test_gpu: the whole
# trainer; test_ops_gpu_sm75: the flash tests of a build for sm_75 alone, whose code the driver
# compiles for this GPU: the T4 path; and test_gpu's flash training test again with the opt-in
# flash variants), then the benchmarks, the GPU performance page's tables first:
# gpu_train_bench (GPT-2 124M bf16 at micro-batch 8 and 16 against PyTorch on the same GPU, each
# with its --profile table; BERT-large, seq 128, micro-batch 64, with LAMB and AdamW against
# PyTorch's fused AdamW and a torch._foreach LAMB), attention_bench (the flash kernels against
# PyTorch's SDPA), GPT-2 124M at sequence lengths 4096 and 8192 with their memory, optim_bench
# --device cuda (the LAMB and AdamW steps against the GPU's copy bandwidth and PyTorch); then
# cross_entropy_bench (the LM head's fused cross entropy against its five pieces), BERT-large
# and GPT-2 again with Megatron's default dropout 0.1 on both sides, and attention_bench with
# grouped-query attention (4 key/value heads, against SDPA's enable_gqa), with documents of 512
# tokens packed in rows of 4096 and 8192 (against SDPA with the documents' mask) and with
# attention dropout 0.1 (against SDPA's dropout_p). Each has its log and a JUnit XML in LOG_DIR;
# then a summary. Exit status: 0 when every test ran and passed (a skipped test fails the run:
# on a GPU machine it checked nothing) and every benchmark finished.
# Each program has GPU_TEST_TIMEOUT seconds (default 240), so that one that hangs leaves the
# device time to the next; its log keeps what it wrote, and the summary says it timed out.
# GPU_RUN=tests or GPU_RUN=benches runs one half (two calls, where one may not take long
# enough for both); the default, all, runs both.
#
#   tests/gpu/run.sh LOG_DIR [gtest filter]        # from the repository root
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
logs=${1:?usage: tests/gpu/run.sh LOG_DIR [gtest filter]}; filter=${2:-*}; parts=${GPU_RUN:-all}
[[ $parts =~ ^(tests|benches|all)$ ]] || { echo "run.sh: GPU_RUN: tests, benches or all, not '$parts'" >&2; exit 2; }
mkdir -p "$logs"; logs=$(cd "$logs" && pwd)
# shellcheck source=tests/gpu/unpack.sh
source tests/gpu/unpack.sh
{ echo "commit $(cat gpu-bundle/commit 2>/dev/null)"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
  "$b/run.sh" env; } 2>&1 | tee "$logs/machine.txt"
limit=${GPU_TEST_TIMEOUT:-240}
# timed NAME COMMAND...: runs it under the time limit, its output in LOG_DIR/NAME.log; says how
# long it took, and whether it was stopped
timed() {
  local name=$1 start=$SECONDS rc; shift
  timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1; rc=$?
  ((rc == 124 || rc == 137)) && echo "$name: timed out after $limit s (GPU_TEST_TIMEOUT); its log has what it wrote"
  echo "$name: $((SECONDS - start)) s" >>"$logs/times.txt"
  return $rc
}
status=0; ran=0
if [[ $parts != benches ]]; then
  for t in test_ops_gpu test_gpu test_ops_gpu_sm75; do
    f=$filter
    [[ $t == test_ops_gpu_sm75 ]] && f="*Flash*"  # the T4 path is the flash kernels'
    [[ $t == test_ops_gpu_sm75 && $filter != "*" ]] && continue
    timed $t "$b/run.sh" bin/$t --gtest_filter="$f" --gtest_output=xml:"$logs/$t.xml" || status=1
    echo "$t: $(gtest_tally "$logs/$t.log") ($(tail -1 "$logs/times.txt" | cut -d' ' -f2-))"
    ran=$((ran + $(sed -nE 's/^\[==========\] ([0-9]+) tests? from .* ran\..*/\1/p' "$logs/$t.log" | head -1)))
    grep -E '^\[  FAILED  \] [A-Z]' "$logs/$t.log" || true
    # on a GPU machine nothing may skip: a skipped gpu test checked nothing
    grep -qE '^\[  SKIPPED \] [0-9]' "$logs/$t.log" && { status=1; grep -E '^\[  SKIPPED \] [A-Z]' "$logs/$t.log" | sed 's/ ([0-9]* ms)$//' | sort -u; }
  done
  # The trainer's flash test (GPT, BERT and T5 near f32, bitwise twice) once more with the opt-in
  # variants (the ordered dQ, 32 forward rows a warp) as the process's choice, so that making
  # either the default needs no second GPU run (the op tests run both variants already).
  if [[ $filter == "*" ]]; then
    MEGABATCH_FLASH_DQ=ordered MEGABATCH_FLASH_FORWARD_ROWS=32 timed test_gpu_flash_variants "$b/run.sh" bin/test_gpu \
      --gtest_filter='Gpu.FlashAttention*' --gtest_output=xml:"$logs/test_gpu_flash_variants.xml" || status=1
    echo "test_gpu with MEGABATCH_FLASH_DQ=ordered MEGABATCH_FLASH_FORWARD_ROWS=32: $(gtest_tally "$logs/test_gpu_flash_variants.log")"
    grep -E '^\[  FAILED  \] [A-Z]' "$logs/test_gpu_flash_variants.log" || true
    grep -qE '^\[  SKIPPED \] [0-9]' "$logs/test_gpu_flash_variants.log" && status=1
  fi
  # a filter that matches nothing passes "0 tests" in both: that checked nothing either
  ((ran > 0)) || { echo "the filter '$filter' matched no test (see --gtest_list_tests; parameterized names end in /f32 ...)"; status=1; }
fi
# bench NAME PROGRAM ARGS...: a benchmark, timed; its table printed; a failure counted
benches_failed=0
bench() {
  local name=$1 program=$2; shift 2
  timed "$name" "$b/run.sh" "bin/$program" "$@" || { echo "$name failed (exit $?): $program $*"; benches_failed=$((benches_failed + 1)); }
  cat "$logs/$name.log"
}
if [[ $filter == "*" && $parts != tests ]]; then
  bench gpu_train_bench gpu_train_bench --torch-modes sdpa compile --profile
  bench gpu_train_bench_mb16 gpu_train_bench --micro-batch-size 16 --torch-modes sdpa compile --profile
  bench gpu_train_bench_bert gpu_train_bench --model bert-large --seq-length 128 --micro-batch-size 64 \
    --optimizers lamb adamw
  bench attention_bench attention_bench
  # long sequences: GPT-2 124M at 4096 and 8192 tokens a sample, with the memory they take
  bench gpu_train_bench_seq4096 gpu_train_bench --seq-length 4096 --micro-batch-size 2 --steps 5 --torch-modes sdpa
  bench gpu_train_bench_seq8192 gpu_train_bench --seq-length 8192 --micro-batch-size 1 --steps 5 --torch-modes sdpa
  # the issue's other targets, then what adds to them: a call cut short by its limit keeps the
  # figures above (each log is written as its program runs)
  bench optim_bench optim_bench --device cuda --models gpt2-124m
  bench cross_entropy_bench cross_entropy_bench --device cuda
  # with Megatron's default dropout (0.1, hidden and attention) on both sides, the default flash kernels only
  bench gpu_train_bench_bert_dropout gpu_train_bench --model bert-large --seq-length 128 --micro-batch-size 64 \
    --optimizers lamb adamw --flash-dq separate --flash-forward-rows 16 --dropout 0.1
  bench gpu_train_bench_dropout gpu_train_bench --torch-modes sdpa --flash-dq separate --flash-forward-rows 16 \
    --dropout 0.1
  bench attention_bench_gqa attention_bench --groups 4 --seqs 1024 4096 --reps 10
  bench attention_bench_documents attention_bench --documents 512 --seqs 4096 8192 --head-sizes 64 --reps 10
  bench attention_bench_dropout attention_bench --dropout 0.1 --seqs 1024 4096 --reps 10
  ((benches_failed == 0)) || { echo "$benches_failed benchmark(s) failed (their logs are in $logs)"; status=1; }
fi
exit $status
