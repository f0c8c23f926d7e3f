// Refuses to run on a CPU older than the one the build's CPU code was compiled for
// (MEGABATCH_REQUIRED_CPU_LEVEL, set by CMake from -march: x86-64-v2, -v3 or -v4), with a
// message that says how to rebuild, where the program would otherwise stop at its first
// AVX2 or FMA instruction with "Illegal instruction" and nothing else (an older Xeon, or a
// virtual machine whose CPU model hides AVX2, such as QEMU's and Proxmox's defaults).
//
// It runs as a constructor ahead of the program's others (priority 101; the shared
// libraries' constructors run earlier, and none of them is built with megabatch's -march),
// and this file alone is compiled for baseline x86-64 (core/CMakeLists.txt): it calls the C library only, since
// an inline C++ function used here could be merged with a copy built for the newer CPU.
// Every program that links megabatch_core pulls it in (the linker's --undefined). Built with
// MEGABATCH_CPU_LEVEL_PROBE it is instead a program that prints this CPU's level.
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) && (defined(MEGABATCH_REQUIRED_CPU_LEVEL) || defined(MEGABATCH_CPU_LEVEL_PROBE))
namespace {

// The psABI's micro-architecture levels (1 = baseline x86-64, 2 = x86-64-v2 ...), by the
// features compilers use at each, as this CPU's CPUID reports them (the kernel's
// /proc/cpuinfo can leave some out: the development VM's lists no "abm" for LZCNT).
int cpu_level() {
  __builtin_cpu_init();
  if (!(__builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("ssse3")))
    return 1;
  if (!(__builtin_cpu_supports("avx") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2")))
    return 2;
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512cd")))
    return 3;
  return 4;
}

[[maybe_unused]] const char* level_name(int level) {
  return level >= 4 ? "x86-64-v4" : level == 3 ? "x86-64-v3" : level == 2 ? "x86-64-v2" : "x86-64";
}

}  // namespace
#endif

#if defined(MEGABATCH_CPU_LEVEL_PROBE)
// The probe: this CPU's level on stdout. CMakeLists.txt runs it at configure time (a build
// machine below x86-64-v3 builds for its own level), and the Build.CpuLevel test runs it
// on emulated CPUs, so both use the check the programs make at run time.
int main() {
#if defined(__x86_64__)
  printf("%d\n", cpu_level());
#else
  printf("0\n");
#endif
  return 0;
}
#else
extern "C" void megabatch_require_cpu_level(void) __attribute__((constructor(101)));
#if defined(__x86_64__) && defined(MEGABATCH_REQUIRED_CPU_LEVEL)
void megabatch_require_cpu_level(void) {
  const int required = MEGABATCH_REQUIRED_CPU_LEVEL, have = cpu_level();
  if (have >= required) return;
  char msg[1024];
  const int n = snprintf(
      msg, sizeof msg,
      "%s: error: this megabatch was built for %s CPUs (-march=%s%s) and this CPU is %s: it would stop at the "
      "first instruction this CPU lacks (Illegal instruction). Rebuild it for this machine: cmake -B build "
      "-DMEGABATCH_CPU_ARCH=%s && cmake --build build (a new build directory picks this machine's level by itself)\n",
      program_invocation_short_name, level_name(required), level_name(required),
      required == 3 ? ": AVX2, FMA, BMI2" : required == 4 ? ": AVX-512" : ": SSE4.2, POPCNT", level_name(have),
      level_name(have));
  if (n > 0) {
    ssize_t unused = write(STDERR_FILENO, msg, strlen(msg));
    (void)unused;
  }
  _exit(1);
}
#else
void megabatch_require_cpu_level(void) {}  // built for baseline x86-64, this machine (native), or not x86
#endif
#endif
