// Dropout on the CPU: the Philox mask generated where it is used.
#include "core/ops/backends.h"
#include "core/ops/cpu/f32.h"
#include "core/util/philox.h"

namespace megabatch::ops {
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

namespace cpu {

void dropout_forward(const Tensor& out, const Tensor& in, uint64_t offset, const DropoutKey& k) {
  with_compute_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> xs(in);
    Out<T> ys(out, false);
    const T* x = xs;
    T* y = ys;
    const T scale = static_cast<T>(1.0 / (1.0 - k.p));
    for_each_mask(static_cast<int64_t>(in.numel()), offset, k,
                  [&](int64_t e, bool kept) { y[e] = kept ? x[e] * scale : T(0); });
    ys.commit();
  });
}

void dropout_backward(const Tensor& din, const Tensor& dout, uint64_t offset, const DropoutKey& k, Write w) {
  // kSet: din = dout * keep / (1 - p), the forward's map
  if (w == Write::kSet) return cpu::dropout_forward(din, dout, offset, k);
  with_compute_type(dout.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> gs(dout);
    Out<T> ds(din, true);
    const T* g = gs;
    T* d = ds;
    const T scale = static_cast<T>(1.0 / (1.0 - k.p));
    for_each_mask(static_cast<int64_t>(dout.numel()), offset, k, [&](int64_t e, bool kept) {
      if (kept) d[e] += g[e] * scale;
    });
    ds.commit();
  });
}

}  // namespace cpu
}  // namespace megabatch::ops
