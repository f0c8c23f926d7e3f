// Learning-rate schedules counted in samples, as Megatron's OptimizerParamScheduler:
// linear warmup from 0 over warmup_samples, then decay from max_lr to min_lr over
// [warmup_samples, decay_samples], min_lr after. The LR of an iteration is the schedule
// at the samples consumed before it.
#pragma once

#include <cstdint>
#include <string>

namespace megabatch::optim {

enum class DecayStyle { kConstant, kLinear, kCosine, kInverseSquareRoot, kPolynomial };
DecayStyle parse_decay_style(const std::string& s);  // Error listing the styles
const char* decay_style_name(DecayStyle s);

struct LrSchedule {
  double max_lr = 0, min_lr = 0;
  int64_t warmup_samples = 0, decay_samples = 0;
  DecayStyle style = DecayStyle::kLinear;
  double power = 1.0;  // polynomial: (1 - ratio)^power
  double lr(int64_t samples) const;
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
