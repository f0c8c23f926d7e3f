cmake_minimum_required(VERSION 3.25)  # script mode: the policies of the project
# megabatch_cpu_level (core/util/cpu_level.cmake) on /proc/cpuinfo files of known CPUs, each
# level written down from the psABI's definitions (x86-64-v2: SSE4.2, SSSE3, POPCNT,
# CMPXCHG16B, LAHF; v3: AVX, AVX2, BMI1/2, F16C, FMA, LZCNT, MOVBE, XSAVE; v4: AVX-512
# F/BW/CD/DQ/VL), not from the function.
#   cmake -DSOURCE_DIR=<repository> -DWORK_DIR=<scratch> -P tests/tools/cpu_level_test.cmake
include(${SOURCE_DIR}/core/util/cpu_level.cmake)
set(base "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 syscall nx lm")
set(cases
  "QEMU's default qemu64|${base} nopl pni cx16 hypervisor lahf_lm svm|1"
  "Penryn (SSE4.1, no SSE4.2 or POPCNT)|${base} pni monitor ssse3 cx16 sse4_1 xsave lahf_lm|1"
  "Nehalem Xeon X5570|${base} ht tm pbe rdtscp constant_tsc pni dtes64 monitor ssse3 cx16 xtpr pdcm dca sse4_1 sse4_2 popcnt lahf_lm|2"
  "Sandy Bridge (AVX, no AVX2)|${base} pni pclmulqdq ssse3 cx16 sse4_1 sse4_2 x2apic popcnt aes xsave avx lahf_lm|2"
  "Haswell without BMI2 in the VM's CPU model|${base} pni ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt xsave avx f16c lahf_lm abm bmi1 avx2|2"
  "Haswell with AVX2 hidden by the VM's CPU model|${base} pni ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt xsave avx f16c lahf_lm abm bmi1 bmi2|2"
  "Haswell|${base} pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand lahf_lm abm bmi1 avx2 bmi2 erms|3"
  "AMD EPYC (Zen 2)|${base} mmxext fxsr_opt pdpe1gb rdtscp pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand lahf_lm cmp_legacy abm sse4a misalignsse bmi1 avx2 smep bmi2 rdseed adx sha_ni|3"
  "Skylake client (no AVX-512)|${base} pni ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt xsave avx f16c lahf_lm abm bmi1 avx2 bmi2 adx|3"
  "Skylake-SP Xeon|${base} pni ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt xsave avx f16c lahf_lm abm bmi1 avx2 bmi2 avx512f avx512dq avx512cd avx512bw avx512vl|4"
)
file(MAKE_DIRECTORY ${WORK_DIR})
set(failed 0)
foreach(c IN LISTS cases)
  string(REPLACE "|" ";" parts "${c}")
  list(GET parts 0 name)
  list(GET parts 1 flags)
  list(GET parts 2 expected)
  # two processors, as /proc/cpuinfo lists them; the first flags line is read
  file(WRITE ${WORK_DIR}/cpuinfo "processor\t: 0\nmodel name\t: ${name}\nflags\t\t: ${flags}\n\nprocessor\t: 1\nflags\t\t: ${flags}\n")
  megabatch_cpu_level(${WORK_DIR}/cpuinfo got)
  if(got EQUAL expected)
    message(STATUS "${name}: level ${got}")
  else()
    message(SEND_ERROR "${name}: level ${got}, expected ${expected}")
    set(failed 1)
  endif()
endforeach()
file(WRITE ${WORK_DIR}/cpuinfo "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32\n")  # an Arm machine
megabatch_cpu_level(${WORK_DIR}/cpuinfo got)
if(NOT got EQUAL 0)
  message(SEND_ERROR "an Arm cpuinfo (no flags line): level ${got}, expected 0")
endif()
megabatch_cpu_level(${WORK_DIR}/no_such_file got)
if(NOT got EQUAL 0)
  message(SEND_ERROR "a missing file: level ${got}, expected 0")
endif()
