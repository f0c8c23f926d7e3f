// Learning-rate schedules counted in samples, as Megatron's OptimizerParamScheduler:
// linear warmup from init_lr (default 0) over warmup_samples, then decay from max_lr to
// min_lr over [warmup_samples, decay_samples], min_lr after. WSD (warmup, stable, decay)
// holds max_lr and decays only over the last wsd_decay_samples of that span. The LR of an
// iteration is the schedule at the samples consumed before it.
#pragma once

#include <cstdint>
#include <string>

namespace megabatch::optim {

enum class DecayStyle { kConstant, kLinear, kCosine, kInverseSquareRoot, kPolynomial, kWsd };
DecayStyle parse_decay_style(const std::string& s);  // Error listing the styles
const char* decay_style_name(DecayStyle s);          // Megatron's spelling: "WSD" for kWsd

// The shape of WSD's decay (Megatron's --lr-wsd-decay-style), over r from 0 to 1 of it:
// exponential 2 * 0.5^r - 1, linear 1 - r, cosine (1 + cos(pi r)) / 2, minus_sqrt 1 - sqrt(r).
enum class WsdStyle { kExponential, kLinear, kCosine, kMinusSqrt };
WsdStyle parse_wsd_style(const std::string& s);  // Error listing the styles
const char* wsd_style_name(WsdStyle s);

// Megatron's --weight-decay-incr-style: the weight decay goes from start to end over
// incr_samples (the run's length), linearly or along a half cosine
// (start + (end - start) (1 - cos(pi r)) / 2), and stays at end after; constant holds the
// plugin's own weight_decay (start and end record it, for a resumed run's check). The weight
// decay of an iteration is the schedule at the samples consumed before it, as its LR.
enum class WdIncrStyle { kConstant, kLinear, kCosine };
WdIncrStyle parse_wd_incr_style(const std::string& s);  // Error listing the styles
const char* wd_incr_style_name(WdIncrStyle s);

struct WdSchedule {
  WdIncrStyle style = WdIncrStyle::kConstant;
  double start = 0, end = 0;
  int64_t incr_samples = 0;
  bool scheduled() const { return style != WdIncrStyle::kConstant; }
  double at(int64_t samples) const;
};

struct LrSchedule {
  double max_lr = 0, min_lr = 0;
  int64_t warmup_samples = 0, decay_samples = 0;
  DecayStyle style = DecayStyle::kLinear;
  double power = 1.0;             // polynomial: (1 - ratio)^power
  int64_t wsd_decay_samples = 0;  // WSD: the decay, the last samples of the decay span
  WsdStyle wsd_style = WsdStyle::kExponential;
  double init_lr = 0;  // where the warmup starts (Megatron's --lr-warmup-init)
  double lr(int64_t samples) const;
  WdSchedule wd = {};  // the weight decay beside it (Megatron's OptimizerParamScheduler moves both)
  // Megatron's --decoupled-lr and --decoupled-min-lr: the embedding and output layer's own
  // peak and minimum, under the same warmup (from init_lr) and decay.
  bool decoupled = false;
  double decoupled_max_lr = 0, decoupled_min_lr = 0;
  double decoupled_lr(int64_t samples) const;  // lr(samples) where the run has none
};

// LR scaling rules for batch-size sweeps: lr = base * (batch / ref)^k with k = 0 (none),
// 1/2 (sqrt) or 1 (linear).
enum class LrScaling { kNone, kSqrt, kLinear };
LrScaling parse_lr_scaling(const std::string& s);
double scaled_lr(double base, LrScaling rule, int64_t batch, int64_t ref_batch);

// Global-norm clipping: the factor max_norm / (norm + 1e-6) to multiply the gradients by,
// or 1 when that is not below 1 or max_norm <= 0 (the norm itself: train::grad_norm).
double clip_coefficient(double norm, double max_norm);

}  // namespace megabatch::optim
