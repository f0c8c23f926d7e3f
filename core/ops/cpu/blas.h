// Row-major GEMM through OpenBLAS for the CPU kernels (f32 and f64):
// C(M, N) = alpha op(A)(M, K) op(B)(K, N) + beta C, with leading dimensions.
#pragma once

#include <cblas.h>

#include <cstdint>
#include <string>

#include "core/ops/matmul.h"

namespace megabatch::ops::cpu {

// "AMD EPYC; OpenBLAS 0.3.21 sgemm kernel Cooperlake": the CPU and
// the kernel OpenBLAS chose for it at load time, which sets both the speed of a CPU run and
// the last bits of its results. OpenBLAS picks it from the CPU's model and what the OS
// enables; a CPU it does not know, or one seen through a hypervisor, can get an older one,
// and OPENBLAS_CORETYPE overrides it (the development machine's environment sets it to
// Haswell on its AVX-512 EPYC; a process without it gets Cooperlake there). Where megabatch
// replaced OpenBLAS's pick (blas_kernel.h), the line says so and names OpenBLAS's own.
std::string cpu_and_blas();

inline CBLAS_TRANSPOSE blas_trans(Trans t) { return t == Trans::N ? CblasNoTrans : CblasTrans; }

inline void blas_gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, blas_trans(ta), blas_trans(tb), static_cast<blasint>(M), static_cast<blasint>(N),
              static_cast<blasint>(K), alpha, A, static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C,
              static_cast<blasint>(ldc));
}

inline void blas_gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
                      int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, blas_trans(ta), blas_trans(tb), static_cast<blasint>(M), static_cast<blasint>(N),
              static_cast<blasint>(K), alpha, A, static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C,
              static_cast<blasint>(ldc));
}

}  // namespace megabatch::ops::cpu
