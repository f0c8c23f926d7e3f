#include "core/ops/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

namespace megabatch::ops {
namespace {
CBLAS_TRANSPOSE tr(Trans t) { return t == Trans::N ? CblasNoTrans : CblasTrans; }

// out(O) += column sums of x(n, O); columns split across threads, rows summed in order.
template <typename T>
void add_column_sums(T* out, const T* x, int64_t n, int64_t O) {
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static) if (n * O > 32768)
  for (int64_t c0 = 0; c0 < O; c0 += kBlock) {
    const int64_t c1 = std::min(O, c0 + kBlock);
    for (int64_t i = 0; i < n; ++i) {
      const T* row = x + i * O;
      for (int64_t c = c0; c < c1; ++c) out[c] += row[c];
    }
  }
}
}  // namespace

template <>
void gemm<float>(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), static_cast<blasint>(M), static_cast<blasint>(N),
              static_cast<blasint>(K), alpha, A, static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C,
              static_cast<blasint>(ldc));
}

template <>
void gemm<double>(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
                  const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), static_cast<blasint>(M), static_cast<blasint>(N),
              static_cast<blasint>(K), alpha, A, static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C,
              static_cast<blasint>(ldc));
}

template <typename T>
void linear_forward(T* out, const T* in, const T* weight, const T* bias, int64_t n, int64_t I, int64_t O) {
  if (bias) {
    for (int64_t i = 0; i < n; ++i) std::memcpy(out + i * O, bias, sizeof(T) * O);
  }
  gemm<T>(Trans::N, Trans::T, n, O, I, T(1), in, I, weight, I, bias ? T(1) : T(0), out, O);
}

template <typename T>
void linear_backward(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight, int64_t n,
                     int64_t I, int64_t O) {
  if (din) gemm<T>(Trans::N, Trans::N, n, I, O, T(1), dout, O, weight, I, T(1), din, I);
  if (dweight) gemm<T>(Trans::T, Trans::N, O, I, n, T(1), dout, O, in, I, T(1), dweight, I);
  if (dbias) add_column_sums(dbias, dout, n, O);
}

#define MB_INSTANTIATE(T)                                                                               \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);        \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);
MB_INSTANTIATE(float)
MB_INSTANTIATE(double)
#undef MB_INSTANTIATE

}  // namespace megabatch::ops
