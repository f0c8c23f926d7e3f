#!/usr/bin/env bash
# Checks that CPU loops whose speed rests on vectorization were vectorized for the -march
# megabatch builds with: in every BINARY, the functions whose demangled names match each
# PATTERN (grep -E; OpenMP clones included) must do packed floating-point arithmetic in
# 256/512-bit registers (vaddps/vfmadd231pd ... %ymm or %zmm). Two ways this went wrong:
# - GCC reported a loop "vectorized" and ran it scalar: the gradients' sums of squares,
#   written in lambdas, reloaded the captured pointers every element and ran one scalar
#   double FMA at a time (about 1 ns an element);
# - in a CUDA build nvcc compiled the plugins and its host compiler got no -march: their
#   multi_tensor_apply loops used 128-bit %xmm only and the optimizer step ran 1.6x slower.
#
#   check_vector_code.sh MARCH BINARY... -- PATTERN...     (exit 0: every pair has wide code)
set -euo pipefail
usage="usage: check_vector_code.sh MARCH BINARY... -- PATTERN..."
march=${1:?$usage}; shift
binaries=()
while (($#)) && [[ $1 != -- ]]; do binaries+=("$1"); shift; done
(($# > 1 && ${#binaries[@]})) || { echo "$usage" >&2; exit 2; }
shift
case $march in
  x86-64-v3 | x86-64-v4) ;;
  native) grep -qw avx2 /proc/cpuinfo || { echo "-march=native on a CPU without AVX2: nothing to check"; exit 0; } ;;
  *) echo "check_vector_code.sh: no expectation for -march=$march" >&2; exit 2 ;;
esac
command -v objdump >/dev/null || { echo "check_vector_code.sh: objdump (binutils) is missing" >&2; exit 2; }
status=0
for binary in "${binaries[@]}"; do
  listing=$(objdump -d --no-show-raw-insn -C "$binary")
  for pattern in "$@"; do
    body=$(awk -v p="$pattern" '/^[0-9a-f]+ </ {on = ($0 ~ p); next} on' <<<"$listing")
    total=$(grep -c . <<<"$body" || true)
    wide=$(grep -cE 'v(add|sub|mul|div|max|min|sqrt|fmadd[0-9]*|fnmadd[0-9]*|fmsub[0-9]*)p[sd][[:space:]].*%[yz]mm' <<<"$body" || true)
    echo "$(basename "$binary") $pattern: $wide of $total instructions are packed arithmetic on 256/512-bit registers"
    if ((total == 0)); then echo "  no such function: was it renamed?"; status=1
    elif ((wide == 0)); then echo "  scalar or 128-bit only: not vectorized for -march=$march"; status=1; fi
  done
done
exit $status
