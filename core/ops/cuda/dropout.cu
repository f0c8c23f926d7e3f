// Dropout on a GPU: the Philox mask of the CPU path, bit for bit. A thread handles the four
// elements of one Philox block (element e of the full tensor is lane e % 4 of block e / 4).
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"
#include "core/util/philox.h"

namespace megabatch::ops::MB_CUDA_BACKEND {
namespace {

struct MaskArgs {
  uint64_t key, stream, offset;
  uint32_t threshold;  // kept when the draw is >= threshold
  float scale;         // 1 / (1 - p)
};

template <typename T, bool kBackward>
__global__ void dropout_kernel(T* out, const T* in, int64_t n, MaskArgs m) {
  const int64_t first = static_cast<int64_t>(m.offset / 4), last = static_cast<int64_t>((m.offset + n + 3) / 4);
  for (int64_t b = first + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < last;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const auto r = Philox4x32::generate(m.key, m.stream, static_cast<uint64_t>(b));
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t e = b * 4 + lane - static_cast<int64_t>(m.offset);
      if (e < 0 || e >= n) continue;
      const bool kept = r[lane] >= m.threshold;
      if (kBackward) {
        if (kept) out[e] = from_f32<T>(to_f32(out[e]) + to_f32(in[e]) * m.scale);
      } else {
        out[e] = from_f32<T>(kept ? to_f32(in[e]) * m.scale : 0.0f);
      }
    }
  }
}

MaskArgs args(const DropoutKey& k, uint64_t offset) {
  // the same threshold and scale as the CPU path (computed in double, then converted)
  return {k.key, k.stream, offset, static_cast<uint32_t>(static_cast<uint64_t>(k.p * 4294967296.0)),
          static_cast<float>(1.0 / (1.0 - k.p))};
}

template <bool kBackward>
void run(const Tensor& out, const Tensor& in, uint64_t offset, const DropoutKey& k) {
  const int64_t n = static_cast<int64_t>(in.numel());
  if (n == 0) return;
  const int64_t blocks = static_cast<int64_t>((offset + n + 3) / 4 - offset / 4);
  constexpr const Accepts& row = kBackward ? accepts::dropout_backward_dout : accepts::dropout_forward_in;
  with_type<row.cuda.bits>(in.dtype(), row.op, [&](auto zero) {
    using T = decltype(zero);
    launch(dropout_kernel<T, kBackward>, dim3(blocks_for(blocks, 256)), 256, 0, stream_of(in), "dropout_kernel",
           ptr<T>(out), ptr<T>(in), n, args(k, offset));
  });
}

}  // namespace

void dropout_forward(const Tensor& out, const Tensor& in, uint64_t offset, const DropoutKey& k) {
  run<false>(out, in, offset, k);
}

void dropout_backward(const Tensor& din, const Tensor& dout, uint64_t offset, const DropoutKey& k, Write w) {
  if (w == Write::kSet) return run<false>(din, dout, offset, k);  // din = dout * keep / (1 - p)
  run<true>(din, dout, offset, k);
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
