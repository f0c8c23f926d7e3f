# megabatch_cpu_level(CPUINFO OUT_VAR): the x86-64 micro-architecture level of a CPU from the
# "flags" line of a /proc/cpuinfo-format file: 1 (baseline x86-64), 2 (x86-64-v2: SSE4.2,
# POPCNT ...), 3 (x86-64-v3: AVX2, FMA, BMI ...) or 4 (x86-64-v4: AVX-512), the psABI's
# levels; 0 where the file is missing or has no flags line (another OS or architecture).
# The top-level CMakeLists.txt builds the CPU code for x86-64-v3 unless the build machine
# is older, and core/util/cpu_level.cc refuses a CPU older than the build's level at run time.
function(megabatch_cpu_level cpuinfo out_var)
  set(level 0)
  if(EXISTS "${cpuinfo}")
    file(STRINGS "${cpuinfo}" lines REGEX "^flags[ \t]*:" LIMIT_COUNT 1)
    if(lines)
      list(GET lines 0 line)
      string(REGEX REPLACE "^flags[ \t]*:[ \t]*" "" line "${line}")
      string(REGEX REPLACE "[ \t]+" ";" flags "${line}")
      set(features_2 cx16 lahf_lm popcnt sse4_1 sse4_2 ssse3)
      set(features_3 avx avx2 bmi1 bmi2 f16c fma abm movbe xsave)
      set(features_4 avx512f avx512bw avx512cd avx512dq avx512vl)
      set(level 1)
      foreach(next 2 3 4)
        foreach(f IN LISTS features_${next})
          if(NOT f IN_LIST flags)
            set(${out_var} ${level} PARENT_SCOPE)
            return()
          endif()
        endforeach()
        set(level ${next})
      endforeach()
    endif()
  endif()
  set(${out_var} ${level} PARENT_SCOPE)
endfunction()
