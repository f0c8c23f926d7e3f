#include "core/ops/cpu/blas_kernel.h"

#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <climits>

#include "core/util/cpu_features.h"

namespace megabatch::ops::cpu {
namespace {

namespace cf = megabatch::cpu_features;

// Set for the program started again: "OWN>CHOSEN", the kernel OpenBLAS picked and the one
// megabatch chose instead.
constexpr const char* kChoiceVariable = "MEGABATCH_OPENBLAS_CHOICE";

// OpenBLAS's x86-64 kernels that use no AVX2: the SSE ones and Sandybridge (AVX). These
// are what OpenBLAS falls back to (Prescott) or picks by a model's name; on a CPU with
// AVX2 and FMA they leave most of its arithmetic unused.
bool without_avx2(const std::string& kernel) {
  static const char* const kNames[] = {"Katmai",  "Coppermine", "Northwood",     "Prescott",  "Banias", "Atom",
                                       "Core2",   "Penryn",     "Dunnington",    "Nehalem",   "Athlon", "Opteron",
                                       "Opteron(SSE3)", "Barcelona", "Nano",     "Bobcat",    "Sandybridge"};
  for (const char* name : kNames)
    if (strcasecmp(kernel.c_str(), name) == 0) return true;
  return false;
}

// What the kernel megabatch chose uses of the CPU, for the machine line and the warning.
const char* uses(const std::string& chosen) { return chosen == "SkylakeX" ? "AVX-512" : "AVX2 and FMA"; }

}  // namespace

std::string better_blas_kernel(const std::string& picked, uint64_t features) {
  if (!without_avx2(picked)) return "";
  if ((features & cf::kLevel4) == cf::kLevel4) return "SkylakeX";
  if ((features & (cf::kAVX | cf::kAVX2 | cf::kFMA)) == (cf::kAVX | cf::kAVX2 | cf::kFMA)) return "Haswell";
  return "";
}

std::string blas_kernel_note() {
  const char* choice = getenv(kChoiceVariable);
  if (!choice) return "";
  const std::string c = choice;
  const size_t gt = c.find('>');
  if (gt == std::string::npos || strcasecmp(c.substr(gt + 1).c_str(), openblas_get_corename()) != 0) return "";
  const std::string chosen = c.substr(gt + 1);
  return " (megabatch's choice for this CPU's " + std::string(uses(chosen)) + "; OpenBLAS's own was " + c.substr(0, gt) +
         ")";
}

}  // namespace megabatch::ops::cpu

// Runs as the program starts, after the CPU-level check (core/util/cpu_level.cc, priority
// 101) and before the program's own constructors; glibc passes an ELF constructor the
// program's arguments. Starting again takes a few milliseconds (the program's libraries load
// twice), once per process.
extern "C" void megabatch_choose_blas_kernel(int argc, char** argv, char** envp) __attribute__((constructor(102)));
extern "C" void megabatch_choose_blas_kernel(int argc, char** argv, char** /*envp*/) {
  if (argc < 1 || !argv || getenv("OPENBLAS_CORETYPE")) return;  // the user's choice, or ours already
  const std::string picked = openblas_get_corename();
  const std::string better = megabatch::ops::cpu::better_blas_kernel(picked, megabatch_cpu_features());
  if (better.empty()) return;
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
    setenv(megabatch::ops::cpu::kChoiceVariable, (picked + ">" + better).c_str(), 1);
    execv(self, argv);
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(megabatch::ops::cpu::kChoiceVariable);
  }
  fprintf(stderr,
          "%s: warning: OpenBLAS chose its %s sgemm kernel for this CPU, which has %s, and starting again with "
          "OPENBLAS_CORETYPE=%s failed (%s); sgemm runs several times slower than it can here: set "
          "OPENBLAS_CORETYPE=%s\n",
          program_invocation_short_name, picked.c_str(), megabatch::ops::cpu::uses(better),
          better.c_str(), strerror(errno), better.c_str());
}
