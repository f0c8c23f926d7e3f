#!/usr/bin/env bash
# The CPU check of core/util/cpu_level.cc on CPUs emulated by QEMU's user mode (qemu-user),
# three ways:
# - probe PROBE: the probe (cpu_level.cc built with MEGABATCH_CPU_LEVEL_PROBE, which picks a
#   build machine's default -march) prints each CPU model's level as the psABI defines it:
#   qemu64 1 (no SSE4.2), Nehalem 2, SandyBridge 2 (AVX, no AVX2), Haswell 3, and QEMU's own
#   max 3 (its emulation has AVX2, not AVX-512);
# - LEVEL PROGRAM...: programs built for x86-64-vLEVEL refuse a CPU below that level by name
#   and with the rebuild to do, where they would otherwise die of "Illegal instruction"
#   (SIGILL, exit 132) at their first AVX2 instruction: each is started as a CPU one level
#   down (v4: Haswell, v3: Nehalem, v2: qemu64) and, for levels QEMU's max CPU reaches
#   (x86-64-v3), as that CPU, where it must run;
# - march HASWELL SAPPHIRERAPIDS NATIVE: tests/tools/cpu_guarded_main.cc built with
#   -march=haswell, sapphirerapids and native must name exactly the extensions the CPU
#   lacks, as Intel documents those CPUs and QEMU its models (qemu64 has SSE3 and nothing
#   newer; its Haswell and max have x86-64-v3 and no AVX-512), and run where nothing lacks.
#
#   check_cpu_level.sh probe PROBE | LEVEL PROGRAM... | march HASWELL SAPPHIRERAPIDS NATIVE
#   (exit 0: all held)
set -uo pipefail
usage="usage: check_cpu_level.sh probe PROBE | LEVEL PROGRAM... | march HASWELL SAPPHIRERAPIDS NATIVE"
level=${1:?$usage}; shift
(($#)) || { echo "$usage" >&2; exit 2; }
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
log=$(mktemp); trap 'rm -f "$log"' EXIT
# run CPU PROGRAM: its exit status in rc, its stderr (less QEMU's own warnings) in out;
# CPU "host" runs it natively
run() {
  if [[ $1 == host ]]; then "$2" --help >/dev/null 2>"$log"; else qemu-x86_64 -cpu "$1" "$2" --help >/dev/null 2>"$log"; fi
  rc=$?
  out=$(grep -v '^qemu-x86_64: warning' "$log")
}
status=0
# refused CPU PROGRAM BUILT_FOR LACKS HERE REBUILD: the program, run as CPU, must exit 1
# saying it was built for BUILT_FOR, that the CPU lacks exactly the extensions LACKS
# (space-separated; "*" for any non-empty list), that the CPU is HERE and that REBUILD
# (the cmake options) builds for it
refused() {
  local cpu=$1 program=$2 built_for=$3 lacks=$4 here=$5 rebuild=$6 name got want
  name=$(basename "$program")
  run "$cpu" "$program"
  got=$(sed -n 's/.* and this CPU lacks \(.*\) (it is .*/\1/p' <<<"$out" | tr -d ',' | tr ' ' '\n' | sort | xargs)
  want=$(tr ' ' '\n' <<<"$lacks" | sort | xargs)
  if ((rc == 1)) && [[ $out == *"$name: error: this megabatch was built for $built_for"*"(it is $here)"*"cmake -B build $rebuild &&"* ]] &&
     [[ -n $got && ( $lacks == "*" || $got == "$want" ) ]]; then
    echo "$name as $cpu ($here): refused, lacking $got"
  else
    echo "$name as $cpu ($here): exit $rc, expected 1, \"built for $built_for\", lacking [$want], got [$got]:"
    echo "$out" | head -5 | sed 's/^/  /'
    status=1
  fi
}
# runs CPU PROGRAM: the program, run as CPU, must run
runs() {
  local name; name=$(basename "$2")
  run "$1" "$2"
  if ((rc == 0)); then echo "$name as $1: runs"
  else echo "$name as $1: exit $rc, where it must run:"; echo "$out" | head -3 | sed 's/^/  /'; status=1; fi
}
if [[ $level == march ]]; then
  (($# == 3)) || { echo "$usage" >&2; exit 2; }
  haswell=$1 sapphirerapids=$2 native=$3
  refused qemu64 "$haswell" "haswell CPUs (-march=haswell)" \
    "ssse3 sse4.1 sse4.2 popcnt avx avx2 fma f16c bmi bmi2 lzcnt movbe" x86-64 "-DMEGABATCH_CPU_ARCH=x86-64"
  runs max "$haswell"
  refused Haswell "$sapphirerapids" "sapphirerapids CPUs (-march=sapphirerapids)" \
    "avx512f avx512bw avx512dq avx512vl avx512cd avx512vnni avx512bf16 avx512vbmi avx512vbmi2 avx512ifma avx512bitalg avx512vpopcntdq avx512fp16 avxvnni" \
    x86-64-v3 "-DMEGABATCH_CPU_ARCH=x86-64-v3"
  refused qemu64 "$native" "the CPU it was built on (-march=native)" "*" x86-64 \
    "-DMEGABATCH_NATIVE=OFF -DMEGABATCH_CPU_ARCH=x86-64"
  runs host "$native"
  exit $status
fi
# what each level adds to the one below (the psABI), all of which the older CPU lacks
case $level in
  2) older=qemu64 older_name=x86-64 adds="ssse3 sse4.1 sse4.2 popcnt" ;;
  3) older=Nehalem older_name=x86-64-v2 adds="avx avx2 fma f16c bmi bmi2 lzcnt movbe" ;;
  4) older=Haswell older_name=x86-64-v3 adds="avx512f avx512bw avx512dq avx512vl avx512cd" ;;
  *) echo "check_cpu_level.sh: probe, march, or level 2, 3 or 4, not '$level'" >&2; exit 2 ;;
esac
for program in "$@"; do
  refused "$older" "$program" "x86-64-v$level CPUs (-march=x86-64-v$level)" "$adds" "$older_name" \
    "-DMEGABATCH_CPU_ARCH=$older_name"
  ((level <= 3)) && runs max "$program"
done
exit $status
