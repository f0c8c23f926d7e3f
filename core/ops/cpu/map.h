// Elementwise maps on the CPU: out[i] = f(a[i]) or f(a[i], b[i]) over every element, set or
// added (ops::Write), computed in the compute type of a's dtype (f64 for f64, else f32: the
// half types widened and rounded back as f32.h says), in parallel past 65,536 elements. f is
// called with T values, T the compute type. out may be a (in place).
#pragma once

#include <cstdint>

#include "core/ops/cpu/f32.h"
#include "core/ops/write.h"

namespace megabatch::ops::cpu {

namespace detail {
// y[i] = v(i) or y[i] += v(i), i in [0, n)
template <typename T, typename V>
void write_each(T* y, int64_t n, Write w, V&& v) {
  if (w == Write::kAdd) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] + v(i);
  } else {
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) y[i] = v(i);
  }
}
}  // namespace detail

// out = f(a) (kSet) or out += f(a) (kAdd), elementwise
template <typename F>
void map_elements(const Tensor& out, Write w, const Tensor& a, F&& f) {
  with_compute_type(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> as(a);
    Out<T> ys(out, w == Write::kAdd);
    const T* x = as;
    detail::write_each<T>(ys, static_cast<int64_t>(out.numel()), w, [&](int64_t i) { return f(x[i]); });
    ys.commit();
  });
}

// out = f(a, b) (kSet) or out += f(a, b) (kAdd), elementwise
template <typename F>
void map_elements(const Tensor& out, Write w, const Tensor& a, const Tensor& b, F&& f) {
  with_compute_type(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> as(a), bs(b);
    Out<T> ys(out, w == Write::kAdd);
    const T *x = as, *z = bs;
    detail::write_each<T>(ys, static_cast<int64_t>(out.numel()), w, [&](int64_t i) { return f(x[i], z[i]); });
    ys.commit();
  });
}

}  // namespace megabatch::ops::cpu
