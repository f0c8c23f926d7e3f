#!/usr/bin/env bash
# The OpenBLAS kernel a megabatch program runs with (core/ops/cpu/blas_kernel.h), on CPUs
# emulated by QEMU's user mode: PROBE (tests/tools/blas_kernel_main.cc) prints its machine
# line. OpenBLAS 0.3.21 falls back to Prescott (SSE3) for an Intel model it does not know,
# as on an H200 machine's Xeon (family 6, model 207); QEMU's Haswell with model=207 is such
# a CPU with AVX2 and FMA, and its max CPU gets Opteron. There the program must start
# itself again with the Haswell kernel and say OpenBLAS's own pick; on QEMU's Haswell
# (a model OpenBLAS knows) it keeps OpenBLAS's Haswell and says nothing; an
# OPENBLAS_CORETYPE the user set is kept on any CPU.
#
#   check_blas_kernel.sh PROBE        (exit 0: all held)
set -uo pipefail
probe=${1:?usage: check_blas_kernel.sh PROBE}
command -v qemu-x86_64 >/dev/null || { echo "check_blas_kernel.sh: qemu-x86_64 (qemu-user) is missing: run ./setup.sh" >&2; exit 2; }
status=0
# expect CPU CORETYPE KERNEL NOTE: the probe as CPU, with OPENBLAS_CORETYPE=CORETYPE ("-":
# unset), must name KERNEL, with NOTE ("-": no note) after it
expect() {
  local cpu=$1 coretype=$2 kernel=$3 note=$4 out want
  if [[ $coretype == - ]]; then
    out=$(env -u OPENBLAS_CORETYPE -u MEGABATCH_OPENBLAS_CHOICE qemu-x86_64 -cpu "$cpu" "$probe" 2>/dev/null)
  else
    out=$(env -u MEGABATCH_OPENBLAS_CHOICE OPENBLAS_CORETYPE="$coretype" qemu-x86_64 -cpu "$cpu" "$probe" 2>/dev/null)
  fi
  want="sgemm kernel $kernel"
  [[ $note != - ]] && want+=" ($note)"
  if [[ $out == *"; OpenBLAS "*" $want" ]]; then echo "as $cpu, OPENBLAS_CORETYPE $coretype: $want"
  else echo "as $cpu, OPENBLAS_CORETYPE $coretype: got \"$out\", expected \"... $want\""; status=1; fi
}
expect Haswell,model=207 - Haswell "megabatch's choice for this CPU's AVX2 and FMA; OpenBLAS's own was Prescott"
expect max - Haswell "megabatch's choice for this CPU's AVX2 and FMA; OpenBLAS's own was Opteron"
expect Haswell - Haswell -
expect Haswell,model=207 Prescott Prescott -
exit $status
