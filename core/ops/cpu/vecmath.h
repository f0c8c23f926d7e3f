// Vectorizable exp and tanh for the CPU kernels. The float versions are a Cephes-style
// range reduction plus a degree-6 polynomial (relative error below 2 ulp over the whole
// range, checked in tests/unit/test_ops.cc) written so GCC vectorizes the loops that call
// them; the double versions call the C library, so the fp64 gradient checks use exact math.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace megabatch::ops::cpu {

// Below -87.3 (where exp leaves the normal floats) the result is 0, not a clamped 1.6e-38:
// a saturated softmax (a diverging run's logits) would otherwise fill its gradient with
// subnormal products that slow GEMMs on x86 by orders of magnitude.
inline float vexp(float x) {
  const bool underflow = x < -87.3f;
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  return underflow ? 0.0f : p * std::bit_cast<float>(e);
}
inline double vexp(double x) { return std::exp(x); }

inline float vtanh(float x) { return 1.0f - 2.0f / (vexp(2.0f * x) + 1.0f); }
inline double vtanh(double x) { return std::tanh(x); }

}  // namespace megabatch::ops::cpu
