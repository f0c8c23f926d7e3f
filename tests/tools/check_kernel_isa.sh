#!/usr/bin/env bash
# Checks that CPU kernel loops whose speed rests on vectorization were vectorized: every
# function of BINARY whose demangled name matches one of the PATTERNs (grep -E; OpenMP
# clones included) must do packed floating-point arithmetic in 256/512-bit registers
# (vaddps/vfmadd231pd ... %ymm or %zmm). GCC reports such a loop "vectorized" and can still
# run it scalar: the gradients' sums of squares, written in lambdas, reloaded the captured
# pointers every element and ran one scalar double FMA at a time (about 1 ns an element).
#
#   check_kernel_isa.sh MARCH BINARY PATTERN...      (exit 0: every pattern has wide code)
set -euo pipefail
march=${1:?usage: check_kernel_isa.sh MARCH BINARY PATTERN...}; binary=${2:?usage}; shift 2
case $march in
  x86-64-v3 | x86-64-v4) ;;
  native) grep -qw avx2 /proc/cpuinfo || { echo "-march=native on a CPU without AVX2: nothing to check"; exit 0; } ;;
  *) echo "check_kernel_isa.sh: no expectation for -march=$march" >&2; exit 2 ;;
esac
command -v objdump >/dev/null || { echo "check_kernel_isa.sh: objdump (binutils) is missing" >&2; exit 2; }
listing=$(objdump -d --no-show-raw-insn -C "$binary")
status=0
for pattern in "$@"; do
  body=$(awk -v p="$pattern" '/^[0-9a-f]+ </ {on = ($0 ~ p); next} on' <<<"$listing")
  total=$(grep -c . <<<"$body" || true)
  wide=$(grep -cE 'v(add|sub|mul|max|min|fmadd[0-9]*|fnmadd[0-9]*)p[sd][[:space:]].*%[yz]mm' <<<"$body" || true)
  echo "$pattern: $wide of $total instructions are packed arithmetic on 256/512-bit registers"
  if ((total == 0)); then echo "  no such function in $binary: was it renamed?"; status=1
  elif ((wide == 0)); then echo "  scalar or 128-bit only: the loop was not vectorized"; status=1; fi
done
exit $status
