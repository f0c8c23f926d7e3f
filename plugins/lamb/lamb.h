// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning") with the semantics
// of NVIDIA Apex's FusedLAMB, shared by the lamb, lamb_noise and lamb_embscale plugins.
//
// Per step t, with the global gradient norm |g| the host passes in info.grad_norm:
//   c   = |g| / max_grad_norm if max_grad_norm > 0 and |g| > max_grad_norm, else 1
//   g~  = g / c  (+ Gaussian noise, lamb_noise only)
//   m   = b1 m + (1 - b1) g~;   v = b2 v + (1 - b2) g~^2          (grad averaging on)
//   u   = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * w (decoupled decay)
//   r   = |w| / |u| (1 when either is 0) for tensors with decay, or every tensor with
//         nvlamb; otherwise 1
//   w  <- w - lr * lr_multiplier * r * u
// Weight decay applies to weights and embeddings (Megatron's grouping): biases and norms
// get wd = 0 and therefore, as in Apex, no trust ratio unless nvlamb is set. wd is the
// step's (info.weight_decay): under a schedule that starts at 0 the weights too go without
// a trust ratio while it is 0, as Apex does for a group whose weight_decay is 0.
//
// Memory traffic per parameter: stage 1 reads g, m, v, w and writes m, v (24 bytes);
// stage 2 reads m, v, w, recomputes u and writes w (16 bytes). Recomputing u costs no
// more traffic than storing it, and needs no scratch buffer.
#pragma once

#include <megabatch/plugin_kit.h>

#include <cmath>
#include <vector>

