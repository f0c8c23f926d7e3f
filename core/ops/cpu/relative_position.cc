// T5's relative position bias on the CPU.
#include "core/ops/backends.h"
#include "core/ops/cpu/f32.h"

namespace megabatch::ops::cpu {

void relative_bias_forward(const Tensor& out, const Tensor& table, const Tensor& buckets) {
  with_compute_type(table.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> tab(table);
    Out<T> ys(out, false);
    const int32_t* bucket = buckets.data<int32_t>();
    const int64_t H = table.dim(1), E = static_cast<int64_t>(buckets.numel());
    for (int64_t h = 0; h < H; ++h)
      for (int64_t e = 0; e < E; ++e) ys.get()[h * E + e] = tab.get()[bucket[e] * H + h];
    ys.commit();
  });
}

void relative_bias_backward(const Tensor& dtable, const Tensor& dout, const Tensor& buckets) {
  with_compute_type(dout.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> gs(dout);
    Out<T> ds(dtable, true);
    const int32_t* bucket = buckets.data<int32_t>();
    const int64_t H = dtable.dim(1), E = static_cast<int64_t>(buckets.numel());
    for (int64_t h = 0; h < H; ++h)  // positions in row-major order: the order the GPU kernel uses too
      for (int64_t e = 0; e < E; ++e) ds.get()[bucket[e] * H + h] += gs.get()[h * E + e];
  });
}

}  // namespace megabatch::ops::cpu
