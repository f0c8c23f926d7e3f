// Residual add and gradient accumulation on the CPU.
#include "core/ops/backends.h"
#include "core/ops/cpu/f32.h"

namespace megabatch::ops::cpu {

void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) {
  with_compute_type(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> as(a), bs(b);
    Out<T> ys(out, false);
    const T *x = as, *z = bs;
    T* y = ys;
    const int64_t n = static_cast<int64_t>(a.numel());
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] + z[i];
    ys.commit();
  });
}

void residual_backward(const Tensor& da, const Tensor& db, const Tensor& dout) {
  with_compute_type(dout.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> gs(dout);
    const T* g = gs;
    const int64_t n = static_cast<int64_t>(dout.numel());
    for (const Tensor* t : {&da, &db}) {
      if (!t->defined()) continue;
      Out<T> ds(*t, true);
      T* d = ds;
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) d[i] += g[i];
      ds.commit();
    }
  });
}

}  // namespace megabatch::ops::cpu
