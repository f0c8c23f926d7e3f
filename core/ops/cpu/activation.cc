// GELU, squared ReLU, SwiGLU and tanh on the CPU.
#include <cmath>

#include "core/ops/backends.h"
#include "core/ops/cpu/f32.h"
#include "core/ops/cpu/map.h"
#include "core/ops/cpu/vecmath.h"

namespace megabatch::ops::cpu {
namespace {
template <typename T>
constexpr T kGeluS = static_cast<T>(0.79788456080286535588);  // sqrt(2 / pi)
template <typename T>
constexpr T kGeluA = static_cast<T>(0.044715);
}  // namespace

void gelu_forward(const Tensor& out, const Tensor& in) {
  map_elements(out, Write::kSet, in, [](auto x) {
    using T = decltype(x);
    return T(0.5) * x * (T(1) + vtanh(kGeluS<T> * (x + kGeluA<T> * x * x * x)));
  });
}

void gelu_backward(const Tensor& din, const Tensor& dout, const Tensor& in, Write w) {
  map_elements(din, w, dout, in, [](auto g, auto x) {
    using T = decltype(x);
    const T t = vtanh(kGeluS<T> * (x + kGeluA<T> * x * x * x));
    const T dt = kGeluS<T> * (T(1) + T(3) * kGeluA<T> * x * x);
    return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dt);
  });
}

void squared_relu_forward(const Tensor& out, const Tensor& in) {
  map_elements(out, Write::kSet, in, [](auto x) { return x > decltype(x)(0) ? x * x : decltype(x)(0); });
}

void squared_relu_backward(const Tensor& din, const Tensor& dout, const Tensor& in) {
  map_elements(din, Write::kSet, dout, in, [](auto g, auto x) {
    using T = decltype(x);
    return x > T(0) ? T(2) * x * g : T(0);
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
  map_elements(out, Write::kSet, in, [](auto x) { return std::tanh(x); });
}

void tanh_backward(const Tensor& din, const Tensor& dout, const Tensor& out) {
  map_elements(din, Write::kAdd, dout, out, [](auto g, auto y) { return g * (decltype(y)(1) - y * y); });
}

}  // namespace megabatch::ops::cpu
