#!/usr/bin/env bash
# The CPU-level check of core/util/cpu_level.cc on CPUs emulated by QEMU's user mode
# (qemu-user), two ways:
# - probe PROBE: the probe (cpu_level.cc built with MEGABATCH_CPU_LEVEL_PROBE, which picks a
#   build machine's default -march) prints each CPU model's level as the psABI defines it:
#   qemu64 1 (no SSE4.2), Nehalem 2, SandyBridge 2 (AVX, no AVX2), Haswell 3, and QEMU's own
#   max 3 (its emulation has AVX2, not AVX-512);
# - LEVEL PROGRAM...: programs built for x86-64-vLEVEL refuse a CPU below that level by name
#   and with the rebuild to do, where they would otherwise die of "Illegal instruction"
#   (SIGILL, exit 132) at their first AVX2 instruction: each is started as a CPU one level
#   down (v4: Haswell, v3: Nehalem, v2: qemu64) and, for levels QEMU's max CPU reaches
#   (x86-64-v3), as that CPU, where it must run.
#
#   check_cpu_level.sh probe PROBE | check_cpu_level.sh LEVEL PROGRAM...   (exit 0: all held)
set -uo pipefail
level=${1:?usage: check_cpu_level.sh probe PROBE | check_cpu_level.sh LEVEL PROGRAM...}; shift
(($#)) || { echo "usage: check_cpu_level.sh probe PROBE | check_cpu_level.sh LEVEL PROGRAM..." >&2; exit 2; }
command -v qemu-x86_64 >/dev/null || { echo "check_cpu_level.sh: qemu-x86_64 (qemu-user) is missing: run ./setup.sh" >&2; exit 2; }
if [[ $level == probe ]]; then
  status=0
  for case in qemu64:1 Nehalem:2 SandyBridge:2 Haswell:3 max:3; do
    model=${case%:*} expected=${case#*:}
    got=$(qemu-x86_64 -cpu "$model" "$1" 2>/dev/null)
    if [[ $got == "$expected" ]]; then echo "$model: level $got"
    else echo "$model: level '$got', expected $expected"; status=1; fi
  done
  exit $status
fi
case $level in
  2) older=qemu64 older_name=x86-64 ;;
  3) older=Nehalem older_name=x86-64-v2 ;;
  4) older=Haswell older_name=x86-64-v3 ;;
  *) echo "check_cpu_level.sh: level 2, 3 or 4, not '$level'" >&2; exit 2 ;;
esac
log=$(mktemp); trap 'rm -f "$log"' EXIT
# run CPU PROGRAM: its exit status in rc, its stderr (less QEMU's own warnings) in out
run() {
  qemu-x86_64 -cpu "$1" "$2" --help >/dev/null 2>"$log"
  rc=$?
  out=$(grep -v '^qemu-x86_64: warning' "$log")
}
status=0
for program in "$@"; do
  name=$(basename "$program")
  run "$older" "$program"
  expected="$name: error: this megabatch was built for x86-64-v$level CPUs"
  if ((rc == 1)) && [[ $out == *"$expected"*"this CPU is $older_name"*"-DMEGABATCH_CPU_ARCH=$older_name"* ]]; then
    echo "$name as $older ($older_name): refused, naming the level and the rebuild"
  else
    echo "$name as $older ($older_name): exit $rc, expected 1 and \"$expected ... this CPU is $older_name\":"
    echo "$out" | head -5 | sed 's/^/  /'
    status=1
  fi
  if ((level <= 3)); then
    run max "$program"
    if ((rc != 0)); then
      echo "$name as QEMU's max CPU (x86-64-v3): exit $rc, where it must run:"; echo "$out" | head -3 | sed 's/^/  /'
      status=1
    else
      echo "$name as QEMU's max CPU (x86-64-v3): runs (exit $rc)"
    fi
  fi
done
exit $status
