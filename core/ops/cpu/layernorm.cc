// LayerNorm and RMSNorm on the CPU.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops/backends.h"
#include "core/ops/cpu/f32.h"

namespace megabatch::ops::cpu {
namespace {

constexpr int64_t kRows = 32;  // fixed row blocks: parameter-gradient reductions are thread-independent

template <typename T>
void layernorm_fwd(T* out, T* mean, T* rstd, const T* in, const T* weight, const T* bias, int64_t n, int64_t C,
                   double eps) {
#pragma omp parallel for schedule(static) if (n * C > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const T* x = in + i * C;
    T* y = out + i * C;
    T m = 0;
    for (int64_t c = 0; c < C; ++c) m += x[c];
    m /= static_cast<T>(C);
    T v = 0;
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= static_cast<T>(C);
    const T s = T(1) / std::sqrt(v + static_cast<T>(eps));
    for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

// din += ...; dweight, dbias += ... (null mean: RMSNorm, xhat = x rstd and no dbias)
template <typename T>
void norm_bwd(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight, const T* mean,
              const T* rstd, int64_t n, int64_t C) {
  const int64_t blocks = (n + kRows - 1) / kRows;
  std::vector<T> part_w(dweight ? blocks * C : 0), part_b(dbias ? blocks * C : 0);
#pragma omp parallel for schedule(static) if (n * C > 16384)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int64_t i = blk * kRows; i < std::min(n, (blk + 1) * kRows); ++i) {
      const T* x = in + i * C;
      const T* dy = dout + i * C;
      const T m = mean ? mean[i] : T(0), s = rstd[i];
      T sum_g = 0, sum_gx = 0;  // mean of g = dy * w and of g * xhat
      for (int64_t c = 0; c < C; ++c) {
        const T xhat = (x[c] - m) * s;
        const T g = dy[c] * weight[c];
        sum_g += g;
        sum_gx += g * xhat;
        if (dweight) part_w[blk * C + c] += dy[c] * xhat;
        if (dbias) part_b[blk * C + c] += dy[c];
      }
      sum_g /= static_cast<T>(C);
      sum_gx /= static_cast<T>(C);
      if (!mean) sum_g = 0;  // RMSNorm: no mean was subtracted
      if (din) {
        T* dx = din + i * C;
        for (int64_t c = 0; c < C; ++c) {
          const T xhat = (x[c] - m) * s;
          dx[c] += s * (dy[c] * weight[c] - sum_g - xhat * sum_gx);
        }
      }
    }
  }
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int64_t c = 0; c < C; ++c) {
      if (dweight) dweight[c] += part_w[blk * C + c];
      if (dbias) dbias[c] += part_b[blk * C + c];
    }
  }
}

template <typename T>
void rmsnorm_fwd(T* out, T* rstd, const T* in, const T* weight, int64_t n, int64_t C, double eps) {
#pragma omp parallel for schedule(static) if (n * C > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const T* x = in + i * C;
    T* y = out + i * C;
    T ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += x[c] * x[c];
    ms /= static_cast<T>(C);
    const T s = T(1) / std::sqrt(ms + static_cast<T>(eps));
    for (int64_t c = 0; c < C; ++c) y[c] = x[c] * s * weight[c];
    rstd[i] = s;
  }
}

}  // namespace

void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in,
                       const Tensor& weight, const Tensor& bias, double eps) {
  with_compute_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> x(in), w(weight), b(bias);
    Out<T> y(out, false), m(mean, false), r(rstd, false);
    layernorm_fwd<T>(y, m, r, x, w, b, rows_of(in), cols_of(in), eps);
    y.commit();
  });
}

void layernorm_backward(const Tensor& din, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& in, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  with_compute_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> dy(dout), x(in), w(weight), m(mean), r(rstd);
    Out<T> dx(din, true), dw(dweight, true), db(dbias, true);
    norm_bwd<T>(dx, dw, db, dy, x, w, m, r, rows_of(in), cols_of(in));
    dx.commit();
  });
}

void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& weight, double eps) {
  with_compute_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> x(in), w(weight);
    Out<T> y(out, false), r(rstd, false);
    rmsnorm_fwd<T>(y, r, x, w, rows_of(in), cols_of(in), eps);
    y.commit();
  });
}

void rmsnorm_backward(const Tensor& din, const Tensor& dweight, const Tensor& dout, const Tensor& in,
                      const Tensor& weight, const Tensor& rstd) {
  with_compute_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> dy(dout), x(in), w(weight), r(rstd);
    Out<T> dx(din, true), dw(dweight, true);
    norm_bwd<T>(dx, dw, nullptr, dy, x, w, nullptr, r, rows_of(in), cols_of(in));
    dx.commit();
  });
}

// The reference of the fused forms: the two ops.
void layernorm_residual_forward(const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias, double eps) {
  cpu::residual_forward(sum, a, b);
  cpu::layernorm_forward(out, mean, rstd, sum, weight, bias, eps);
}

void rmsnorm_residual_forward(const Tensor& sum, const Tensor& out, const Tensor& rstd, const Tensor& a,
                              const Tensor& b, const Tensor& weight, double eps) {
  cpu::residual_forward(sum, a, b);
  cpu::rmsnorm_forward(out, rstd, sum, weight, eps);
}

}  // namespace megabatch::ops::cpu
