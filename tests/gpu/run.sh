#!/usr/bin/env bash
# On a GPU machine: unpacks gpu-bundle/ (made by tests/gpu/pack.sh) and runs the `gpu`
# label (test_ops_gpu: every op on the GPU against the CPU reference; test_gpu: the whole
# trainer), gpu_train_bench (GPT-2 124M bf16 against PyTorch on the same GPU) and
# cross_entropy_bench (the LM head's fused cross entropy against its five pieces), each
# with its log and a JUnit XML in LOG_DIR; then a summary. Exit status: 0 when every test
# ran and passed (a skipped test fails the run: on a GPU machine it checked nothing).
#
#   tests/gpu/run.sh LOG_DIR [gtest filter]        # from the repository root
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
logs=${1:?usage: tests/gpu/run.sh LOG_DIR [gtest filter]}; filter=${2:-*}
mkdir -p "$logs"; logs=$(cd "$logs" && pwd)
# shellcheck source=tests/gpu/unpack.sh
source tests/gpu/unpack.sh
{ echo "commit $(cat gpu-bundle/commit 2>/dev/null)"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
  "$b/run.sh" env; } 2>&1 | tee "$logs/machine.txt"
status=0; ran=0
for t in test_ops_gpu test_gpu; do
  "$b/run.sh" bin/$t --gtest_filter="$filter" --gtest_output=xml:"$logs/$t.xml" >"$logs/$t.log" 2>&1 || status=1
  echo "$t: $(gtest_tally "$logs/$t.log")"
  ran=$((ran + $(sed -nE 's/^\[==========\] ([0-9]+) tests? from .* ran\..*/\1/p' "$logs/$t.log" | head -1)))
  grep -E '^\[  FAILED  \] [A-Z]' "$logs/$t.log" || true
  # on a GPU machine nothing may skip: a skipped gpu test checked nothing
  grep -qE '^\[  SKIPPED \] [0-9]' "$logs/$t.log" && { status=1; grep -E '^\[  SKIPPED \] [A-Z]' "$logs/$t.log" | sed 's/ ([0-9]* ms)$//' | sort -u; }
done
# a filter that matches nothing passes "0 tests" in both: that checked nothing either
((ran > 0)) || { echo "the filter '$filter' matched no test (see --gtest_list_tests; parameterized names end in /f32 ...)"; status=1; }
if [[ $filter == "*" ]]; then
  "$b/run.sh" bin/gpu_train_bench >"$logs/gpu_train_bench.log" 2>&1 || echo "gpu_train_bench failed (exit $?)"
  cat "$logs/gpu_train_bench.log"
  "$b/run.sh" bin/cross_entropy_bench --device cuda >"$logs/cross_entropy_bench.log" 2>&1 ||
    echo "cross_entropy_bench failed (exit $?)"
  cat "$logs/cross_entropy_bench.log"
fi
exit $status
