# shellcheck shell=bash
# Sourced by tests/gpu/run.sh and tests/gpu/sanitize.sh, from the repository root on a GPU
# machine: checks that the tree is the one gpu-bundle/ was built from (tests/gpu/sources.sh),
# unpacks gpu-bundle/ (tests/gpu/pack.sh) into $b, puts the packed Open MPI on
# PATH where the machine has no mpirun, and exports what the tests read (binaries, source,
# assets, test plugins, python3). Afterwards "$b/run.sh" bin/<binary> runs a packed binary,
# and gtest_tally LOG prints a gtest log's tally on one line.
b=/tmp/megabatch-gpu
if ! tests/gpu/sources.sh check gpu-bundle; then  # (a bundle from before the tree's last change)
  if [[ ${GPU_BUNDLE_STALE_OK:-} == 1 ]]; then
    echo "unpack.sh: GPU_BUNDLE_STALE_OK=1: running the bundle's binaries all the same" >&2
  else
    echo "unpack.sh: stopped before running anything (GPU_BUNDLE_STALE_OK=1 runs them all the same)" >&2
    exit 2
  fi
fi
rm -rf "$b"; mkdir -p "$b"
tar -xJf gpu-bundle/bundle.tar.xz -C "$b" || {
  echo "unpack.sh: cannot unpack gpu-bundle/bundle.tar.xz: run tests/gpu/pack.sh on the build machine and carry gpu-bundle" >&2
  exit 2
}
if ! command -v mpirun >/dev/null && [[ -f gpu-bundle/openmpi.tar.xz ]]; then  # the packed Open MPI
  # shellcheck source=/dev/null
  mkdir -p "$b/openmpi" && tar -xJf gpu-bundle/openmpi.tar.xz -C "$b/openmpi" && source "$b/openmpi/env.sh"
fi
py=$(command -v python3)
export MEGABATCH_BIN_DIR=$b/bin MEGABATCH_SOURCE_DIR=$PWD MEGABATCH_ASSETS=$b/extra/assets \
  MEGABATCH_TEST_PLUGIN_DIR=$b/extra/plugins MEGABATCH_PYTHON=$py

# "[  PASSED  ] 35 tests. [  SKIPPED ] 1 test" from a gtest log ("" for a log without one)
gtest_tally() {
  grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$1" | sed 's/, listed below://' | tr '\n' ' ' | sed 's/ $//'
}
