#include "core/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/util/error.h"

namespace megabatch::optim {

DecayStyle parse_decay_style(const std::string& s) {
  if (s == "constant") return DecayStyle::kConstant;
  if (s == "linear") return DecayStyle::kLinear;
  if (s == "cosine") return DecayStyle::kCosine;
  if (s == "inverse-square-root") return DecayStyle::kInverseSquareRoot;
  if (s == "polynomial") return DecayStyle::kPolynomial;
  fail("lr_decay_style: unknown style '", s, "'; use constant, linear, cosine, inverse-square-root or polynomial");
}

const char* decay_style_name(DecayStyle s) {
  switch (s) {
    case DecayStyle::kConstant: return "constant";
    case DecayStyle::kLinear: return "linear";
    case DecayStyle::kCosine: return "cosine";
    case DecayStyle::kInverseSquareRoot: return "inverse-square-root";
    case DecayStyle::kPolynomial: return "polynomial";
  }
  return "?";
}

double LrSchedule::lr(int64_t samples) const {
  if (warmup_samples > 0 && samples <= warmup_samples)
    return max_lr * static_cast<double>(samples) / static_cast<double>(warmup_samples);
  if (style == DecayStyle::kConstant) return max_lr;
  if (style == DecayStyle::kInverseSquareRoot) {
    const double w = static_cast<double>(std::max<int64_t>(warmup_samples, 1));
    const double n = static_cast<double>(std::max<int64_t>(samples, 1));
    return std::max(min_lr, max_lr * std::sqrt(w) / std::sqrt(n));
  }
  if (samples > decay_samples) return min_lr;
  const double span = static_cast<double>(decay_samples - warmup_samples);
  const double ratio = span > 0 ? static_cast<double>(samples - warmup_samples) / span : 1.0;
  double coeff = 0;
  switch (style) {
    case DecayStyle::kLinear: coeff = 1.0 - ratio; break;
    case DecayStyle::kCosine: coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0); break;
    case DecayStyle::kPolynomial: coeff = std::pow(1.0 - ratio, power); break;
    default: break;
  }
  return min_lr + coeff * (max_lr - min_lr);
}

LrScaling parse_lr_scaling(const std::string& s) {
  if (s == "none") return LrScaling::kNone;
  if (s == "sqrt") return LrScaling::kSqrt;
  if (s == "linear") return LrScaling::kLinear;
  fail("lr_scaling: unknown rule '", s, "'; use none, sqrt or linear");
}

double scaled_lr(double base, LrScaling rule, int64_t batch, int64_t ref_batch) {
  if (rule == LrScaling::kNone) return base;
  check(ref_batch > 0, "lr_scaling_ref_batch must be > 0 when lr_scaling is ", rule == LrScaling::kSqrt ? "sqrt" : "linear");
  const double r = static_cast<double>(batch) / static_cast<double>(ref_batch);
  return base * (rule == LrScaling::kSqrt ? std::sqrt(r) : r);
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

}  // namespace megabatch::optim
