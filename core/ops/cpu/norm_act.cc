// LayerNorm, GELU, residual add, dropout.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops/cpu/vecmath.h"
#include "core/ops/dropout.h"
#include "core/ops/gelu.h"
#include "core/ops/layernorm.h"
#include "core/ops/residual.h"
#include "core/util/philox.h"

namespace megabatch::ops {
using cpu::vtanh;

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* in, const T* weight, const T* bias, int64_t n, int64_t C,
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

template <typename T>
void layernorm_backward(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight, const T* mean,
                        const T* rstd, int64_t n, int64_t C) {
  constexpr int64_t kRows = 32;  // fixed row blocks: the reduction order is thread-independent
  const int64_t blocks = (n + kRows - 1) / kRows;
  std::vector<T> part_w(dweight ? blocks * C : 0), part_b(dbias ? blocks * C : 0);
#pragma omp parallel for schedule(static) if (n * C > 16384)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int64_t i = blk * kRows; i < std::min(n, (blk + 1) * kRows); ++i) {
      const T* x = in + i * C;
      const T* dy = dout + i * C;
      const T m = mean[i], s = rstd[i];
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

namespace {
template <typename T>
constexpr T kGeluS = static_cast<T>(0.79788456080286535588);  // sqrt(2 / pi)
template <typename T>
constexpr T kGeluA = static_cast<T>(0.044715);
}  // namespace

template <typename T>
void gelu_forward(T* out, const T* in, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const T x = in[i];
    out[i] = T(0.5) * x * (T(1) + vtanh(kGeluS<T> * (x + kGeluA<T> * x * x * x)));
  }
}

template <typename T>
void gelu_backward(T* din, const T* dout, const T* in, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const T x = in[i];
    const T t = vtanh(kGeluS<T> * (x + kGeluA<T> * x * x * x));
    const T dt = kGeluS<T> * (T(1) + T(3) * kGeluA<T> * x * x);
    din[i] += dout[i] * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dt);
  }
}

template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void residual_backward(T* da, T* db, const T* dout, int64_t n) {
  if (da) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) da[i] += dout[i];
  }
  if (db) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) db[i] += dout[i];
  }
}

namespace {
// fn(e, keep) for every element e in [0, n) of the tensor starting at element `offset`,
// one Philox block per 4 elements, generated where it is used.
template <typename Fn>
void for_each_mask(int64_t n, uint64_t offset, const DropoutKey& k, Fn&& fn) {
  const uint64_t threshold = static_cast<uint64_t>(k.p * 4294967296.0);
  const int64_t first_block = static_cast<int64_t>(offset / 4), last_block = static_cast<int64_t>((offset + n + 3) / 4);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t b = first_block; b < last_block; ++b) {
    const auto r = Philox4x32::generate(k.key, k.stream, static_cast<uint64_t>(b));
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t e = b * 4 + lane - static_cast<int64_t>(offset);
      if (e >= 0 && e < n) fn(e, uint64_t{r[lane]} >= threshold);
    }
  }
}
}  // namespace

void dropout_mask(uint8_t* keep, int64_t n, uint64_t offset, const DropoutKey& k) {
  for_each_mask(n, offset, k, [&](int64_t e, bool kept) { keep[e] = kept ? 1 : 0; });
}

template <typename T>
void dropout_forward(T* out, const T* in, int64_t n, uint64_t offset, const DropoutKey& k) {
  const T scale = static_cast<T>(1.0 / (1.0 - k.p));
  for_each_mask(n, offset, k, [&](int64_t e, bool kept) { out[e] = kept ? in[e] * scale : T(0); });
}

template <typename T>
void dropout_backward(T* din, const T* dout, int64_t n, uint64_t offset, const DropoutKey& k) {
  const T scale = static_cast<T>(1.0 / (1.0 - k.p));
  for_each_mask(n, offset, k, [&](int64_t e, bool kept) {
    if (kept) din[e] += dout[e] * scale;
  });
}

#define MB_INSTANTIATE(T)                                                                                          \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, double);         \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int64_t,      \
                                      int64_t);                                                                   \
  template void gelu_forward<T>(T*, const T*, int64_t);                                                           \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t);                                                \
  template void residual_forward<T>(T*, const T*, const T*, int64_t);                                             \
  template void residual_backward<T>(T*, T*, const T*, int64_t);                                                  \
  template void dropout_forward<T>(T*, const T*, int64_t, uint64_t, const DropoutKey&);                           \
  template void dropout_backward<T>(T*, const T*, int64_t, uint64_t, const DropoutKey&);
MB_INSTANTIATE(float)
MB_INSTANTIATE(double)
#undef MB_INSTANTIATE

}  // namespace megabatch::ops
