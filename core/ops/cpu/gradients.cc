// The gradient chores on the CPU.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops/backends.h"
#include "core/ops/cpu/f32.h"

namespace megabatch::ops::cpu {

void unscale_and_check(const Tensor& grads, const Tensor& found_inf, const Tensor& scaler) {
  float* g = grads.data<float>();
  const float inv = 1.0f / scaler.data<float>()[0];
  const int64_t n = static_cast<int64_t>(grads.numel());
  int bad = 0;
#pragma omp parallel for simd reduction(| : bad) schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    bad |= !std::isfinite(g[i]);
    g[i] *= inv;
  }
  found_inf.data<float>()[0] = bad ? 1.0f : 0.0f;
}

void loss_scaler_update(const Tensor& scaler, const Tensor& found_inf, const ops::LossScalerConfig& config) {
  float* s = scaler.data<float>();
  ops::LossScalerState st{s[0], s[1], s[2]};
  ops::update_loss_scale(st, found_inf.data<float>()[0] != 0.0f, config);
  s[0] = st.scale;
  s[1] = st.growth_tracker;
  s[2] = st.hysteresis_tracker;
}

namespace {

// out[0], out[1] = the totals of segment_sums (f64 (S) per segment) over the sharded and
// the replicated segments, each added in parameter order.
template <typename SegmentSums>
void split_totals(const Tensor& out, const std::vector<std::pair<size_t, size_t>>& sharded,
                  const std::vector<std::pair<size_t, size_t>>& replicated, SegmentSums segment_sums) {
  double* o = out.data<double>();
  for (int part = 0; part < 2; ++part) {
    const auto& segs = part == 0 ? sharded : replicated;
    Tensor per({static_cast<int64_t>(std::max<size_t>(segs.size(), 1))}, DType::kF64);
    segment_sums(per.flat(0, segs.size()), segs);
    double total = 0;
    for (size_t s = 0; s < segs.size(); ++s) total += per.data<double>()[s];
    o[part] = total;
  }
}

}  // namespace

void split_sum_squares(const Tensor& out, const Tensor& x, const std::vector<std::pair<size_t, size_t>>& sharded,
                       const std::vector<std::pair<size_t, size_t>>& replicated) {
  split_totals(out, sharded, replicated,
               [&](const Tensor& per, const auto& segs) { cpu::segment_sum_squares(per, x, segs); });
}

void split_sum_squares_of_growth(const Tensor& out, const Tensor& x, const Tensor& prev,
                                 const std::vector<std::pair<size_t, size_t>>& sharded,
                                 const std::vector<std::pair<size_t, size_t>>& replicated) {
  split_totals(out, sharded, replicated,
               [&](const Tensor& per, const auto& segs) { cpu::segment_sum_squares_of_growth(per, x, prev, segs); });
}

void clip_coefficient(const Tensor& norm, const Tensor& sums, double max_norm) {
  const double* s = sums.data<double>();
  double* out = norm.data<double>();
  const double n = std::sqrt(s[0] + s[1]);
  const double coeff = max_norm > 0 ? std::min(1.0, max_norm / (n + 1e-6)) : 1.0;
  out[0] = n;
  out[1] = coeff;
  out[2] = n * coeff;
}

void scale_by(const Tensor& x, const Tensor& factor, size_t index) {
  const double f = factor.data<double>()[index];
  if (f == 1.0) return;
  float* g = x.data<float>();
  const float c = static_cast<float>(f);
  const int64_t n = static_cast<int64_t>(x.numel());
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) g[i] *= c;
}

}  // namespace megabatch::ops::cpu
