#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

namespace megabatch::train {

// The gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, appendix
// A), from the squared norms of a small-batch gradient (b samples) and of the global-batch
// gradient (B samples) of the same step, whose expectations are |G|^2 + tr(Sigma)/b and
// |G|^2 + tr(Sigma)/B. Each step gives unbiased estimates of |G|^2 and tr(Sigma); both are
// smoothed by bias-corrected exponential moving averages and B_simple is their ratio. The
// trainer's small-batch term is the mean over the step's micro-batches (b = micro batch) of
// their squared norms: from the first alone, one outlier sample in it made |G|^2 hugely
// negative (and one in the others hugely positive) for as long as the average remembered.
// The averages decay by `ema` a step or, given a window of `window_samples`, by
// exp(-B / window_samples) a step of B samples: runs at different batch sizes then average
// over the same number of samples, so they lag alike behind a change of the noise (a loss
// spike, a phase of training) and compare at the same loss; a decay per step makes a run at
// 16x the batch remember 16x the samples.
class NoiseScaleEstimator {
 public:
  explicit NoiseScaleEstimator(double ema = 0.99, double window_samples = 0) : ema_(ema), window_(window_samples) {}
  struct Step {
    double grad_sq_norm, trace_cov;  // this step's unbiased estimates, before any averaging
  };
  Step add(double small_sq_norm, double small_batch, double big_sq_norm, double big_batch);
  double grad_sq_norm() const;  // |G|^2 estimate
  double trace_cov() const;     // tr(Sigma) estimate (per-sample covariance)
  double b_simple() const { return trace_cov() / grad_sq_norm(); }
  int64_t count() const { return n_; }
  nlohmann::json state() const;  // for checkpoints (exact: doubles round-trip through JSON)
  void restore(const nlohmann::json& state);

 private:
  double ema_, window_, g2_ = 0, tr_ = 0, decay_pow_ = 1;
  int64_t n_ = 0;
};

// The estimate compares micro-batch and global-batch gradients: a global batch (the first of a
// ramp, its smallest) of fewer than 2 micro-batches is refused, naming --micro-batch-size.
void check_noise_scale_batch(int64_t first_global_batch, int64_t micro_batch, bool ramped);

}  // namespace megabatch::train
