// Rotary position embeddings on the CPU: the reference (rotary.h).
#include <cmath>
#include <vector>

#include "core/ops/backends.h"
#include "core/ops/cpu/f32.h"

namespace megabatch::ops::cpu {
namespace {
// Each row's q and k turned by +angle (sign 1) or -angle (sign -1).
void turn(const Tensor& qkv, const RotaryShape& s, float sign) {
  with_compute_type(qkv.dtype(), [&](auto zero) {
    using T = decltype(zero);
    Out<T> xs(qkv, true);  // read, turned, written back
    T* x = xs;
    const int64_t D = s.head_dim, half = s.rotary_dim / 2, G = kv_heads(s), per = s.heads / G;
    const int64_t rows = static_cast<int64_t>(qkv.numel()) / ((s.heads + 2 * G) * D);
    // cos and sin of each (position, pair), once for the B sequences. As Megatron: inv_freq =
    // 1 / base^(2i / d) in fp32, angle = pos * inv_freq in fp32
    std::vector<float> cosines(static_cast<size_t>(s.T * half)), sines(cosines.size());
    for (int64_t i = 0; i < half; ++i) {
      const float inv_freq =
          1.0f / std::pow(static_cast<float>(s.base), static_cast<float>(2 * i) / static_cast<float>(s.rotary_dim));
      for (int64_t pos = 0; pos < s.T; ++pos) {
        const float angle = static_cast<float>(pos) * static_cast<float>(s.position_scale) * inv_freq;
        cosines[static_cast<size_t>(pos * half + i)] = std::cos(angle);
        sines[static_cast<size_t>(pos * half + i)] = sign * std::sin(angle);
      }
    }
#pragma omp parallel for schedule(static) if (rows > 64)
    for (int64_t r = 0; r < rows; ++r) {
      const size_t at = static_cast<size_t>((r % s.T) * half);
      for (int64_t i = 0; i < half; ++i) {
        const T c = static_cast<T>(cosines[at + static_cast<size_t>(i)]),
                sn = static_cast<T>(sines[at + static_cast<size_t>(i)]);
        for (int64_t g = 0; g < G; ++g)
          for (int64_t which = 0; which <= per; ++which) {  // the group's queries, then its key
            T* v = x + (r * G + g) * (per + 2) * D + which * D;
            const int64_t a = s.interleaved ? 2 * i : i, b = s.interleaved ? 2 * i + 1 : i + half;
            const T x1 = v[a], x2 = v[b];
            v[a] = x1 * c - x2 * sn;
            v[b] = x2 * c + x1 * sn;
          }
      }
    }
    xs.commit();
  });
}
}  // namespace

void rope_forward(const Tensor& qkv, const RotaryShape& s) { turn(qkv, s, 1.0f); }
void rope_backward(const Tensor& dqkv, const RotaryShape& s) { turn(dqkv, s, -1.0f); }

}  // namespace megabatch::ops::cpu
