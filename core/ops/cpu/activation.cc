// GELU, squared ReLU, SwiGLU and tanh on the CPU.
#include <cmath>

#include "core/ops/backends.h"
#include "core/ops/cpu/f32.h"
#include "core/ops/cpu/vecmath.h"

namespace megabatch::ops::cpu {
namespace {
template <typename T>
constexpr T kGeluS = static_cast<T>(0.79788456080286535588);  // sqrt(2 / pi)
template <typename T>
constexpr T kGeluA = static_cast<T>(0.044715);
}  // namespace

void gelu_forward(const Tensor& out, const Tensor& in) {
  with_compute_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> xs(in);
    Out<T> ys(out, false);
    const T* x = xs;
    T* y = ys;
    const int64_t n = static_cast<int64_t>(in.numel());
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) y[i] = T(0.5) * x[i] * (T(1) + vtanh(kGeluS<T> * (x[i] + kGeluA<T> * x[i] * x[i] * x[i])));
    ys.commit();
  });
}

void gelu_backward(const Tensor& din, const Tensor& dout, const Tensor& in, Write w) {
  with_compute_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> xs(in), gs(dout);
    const bool add = w == Write::kAdd;
    Out<T> ds(din, add);
    const T *x = xs, *g = gs;
    T* d = ds;
    const int64_t n = static_cast<int64_t>(in.numel());
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const T t = vtanh(kGeluS<T> * (x[i] + kGeluA<T> * x[i] * x[i] * x[i]));
      const T dt = kGeluS<T> * (T(1) + T(3) * kGeluA<T> * x[i] * x[i]);
      const T v = g[i] * (T(0.5) * (T(1) + t) + T(0.5) * x[i] * (T(1) - t * t) * dt);
      d[i] = add ? d[i] + v : v;
    }
    ds.commit();
  });
}

void squared_relu_forward(const Tensor& out, const Tensor& in) {
  with_compute_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> xs(in);
    Out<T> ys(out, false);
    const T* x = xs;
    T* y = ys;
    const int64_t n = static_cast<int64_t>(in.numel());
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] * x[i] : T(0);
    ys.commit();
  });
}

void squared_relu_backward(const Tensor& din, const Tensor& dout, const Tensor& in) {
  with_compute_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> xs(in), gs(dout);
    Out<T> ds(din, false);
    const T *x = xs, *g = gs;
    T* d = ds;
    const int64_t n = static_cast<int64_t>(in.numel());
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) d[i] = x[i] > T(0) ? T(2) * x[i] * g[i] : T(0);
    ds.commit();
  });
}

void swiglu_forward(const Tensor& out, const Tensor& in) {
  with_compute_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> xs(in);
    Out<T> ys(out, false);
    const T* x = xs;
    T* y = ys;
    const int64_t n = static_cast<int64_t>(out.numel());
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t j = 0; j < n; ++j) {
      const T g = x[2 * j], s = T(1) / (T(1) + std::exp(-g));
      y[j] = g * s * x[2 * j + 1];
    }
    ys.commit();
  });
}

void swiglu_backward(const Tensor& din, const Tensor& dout, const Tensor& in) {
  with_compute_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> xs(in), gs(dout);
    Out<T> ds(din, false);
    const T *x = xs, *dy = gs;
    T* d = ds;
    const int64_t n = static_cast<int64_t>(dout.numel());
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t j = 0; j < n; ++j) {
      const T g = x[2 * j], u = x[2 * j + 1], s = T(1) / (T(1) + std::exp(-g));
      d[2 * j] = dy[j] * u * s * (T(1) + g * (T(1) - s));
      d[2 * j + 1] = dy[j] * g * s;
    }
    ds.commit();
  });
}

void tanh_forward(const Tensor& out, const Tensor& in) {
  with_compute_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> xs(in);
    Out<T> ys(out, false);
    const T* x = xs;
    T* y = ys;
    for (size_t i = 0; i < in.numel(); ++i) y[i] = std::tanh(x[i]);
    ys.commit();
  });
}

void tanh_backward(const Tensor& din, const Tensor& dout, const Tensor& out) {
  with_compute_type(out.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> ys(out), gs(dout);
    Out<T> ds(din, true);
    const T *y = ys, *g = gs;
    T* d = ds;
    for (size_t i = 0; i < out.numel(); ++i) d[i] += g[i] * (T(1) - y[i] * y[i]);
    ds.commit();
  });
}

}  // namespace megabatch::ops::cpu
