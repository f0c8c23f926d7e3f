#!/usr/bin/env bash
# Checks that the shipped plugins' CPU loops (multi_tensor_apply: plugin::detail::cpu_apply
# and cpu_sum, and their OpenMP bodies) were compiled for the -march megabatch builds with:
# under x86-64-v3 or newer GCC vectorizes them with 256-bit registers (%ymm, or %zmm), under
# the compiler's default x86-64 only with 128-bit %xmm. In a CUDA build nvcc compiles the
# plugins, and its host compiler used to get no -march: the optimizer step ran 1.6x slower.
#
#   check_plugin_isa.sh MARCH PLUGIN.so...      (exit 0: every plugin has wide vector code there)
set -euo pipefail
march=${1:?usage: check_plugin_isa.sh MARCH PLUGIN.so...}; shift
case $march in
  x86-64-v3 | x86-64-v4) ;;
  native) grep -qw avx2 /proc/cpuinfo || { echo "-march=native on a CPU without AVX2: nothing to check"; exit 0; } ;;
  *) echo "check_plugin_isa.sh: no expectation for -march=$march" >&2; exit 2 ;;
esac
command -v objdump >/dev/null || { echo "check_plugin_isa.sh: objdump (binutils) is missing" >&2; exit 2; }
status=0
for so in "$@"; do
  # instructions inside functions whose names contain cpu_apply< or cpu_sum< (OpenMP clones included)
  body=$(objdump -d --no-show-raw-insn -C "$so" | awk '/^[0-9a-f]+ <.*(cpu_apply|cpu_sum)</ {on = 1; next} /^[0-9a-f]+ </ {on = 0} on')
  total=$(grep -c . <<<"$body" || true)
  wide=$(grep -cE '%[yz]mm' <<<"$body" || true)
  echo "$(basename "$so"): $wide of $total instructions in cpu_apply/cpu_sum use 256/512-bit registers"
  if ((total == 0)); then echo "  no cpu_apply/cpu_sum code found: was multi_tensor_apply renamed?"; status=1
  elif ((wide == 0)); then echo "  no wide vector code: the plugin was not compiled with -march=$march"; status=1; fi
done
exit $status
