// Dtype conversion and scaling on the CPU.
#include "core/ops/backends.h"
#include "core/ops/cpu/f32.h"
#include "core/ops/cpu/map.h"

namespace megabatch::ops::cpu {

void cast(const Tensor& dst, const Tensor& src) {
  const int64_t n = static_cast<int64_t>(src.numel());
  if (dst.dtype() == DType::kF64) {
    const std::vector<double> v = cpu_values_f64(src);
    std::copy(v.begin(), v.end(), dst.data<double>());
    return;
  }
  if (src.dtype() == DType::kF32 && is_half(dst.dtype())) {  // the hot case: masters into half parameters
    const float* s = src.data<float>();
    uint16_t* d = dst.data<uint16_t>();
    if (dst.dtype() == DType::kBF16) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(s[i]);
    } else {
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_f16(s[i]);
    }
    return;
  }
  In<float> s(src);
  Out<float> d(dst, false);
  for (int64_t i = 0; i < n; ++i) d.get()[i] = s.get()[i];
  d.commit();
}

void scale(const Tensor& x, float s) {
  map_elements(x, Write::kSet, x, [s](auto v) { return v * static_cast<decltype(v)>(s); });
}

}  // namespace megabatch::ops::cpu
