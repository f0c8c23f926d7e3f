// Rotary position embeddings on a GPU (rotary.h): a thread per turned channel pair.
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

namespace megabatch::ops::MB_CUDA_BACKEND {
namespace {

// pairs = rows x G groups x (per queries + a key) x half; sign 1 turns by +angle, -1 by -angle
template <typename T>
__global__ void rope_kernel(T* x, int64_t pairs, RotaryShape s, int64_t G, float sign) {
  const int64_t half = s.rotary_dim / 2, per = s.heads / G;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < pairs;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e % half, which = (e / half) % (per + 1), g = (e / (half * (per + 1))) % G,
                  r = e / (half * (per + 1) * G);
    // as Megatron: inv_freq = 1 / base^(2i / d) in fp32, angle = pos * inv_freq in fp32
    const float inv_freq = 1.0f / powf(static_cast<float>(s.base), static_cast<float>(2 * i) /
                                                                     static_cast<float>(s.rotary_dim));
    const float angle = static_cast<float>(r % s.T) * static_cast<float>(s.position_scale) * inv_freq;
    const float c = cosf(angle), sn = sign * sinf(angle);
    T* v = x + (r * G + g) * (per + 2) * s.head_dim + which * s.head_dim;
    const int64_t a = s.interleaved ? 2 * i : i, b = s.interleaved ? 2 * i + 1 : i + half;
    const float x1 = to_f32(v[a]), x2 = to_f32(v[b]);
    v[a] = from_f32<T>(x1 * c - x2 * sn);
    v[b] = from_f32<T>(x2 * c + x1 * sn);
  }
}

void turn(const char* name, const Tensor& qkv, const RotaryShape& s, float sign) {
  with_type<accepts::rope_forward_qkv.cuda.bits>(qkv.dtype(), name, [&](auto zero) {
    using T = decltype(zero);
    const int64_t G = kv_heads(s);
    const int64_t rows = static_cast<int64_t>(qkv.numel()) / ((s.heads + 2 * G) * s.head_dim);
    const int64_t pairs = rows * (s.heads + G) * (s.rotary_dim / 2);
    if (pairs > 0)
      launch(rope_kernel<T>, dim3(blocks_for(pairs, 256)), 256, 0, stream_of(qkv), name, ptr<T>(qkv), pairs, s, G,
             sign);
  });
}

}  // namespace

void rope_forward(const Tensor& qkv, const RotaryShape& s) { turn("rope_forward", qkv, s, 1.0f); }
void rope_backward(const Tensor& dqkv, const RotaryShape& s) { turn("rope_backward", dqkv, s, -1.0f); }

}  // namespace megabatch::ops::MB_CUDA_BACKEND
