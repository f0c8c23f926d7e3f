// Matrix multiply on the CPU: OpenBLAS sgemm/dgemm; half tensors are widened to f32.
#include <algorithm>
#include <cstring>

#include "core/ops/backends.h"
#include "core/ops/cpu/blas.h"
#include "core/ops/cpu/f32.h"

namespace megabatch::ops::cpu {
namespace {
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

void gemm(const Tensor& C, const Tensor& A, Trans ta, const Tensor& B, Trans tb, float alpha, float beta) {
  with_compute_type(A.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> a(A), b(B);
    Out<T> c(C, beta != 0.0f);
    const int64_t M = C.dim(0), N = C.dim(1), K = ta == Trans::N ? A.dim(1) : A.dim(0);
    blas_gemm(ta, tb, M, N, K, static_cast<T>(alpha), a, A.dim(1), b, B.dim(1), static_cast<T>(beta), c, N);
    c.commit();
  });
}

void linear_forward(const Tensor& out, const Tensor& in, const Tensor& weight, const Tensor& bias) {
  with_compute_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> x(in), w(weight), b(bias);
    Out<T> y(out, false);
    const int64_t n = rows_of(in), I = cols_of(in), O = weight.dim(0);
    if (b)
      for (int64_t i = 0; i < n; ++i) std::memcpy(y.get() + i * O, b.get(), sizeof(T) * static_cast<size_t>(O));
    blas_gemm(Trans::N, Trans::T, n, O, I, T(1), x, I, w, I, b ? T(1) : T(0), y, O);
    y.commit();
  });
}

void linear_backward(const Tensor& din, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& in, const Tensor& weight, Write din_write) {
  with_compute_type(dout.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> dy(dout), x(in), w(weight);
    const bool add = din_write == Write::kAdd;
    Out<T> dx(din, add), dw(dweight, true), db(dbias, true);
    const int64_t n = rows_of(in), I = cols_of(in), O = weight.dim(0);
    if (dx) blas_gemm(Trans::N, Trans::N, n, I, O, T(1), dy, O, w, I, add ? T(1) : T(0), dx, I);
    if (dw) blas_gemm(Trans::T, Trans::N, O, I, n, T(1), dy, O, x, I, T(1), dw, I);
    if (db) add_column_sums<T>(db, dy, n, O);
    dx.commit();
    dw.commit();
    db.commit();
  });
}

// The reference of the fused forms: the two ops, each output rounded to its dtype as the
// unfused layers have always done.
void linear_gelu_forward(const Tensor& out, const Tensor& pre, const Tensor& in, const Tensor& weight,
                         const Tensor& bias) {
  cpu::linear_forward(pre, in, weight, bias);
  cpu::gelu_forward(out, pre);
}

void linear_backward_gelu(const Tensor& dpre, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                          const Tensor& in, const Tensor& weight, const Tensor& pre) {
  cpu::linear_backward(dpre, dweight, dbias, dout, in, weight, Write::kSet);
  cpu::gelu_backward(dpre, dpre, pre, Write::kSet);  // in place: element i reads dpre[i], then writes it
}

void bias_add(const Tensor& x, const Tensor& bias) {
  with_compute_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> b(bias);
    Out<T> y(x, true);
    const int64_t n = rows_of(x), O = cols_of(x);
#pragma omp parallel for schedule(static) if (n * O > 65536)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < O; ++j) y.get()[i * O + j] += b.get()[j];
    y.commit();
  });
}

void bias_backward(const Tensor& dbias, const Tensor& dx) {
  with_compute_type(dx.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> g(dx);
    Out<T> db(dbias, true);
    add_column_sums<T>(db, g, rows_of(dx), cols_of(dx));
    db.commit();
  });
}

}  // namespace megabatch::ops::cpu
