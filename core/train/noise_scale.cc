#include "core/train/noise_scale.h"

#include <cmath>

#include "core/util/error.h"

namespace megabatch::train {

void check_noise_scale_batch(int64_t first_global_batch, int64_t micro_batch, bool ramped) {
  check(first_global_batch >= 2 * micro_batch,
        "--log-noise-scale compares micro-batch and global-batch gradients, so a global batch needs at least 2 "
        "micro-batches (global batch ",
        first_global_batch, ramped ? " at the start of the ramp" : "", ", micro batch ", micro_batch,
        "); lower --micro-batch-size");
}

NoiseScaleEstimator::Step NoiseScaleEstimator::add(double small_sq, double b, double big_sq, double B) {
  check(B > b && b > 0, "noise scale: the small batch (", b, ") must be smaller than the big batch (", B, ")");
  const double g2 = (B * big_sq - b * small_sq) / (B - b);
  const double tr = (small_sq - big_sq) / (1.0 / b - 1.0 / B);
  const double d = window_ > 0 ? std::exp(-B / window_) : ema_;
  g2_ = d * g2_ + (1 - d) * g2;
  tr_ = d * tr_ + (1 - d) * tr;
  decay_pow_ *= d;
  ++n_;
  return {g2, tr};
}
nlohmann::json NoiseScaleEstimator::state() const {
  return {{"g2", g2_}, {"trace", tr_}, {"decay_pow", decay_pow_}, {"count", n_}};
}
void NoiseScaleEstimator::restore(const nlohmann::json& s) {
  g2_ = s.at("g2").get<double>();
  tr_ = s.at("trace").get<double>();
  decay_pow_ = s.at("decay_pow").get<double>();
  n_ = s.at("count").get<int64_t>();
}
double NoiseScaleEstimator::grad_sq_norm() const { return n_ ? g2_ / (1 - decay_pow_) : std::nan(""); }
double NoiseScaleEstimator::trace_cov() const { return n_ ? tr_ / (1 - decay_pow_) : std::nan(""); }

}  // namespace megabatch::train
