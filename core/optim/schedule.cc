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
  if (s == "WSD") return DecayStyle::kWsd;
  fail("lr_decay_style: unknown style '", s, "'; use constant, linear, cosine, inverse-square-root, polynomial or WSD");
}

const char* decay_style_name(DecayStyle s) {
  switch (s) {
    case DecayStyle::kConstant: return "constant";
    case DecayStyle::kLinear: return "linear";
    case DecayStyle::kCosine: return "cosine";
    case DecayStyle::kInverseSquareRoot: return "inverse-square-root";
    case DecayStyle::kPolynomial: return "polynomial";
    case DecayStyle::kWsd: return "WSD";
  }
  return "?";
}

WsdStyle parse_wsd_style(const std::string& s) {
  if (s == "exponential") return WsdStyle::kExponential;
  if (s == "linear") return WsdStyle::kLinear;
  if (s == "cosine") return WsdStyle::kCosine;
  if (s == "minus_sqrt") return WsdStyle::kMinusSqrt;
  fail("lr_wsd_decay_style: unknown style '", s, "'; use exponential, linear, cosine or minus_sqrt");
}

const char* wsd_style_name(WsdStyle s) {
  switch (s) {
    case WsdStyle::kExponential: return "exponential";
    case WsdStyle::kLinear: return "linear";
    case WsdStyle::kCosine: return "cosine";
    case WsdStyle::kMinusSqrt: return "minus_sqrt";
  }
  return "?";
}

WdIncrStyle parse_wd_incr_style(const std::string& s) {
  if (s == "constant") return WdIncrStyle::kConstant;
  if (s == "linear") return WdIncrStyle::kLinear;
  if (s == "cosine") return WdIncrStyle::kCosine;
  fail("weight_decay_incr_style: unknown style '", s, "'; use constant, linear or cosine");
}

const char* wd_incr_style_name(WdIncrStyle s) {
  switch (s) {
    case WdIncrStyle::kConstant:
      return "constant";
    case WdIncrStyle::kLinear:
      return "linear";
    case WdIncrStyle::kCosine:
      return "cosine";
  }
  return "?";
}

double WdSchedule::at(int64_t samples) const {
  if (style == WdIncrStyle::kConstant || samples >= incr_samples) return end;
  const double r = static_cast<double>(samples) / static_cast<double>(incr_samples);
  const double coeff = style == WdIncrStyle::kLinear ? r : 0.5 * (std::cos(std::numbers::pi * (1.0 - r)) + 1.0);
  return start + coeff * (end - start);
}

double LrSchedule::lr(int64_t samples) const {
  if (warmup_samples > 0 && samples <= warmup_samples)
    return init_lr + (max_lr - init_lr) * static_cast<double>(samples) / static_cast<double>(warmup_samples);
  if (style == DecayStyle::kConstant) return max_lr;
  if (style == DecayStyle::kInverseSquareRoot) {
    const double w = static_cast<double>(std::max<int64_t>(warmup_samples, 1));
    const double n = static_cast<double>(std::max<int64_t>(samples, 1));
    return std::max(min_lr, max_lr * std::sqrt(w) / std::sqrt(n));
  }
  if (samples > decay_samples) return min_lr;
  if (style == DecayStyle::kWsd) {
    const int64_t stable_until = decay_samples - wsd_decay_samples;
    if (samples <= stable_until) return max_lr;  // (so a decay of 0 samples never divides by it)
    const double r = static_cast<double>(samples - stable_until) / static_cast<double>(wsd_decay_samples);
    double coeff = 0;
    switch (wsd_style) {
      case WsdStyle::kExponential: coeff = 2.0 * std::pow(0.5, r) - 1.0; break;
      case WsdStyle::kLinear: coeff = 1.0 - r; break;
      case WsdStyle::kCosine: coeff = 0.5 * (std::cos(std::numbers::pi * r) + 1.0); break;
      case WsdStyle::kMinusSqrt: coeff = 1.0 - std::sqrt(r); break;
    }
    return min_lr + coeff * (max_lr - min_lr);
  }
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

double LrSchedule::decoupled_lr(int64_t samples) const {
  if (!decoupled) return lr(samples);
  LrSchedule own = *this;
  own.max_lr = decoupled_max_lr;
  own.min_lr = decoupled_min_lr;
  return own.lr(samples);
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
