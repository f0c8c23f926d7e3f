// Which OpenBLAS sgemm kernel a megabatch process runs with. OpenBLAS (a DYNAMIC_ARCH build,
// as Debian's) picks its kernel from the CPU's family and model when the library loads. A
// model newer than the OpenBLAS build gets its fallback, Prescott (SSE3): measured on an
// H200 machine's Intel Xeon (family 6, model 207, AVX-512), OpenBLAS 0.3.21 picks Prescott
// there and sgemm runs at 28-38 GFLOP/s with 2 threads (SkylakeX: 170-180). So every program that links
// megabatch_core checks the pick as it starts: where OpenBLAS chose a kernel without AVX2 on
// a CPU that has AVX2 and FMA (and the user has not set OPENBLAS_CORETYPE), the program
// starts itself again with OPENBLAS_CORETYPE naming the kernel for what the CPU has
// (SkylakeX with AVX-512, else Haswell), before anything else has run. A kernel OpenBLAS
// chose with AVX2 is left alone, as is any OPENBLAS_CORETYPE the environment sets.
#pragma once

#include <cstdint>
#include <string>

namespace megabatch::ops::cpu {

// The OpenBLAS kernel to use instead of `picked` on a CPU with `features` (the bits of
// core/util/cpu_features.h), or "" to keep it.
std::string better_blas_kernel(const std::string& picked, uint64_t features);

// Where megabatch chose the kernel this process runs with: " (megabatch's choice for this
// CPU's AVX2 and FMA; OpenBLAS's own was Prescott)"; else "".
std::string blas_kernel_note();

}  // namespace megabatch::ops::cpu
