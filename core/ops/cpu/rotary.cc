// Rotary position embeddings on the CPU: the reference (rotary.h).
#include <cmath>

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
    const int64_t D = s.head_dim, half = s.rotary_dim / 2, rows = static_cast<int64_t>(qkv.numel()) / (3 * s.heads * D);
#pragma omp parallel for schedule(static) if (rows > 64)
    for (int64_t r = 0; r < rows; ++r) {
      const float pos = static_cast<float>(r % s.T);
      for (int64_t i = 0; i < half; ++i) {
        // as Megatron: inv_freq = 1 / base^(2i / d) in fp32, angle = pos * inv_freq in fp32
        const float inv_freq = 1.0f / std::pow(static_cast<float>(s.base), static_cast<float>(2 * i) /
                                                                                 static_cast<float>(s.rotary_dim));
        const float angle = pos * inv_freq;
        const T c = static_cast<T>(std::cos(angle)), sn = static_cast<T>(sign * std::sin(angle));
        for (int64_t h = 0; h < s.heads; ++h)
          for (int which = 0; which < 2; ++which) {  // q, then k
            T* v = x + (r * s.heads + h) * 3 * D + which * D;
            const T x1 = v[i], x2 = v[i + half];
            v[i] = x1 * c - x2 * sn;
            v[i + half] = x2 * c + x1 * sn;
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
