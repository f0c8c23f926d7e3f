// Which OpenBLAS kernel a megabatch program runs with (core/ops/cpu/blas_kernel.h): the
// choice, for the kernels OpenBLAS 0.3.21 names. That a program ends up with it on CPUs
// OpenBLAS does not know is tests/tools/check_blas_kernel.sh's (QEMU).
#include <gtest/gtest.h>

#include <cstdint>

#include "core/ops/cpu/blas_kernel.h"
#include "core/util/cpu_features.h"

namespace {

// OpenBLAS's pick is replaced only where it uses no AVX2 on a CPU that has AVX2 and FMA:
// by SkylakeX where the CPU has x86-64-v4's AVX-512, else by Haswell. The kernels' vector
// sets are OpenBLAS's (kernel/x86_64/KERNEL.*): Prescott to Nehalem SSE, Sandybridge AVX,
// Haswell and Zen AVX2 + FMA, SkylakeX and Cooperlake AVX-512.
TEST(BlasKernel, OnlyAPickWithoutAvx2OnACpuWithAvx2IsReplaced) {
  namespace cf = megabatch::cpu_features;
  const uint64_t v2 = cf::kLevel2, avx = cf::kLevel2 | cf::kAVX, v3 = cf::kLevel3, v4 = cf::kLevel4;
  using megabatch::ops::cpu::better_blas_kernel;
  // the fallback for a model OpenBLAS does not know (an H200 machine's Xeon, family 6 model 207)
  EXPECT_EQ(better_blas_kernel("Prescott", v4), "SkylakeX");
  EXPECT_EQ(better_blas_kernel("Prescott", v3), "Haswell");
  EXPECT_EQ(better_blas_kernel("Opteron", v3), "Haswell");  // QEMU's max CPU
  EXPECT_EQ(better_blas_kernel("nehalem", v3), "Haswell");  // names compare without case
  EXPECT_EQ(better_blas_kernel("Sandybridge", v4), "SkylakeX");
  // a CPU without AVX2 and FMA: the pick is what it can run
  EXPECT_EQ(better_blas_kernel("Prescott", v2), "");
  EXPECT_EQ(better_blas_kernel("Sandybridge", avx), "");
  EXPECT_EQ(better_blas_kernel("Nehalem", v3 & ~cf::kFMA), "");
  // a pick with AVX2 is OpenBLAS's own choice for a model it knows, kept even on an AVX-512 CPU
  for (const char* kept : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"})
    EXPECT_EQ(better_blas_kernel(kept, v4), "") << kept;
  // as are AMD's Bulldozer-family kernels, which OpenBLAS picks only for those CPUs by name
  for (const char* kept : {"Bulldozer", "Piledriver", "Steamroller", "Excavator"})
    EXPECT_EQ(better_blas_kernel(kept, v3), "") << kept;
}

}  // namespace
