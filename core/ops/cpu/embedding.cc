// Embedding lookup and its deterministic backward on the CPU.
#include <algorithm>
#include <cstring>

#include "core/ops/backends.h"
#include "core/ops/cpu/f32.h"

namespace megabatch::ops::cpu {

void embedding_forward(const Tensor& out, const Tensor& ids_t, const Tensor& table, int64_t row_begin, bool accumulate) {
  with_compute_type(table.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> tab(table);
    Out<T> ys(out, accumulate);
    const int32_t* ids = ids_t.data<int32_t>();
    const int64_t n = static_cast<int64_t>(ids_t.numel()), C = table.dim(1), rows = table.dim(0);
    T* y = ys;
#pragma omp parallel for schedule(static) if (n * C > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = static_cast<int64_t>(ids[i]) - row_begin;
      const bool inside = r >= 0 && r < rows;
      if (accumulate) {
        if (inside)
          for (int64_t c = 0; c < C; ++c) y[i * C + c] += tab.get()[r * C + c];
      } else if (inside) {
        std::memcpy(y + i * C, tab.get() + r * C, sizeof(T) * static_cast<size_t>(C));
      } else {
        std::memset(y + i * C, 0, sizeof(T) * static_cast<size_t>(C));
      }
    }
    ys.commit();
  });
}

void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids_t, int64_t row_begin) {
  with_compute_type(dout.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> gs(dout);
    Out<T> ds(dtable, true);
    const int32_t* ids = ids_t.data<int32_t>();
    const int64_t n = static_cast<int64_t>(ids_t.numel()), C = dtable.dim(1), rows = dtable.dim(0);
    constexpr int64_t kCols = 64;  // parallel over column blocks: each element has one writer, tokens in order
#pragma omp parallel for schedule(static) if (n * C > 65536)
    for (int64_t c0 = 0; c0 < C; c0 += kCols) {
      const int64_t c1 = std::min(C, c0 + kCols);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = static_cast<int64_t>(ids[i]) - row_begin;
        if (r < 0 || r >= rows) continue;
        T* dst = ds.get() + r * C;
        const T* src = gs.get() + i * C;
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
    }
    ds.commit();
  });
}

}  // namespace megabatch::ops::cpu