namespace megabatch::plugins {

// The pre-normalization factor 1 / c from the global norm on the device.
MB_HOST_DEVICE inline float lamb_grad_scale(const double* grad_norm, double max_grad_norm) {
  const double n = *grad_norm;
  return max_grad_norm > 0 && n > max_grad_norm ? static_cast<float>(1.0 / (n / max_grad_norm)) : 1.0f;
}

// 1 / (1 - beta^t): Adam's bias correction at the step on the device.
MB_HOST_DEVICE inline float lamb_inv_bias_correction(double beta, const mb_step_values* values) {
  return static_cast<float>(1.0 / (1.0 - std::pow(beta, static_cast<double>(values->step))));
}

// Stage 1: moments, and the squared norms of the update and of the weights. With kNoise,
// the scaled gradient gets noise_factor / t^noise_decay x rms(g / c) x a standard normal
// draw, the rms from gsq (|g|^2 of this tensor over the group, on the device) and its full
// size. The step's numbers (its weight decay too) come from `values` on the device, so the
// job table is the same every step. Members ordered by size: no padding, so equal jobs have equal bytes.
template <bool kNoise>
struct LambMoments {
  const float* g;
  const float* noise;     // kNoise only: this tensor's standard normal draws
  const double* gsq;      // kNoise only
  float *m, *v;
  const float* w;
  const double* grad_norm;
  const mb_step_values* values;
  double max_grad_norm, noise_factor, noise_decay, inv_full, beta1, beta2;
  float b1, b2, eps;
  float wd;  // the table: 1 (decayed tensor) or 0; prepared(): x the step's weight decay
  float gs = 1.0f, noise_std = 0.0f, inv_bc1 = 1.0f, inv_bc2 = 1.0f;  // set by prepared() from the device values
  MB_HOST_DEVICE LambMoments prepared() const {
    LambMoments p = *this;
    p.wd = wd * static_cast<float>(values->weight_decay);
    p.gs = lamb_grad_scale(grad_norm, max_grad_norm);
    p.inv_bc1 = lamb_inv_bias_correction(beta1, values);
    p.inv_bc2 = lamb_inv_bias_correction(beta2, values);
    if constexpr (kNoise) {
      const double factor = noise_factor / std::pow(static_cast<double>(values->step), noise_decay);
      p.noise_std = static_cast<float>(factor * p.gs * std::sqrt(*gsq * inv_full));
    }
    return p;
  }
  MB_HOST_DEVICE megabatch::plugin::Sums<2> operator()(int64_t j) const {
    float gj = g[j] * gs;
    if constexpr (kNoise) gj += noise_std * noise[j];
    const float mj = b1 * m[j] + (1.0f - b1) * gj;
    const float vj = b2 * v[j] + (1.0f - b2) * gj * gj;
    m[j] = mj;
    v[j] = vj;
    const float u = (mj * inv_bc1) / (std::sqrt(vj * inv_bc2) + eps) + wd * w[j];
    return {{static_cast<double>(u) * u, static_cast<double>(w[j]) * w[j]}};
  }
};

// Stage 2: the update again from the new moments, scaled by lr x lr_multiplier x trust
// ratio, the ratio from this tensor's global norms on the device (sums: |u|^2, |w|^2),
// applied with nvlamb or where the step's weight decay of the tensor is not 0. The lr is
// values->lr, or values->decoupled_lr for the embedding (`lr_at`).
struct LambUpdate {
  const float *m, *v;
  float* w;
  const double* sums;
  const mb_step_values* values;
  const double* lr_at;
  double lr_multiplier, beta1, beta2;
  float eps;
  float wd;       // the table: 1 (decayed tensor) or 0; prepared(): x the step's weight decay
  int32_t adapt;  // the table: nvlamb; prepared(): or wd != 0
  float inv_bc1 = 1.0f, inv_bc2 = 1.0f, step_size = 0.0f;  // set by prepared()
  MB_HOST_DEVICE LambUpdate prepared() const {
    LambUpdate p = *this;
    p.wd = wd * static_cast<float>(values->weight_decay);
    p.adapt = adapt || p.wd != 0.0f ? 1 : 0;
    const double un = std::sqrt(sums[0]), wn = std::sqrt(sums[1]);
    p.inv_bc1 = lamb_inv_bias_correction(beta1, values);
    p.inv_bc2 = lamb_inv_bias_correction(beta2, values);
    p.step_size = static_cast<float>(*lr_at * lr_multiplier * (p.adapt && un > 0 && wn > 0 ? wn / un : 1.0));
    return p;
  }
  MB_HOST_DEVICE void operator()(int64_t j) const {
    const float u = (m[j] * inv_bc1) / (std::sqrt(v[j] * inv_bc2) + eps) + wd * w[j];
    w[j] -= step_size * u;
  }
};

struct SquaredGrad {  // |g|^2 per tensor (lamb_noise's rms)
  const float* g;
  MB_HOST_DEVICE megabatch::plugin::Sums<1> operator()(int64_t j) const { return {{static_cast<double>(g[j]) * g[j]}}; }
};

class Lamb : public megabatch::plugin::Optimizer {
 public:
  // elementwise, per-tensor sums through sum_shards; decays by the step's weight decay; steps
  // the embedding at the decoupled lr
  static constexpr uint32_t kFlags = MB_PLUGIN_DP_SHARDS | MB_PLUGIN_WD_SCHEDULE | MB_PLUGIN_DECOUPLED_LR;
  explicit Lamb(const megabatch::plugin::Context& ctx)
      : Optimizer(ctx),
        b1_(hparam("beta1")),
        b2_(hparam("beta2")),
        eps_(hparam("eps")),
        max_grad_norm_(hparam("max_grad_norm")),
        nvlamb_(hparam("nvlamb") != 0.0) {
    for (size_t i = 0; i < num_params(); ++i) {
      m_.push_back(alloc_state(i, "exp_avg"));
      v_.push_back(alloc_state(i, "exp_avg_sq"));
    }
  }

