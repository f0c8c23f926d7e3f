#!/usr/bin/env bash
# On a GPU machine: unpacks gpu-bundle/ (made by tests/gpu/pack.sh) and runs the `gpu`
# label (test_ops_gpu: every op on the GPU against the CPU reference; test_gpu: the whole
# trainer) and gpu_train_bench (GPT-2 124M bf16 against PyTorch on the same GPU), each
# with its log and a JUnit XML in LOG_DIR; then a summary. Exit status: that of the tests.
#
#   tests/gpu/run.sh LOG_DIR [gtest filter]        # from the repository root
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=${1:?usage: tests/gpu/run.sh LOG_DIR [gtest filter]}; filter=${2:-*}
mkdir -p "$logs"; logs=$(cd "$logs" && pwd)
b=/tmp/megabatch-gpu; rm -rf "$b"; mkdir -p "$b"; tar -xJf gpu-bundle/bundle.tar.xz -C "$b"
if ! command -v mpirun >/dev/null && [[ -f gpu-bundle/openmpi.tar.xz ]]; then  # the packed Open MPI
  mkdir -p "$b/openmpi" && tar -xJf gpu-bundle/openmpi.tar.xz -C "$b/openmpi" && source "$b/openmpi/env.sh"
fi
export MEGABATCH_BIN_DIR=$b/bin MEGABATCH_SOURCE_DIR=$PWD MEGABATCH_ASSETS=$b/extra/assets \
  MEGABATCH_TEST_PLUGIN_DIR=$b/extra/plugins MEGABATCH_PYTHON=$(command -v python3)
{ echo "commit $(cat gpu-bundle/commit 2>/dev/null)"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
  "$b/run.sh" env; } 2>&1 | tee "$logs/machine.txt"
status=0
for t in test_ops_gpu test_gpu; do
  "$b/run.sh" bin/$t --gtest_filter="$filter" --gtest_output=xml:"$logs/$t.xml" >"$logs/$t.log" 2>&1 || status=1
  echo "$t: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$logs/$t.log" | sed 's/, listed below://' | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' "$logs/$t.log" || true
done
if [[ $filter == "*" ]]; then
  "$b/run.sh" bin/gpu_train_bench >"$logs/gpu_train_bench.log" 2>&1 || echo "gpu_train_bench failed (exit $?)"
  cat "$logs/gpu_train_bench.log"
fi
exit $status
