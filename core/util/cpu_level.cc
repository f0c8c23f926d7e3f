// Refuses to run on a CPU that lacks an instruction-set extension the build's -march let
// the compiler use (cpu_build_features.cc: x86-64-v3 by default, or whatever
// -DMEGABATCH_CPU_ARCH / -DMEGABATCH_NATIVE=ON chose), with a message that names them and
// says how to rebuild, where the program would otherwise stop at its first AVX2, FMA or
// AVX-512 instruction with "Illegal instruction" and nothing else: an older Xeon, a
// virtual machine whose CPU model hides AVX2 (QEMU's and Proxmox's defaults), or a cluster
// node older than the login node a -march=native build was made on.
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

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "core/util/cpu_features.h"

#if defined(__x86_64__)
namespace {

namespace cf = megabatch::cpu_features;

// The features of cpu_features.h this CPU has, as its CPUID (and the OS's saved vector
// state) report them: through __builtin_cpu_supports where both GCC and clang know the
// name, else from CPUID here, gated on the vector state their registers need (the
// kernel's /proc/cpuinfo can leave some out: the development VM's lists no "abm" for LZCNT).
uint64_t cpu_has() {
  __builtin_cpu_init();
  uint64_t have = 0;
#define MEGABATCH_CPU_FEATURE_HAVE(id, name) \
  if (__builtin_cpu_supports(name)) have |= cf::k##id;
#define MEGABATCH_CPU_FEATURE_BY_CPUID(id, name)
  MEGABATCH_CPU_FEATURES(MEGABATCH_CPU_FEATURE_HAVE, MEGABATCH_CPU_FEATURE_BY_CPUID)
#undef MEGABATCH_CPU_FEATURE_HAVE
  unsigned a = 0, b = 0, c = 0, d = 0;  // CPUID's registers; the bits are Intel's and AMD's manuals'
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    if (c & (1u << 22)) have |= cf::kMOVBE;
    if ((c & (1u << 29)) && (have & cf::kAVX)) have |= cf::kF16C;
  }
  if (__get_cpuid(0x80000001u, &a, &b, &c, &d) && (c & (1u << 5))) have |= cf::kLZCNT;  // ABM
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 23)) && (have & cf::kAVX512F)) have |= cf::kAVX512FP16;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4)) && (have & cf::kAVX)) have |= cf::kAVXVNNI;
  // every C() feature of cpu_features.h is one of those read above
#define MEGABATCH_CPU_FEATURE_BY_CPUID_BIT(id, name) | cf::k##id
  constexpr uint64_t kListed = 0 MEGABATCH_CPU_FEATURES(MEGABATCH_CPU_FEATURE_BY_CPUID, MEGABATCH_CPU_FEATURE_BY_CPUID_BIT);
#undef MEGABATCH_CPU_FEATURE_BY_CPUID_BIT
#undef MEGABATCH_CPU_FEATURE_BY_CPUID
  static_assert(kListed == (cf::kMOVBE | cf::kF16C | cf::kLZCNT | cf::kAVX512FP16 | cf::kAVXVNNI),
                "cpu_features.h lists a C() feature that cpu_has() does not read from CPUID");
  return have;
}

// The psABI's micro-architecture level of a feature set: 1 (baseline x86-64) to 4.
int level_of(uint64_t have) {
  if ((have & cf::kLevel4) == cf::kLevel4) return 4;
  if ((have & cf::kLevel3) == cf::kLevel3) return 3;
  if ((have & cf::kLevel2) == cf::kLevel2) return 2;
  return 1;
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
  printf("%d\n", level_of(cpu_has()));
#else
  printf("0\n");
#endif
  return 0;
}
#else
#if defined(__x86_64__)
extern "C" uint64_t megabatch_cpu_features(void) { return cpu_has(); }
#else
extern "C" uint64_t megabatch_cpu_features(void) { return 0; }
#endif
extern "C" void megabatch_require_cpu_level(void) __attribute__((constructor(101)));
#if defined(__x86_64__)
void megabatch_require_cpu_level(void) {
  const uint64_t have = cpu_has(), missing = megabatch_build_cpu_features & ~have;
  if (missing == 0) return;
  char lacks[512] = "";
  size_t used = 0;
#define MEGABATCH_CPU_FEATURE_NAME(id, name)                                                      \
  if ((missing & cf::k##id) && used + sizeof(name) + 2 < sizeof lacks)                            \
    used += static_cast<size_t>(snprintf(lacks + used, sizeof lacks - used, "%s%s", used ? ", " : "", name));
  MEGABATCH_CPU_FEATURES(MEGABATCH_CPU_FEATURE_NAME, MEGABATCH_CPU_FEATURE_NAME)
#undef MEGABATCH_CPU_FEATURE_NAME
  // what the build was for, in words and as its flag
  const char* march = megabatch_build_march;
  const bool native = strcmp(march, "native") == 0, none = march[0] == '\0';
  char built_for[160], flag[160];
  snprintf(built_for, sizeof built_for, "%s%s", native ? "the CPU it was built on" : none ? "the compiler's default CPU" : march,
           native || none ? "" : " CPUs");
  snprintf(flag, sizeof flag, "%s%s", none ? "no -march" : "-march=", march);
  const char* here = level_name(level_of(have));
  char msg[2048];
  const int n = snprintf(
      msg, sizeof msg,
      "%s: error: this megabatch was built for %s (%s) and this CPU lacks %s (it is %s): it would stop at the "
      "first instruction this CPU lacks (Illegal instruction). Rebuild it for this machine: cmake -B build%s "
      "-DMEGABATCH_CPU_ARCH=%s && cmake --build build (a new build directory picks this machine's level by itself)\n",
      program_invocation_short_name, built_for, flag, lacks, here, native ? " -DMEGABATCH_NATIVE=OFF" : "", here);
  if (n > 0) {
    ssize_t unused = write(STDERR_FILENO, msg, strlen(msg));
    (void)unused;
  }
  _exit(1);
}
#else
void megabatch_require_cpu_level(void) {}  // not x86: the compiler's -march is the machine's own
#endif
#endif