  void step(const mb_step_info& info) override {
    const float b1 = static_cast<float>(b1_), b2 = static_cast<float>(b2_), eps = static_cast<float>(eps_);

    const double factor = noise_factor(info);  // lamb_noise: 0 for no noise
    std::vector<megabatch::plugin::TensorSums<2>> sums;  // per tensor: |u|^2, |w|^2
    if (factor == 0.0) {
      std::vector<megabatch::plugin::TensorJob<LambMoments<false>>> jobs;
      for (size_t i = 0; i < num_params(); ++i)
        jobs.push_back({param(i).numel,
                        {param(i).grad, nullptr, nullptr, m_[i], v_[i], param(i).data, info.grad_norm, info.values,
                         max_grad_norm_, 0.0, 0.0, 0.0, b1_, b2_, b1, b2, eps, decays(i)}});
      sums.push_back(sum<2>(jobs));
    } else {
      // |g|^2 of every tensor (over the group) for its noise level, and the draws
      std::vector<megabatch::plugin::TensorJob<SquaredGrad>> sq;
      for (size_t i = 0; i < num_params(); ++i) sq.push_back({param(i).numel, {param(i).grad}});
      auto gsq = sum<1>(sq);
      sum_shards(gsq);
      std::vector<megabatch::plugin::TensorJob<LambMoments<true>>> jobs;
      for (size_t i = 0; i < num_params(); ++i) {
        host().normal(host().ctx, i, info.step, noise(i), static_cast<size_t>(param(i).numel));
        jobs.push_back({param(i).numel,
                        {param(i).grad, noise(i), gsq.data() + i, m_[i], v_[i], param(i).data, info.grad_norm,
                         info.values, max_grad_norm_, factor, noise_decay(), 1.0 / static_cast<double>(full_numel(i)),
                         b1_, b2_, b1, b2, eps, decays(i)}});
      }
      sums.push_back(sum<2>(jobs));
      if (info.diagnostics) {  // the noise std each tensor got
        double norm = 0;
        host().download(host().ctx, &norm, info.grad_norm, sizeof norm);
        const double gs = lamb_grad_scale(&norm, max_grad_norm_);
        const double at_step = factor / std::pow(static_cast<double>(info.step), noise_decay());
        const auto g2 = gsq.host();
        for (size_t i = 0; i < num_params(); ++i)
          metric("noise_std", i, static_cast<float>(at_step * gs * std::sqrt(g2[i][0] / static_cast<double>(full_numel(i)))));
      }
    }
    auto& uw = sums.back();
    sum_shards(uw);

    std::vector<megabatch::plugin::TensorJob<LambUpdate>> jobs;
    for (size_t i = 0; i < num_params(); ++i)
      jobs.push_back({param(i).numel,
                      {m_[i], v_[i], param(i).data, uw.data() + 2 * i, info.values, lr_of(i, info),
                       lr_multiplier(i, info), b1_, b2_, eps, decays(i), nvlamb_ ? 1 : 0}});
    if (info.diagnostics) {
      const auto host_sums = uw.host();
      for (size_t i = 0; i < num_params(); ++i) {
        const double update_norm = std::sqrt(host_sums[i][0]), weight_norm = std::sqrt(host_sums[i][1]);
        const bool adapt = nvlamb_ || decays(i) * static_cast<float>(info.weight_decay) != 0.0f;
        metric("trust_ratio", i, adapt && update_norm > 0 && weight_norm > 0 ? weight_norm / update_norm : 1.0);
        metric("weight_norm", i, weight_norm);
        metric("update_norm", i, update_norm);
      }
    }
    apply(jobs);
  }

 protected:
  // lamb_embscale: the factor on parameter i's learning rate (a host value: a change of it
  // costs one upload of the job table).
  virtual double lr_multiplier(size_t /*i*/, const mb_step_info& /*info*/) const { return 1.0; }
  // lamb_noise: the std of the noise is noise_factor / t^noise_decay times each tensor's
  // rms(g / c) at step t (noise_factor 0: no noise); noise(i) is the buffer for tensor i's
  // draws. The power of t is taken on the device, so the job table stays the same.
  virtual double noise_factor(const mb_step_info& /*info*/) const { return 0.0; }
  virtual double noise_decay() const { return 0.0; }
  virtual float* noise(size_t /*i*/) const { return nullptr; }

  // 1 where tensor i is decayed (weights, embeddings), else 0: the factor on the step's weight decay
  float decays(size_t i) const {
    const mb_role r = param(i).role;
    return r == MB_ROLE_WEIGHT || r == MB_ROLE_EMBEDDING ? 1.0f : 0.0f;
  }

 private:
  double b1_, b2_, eps_, max_grad_norm_;
  bool nvlamb_;
  std::vector<float*> m_, v_;
};

// The hyperparameters every LAMB variant has, with Apex FusedLAMB's defaults.
#define MEGABATCH_LAMB_HPARAMS                                                                                     \
  {"beta1", MB_HPARAM_FLOAT, 0.9, 0.0, 0.999999, "first-moment decay (--adam-beta1)"},                             \
      {"beta2", MB_HPARAM_FLOAT, 0.999, 0.0, 0.999999999, "second-moment decay (--adam-beta2)"},                   \
      {"eps", MB_HPARAM_FLOAT, 1e-6, 0.0, 1.0, "added to the denominator (--adam-eps)"},                           \
      {"weight_decay", MB_HPARAM_FLOAT, 0.01, 0.0, 10.0, "decoupled weight decay of weights and embeddings"},     \
      {"max_grad_norm", MB_HPARAM_FLOAT, 1.0, 0.0, 1e30,                                                           \
       "divide all gradients by |g| / max_grad_norm when the global norm |g| exceeds it (0: off)"},              \
      {"nvlamb", MB_HPARAM_BOOL, 0.0, 0.0, 1.0, "apply the trust ratio to every tensor, not only decayed ones"}

}  // namespace megabatch::plugins
