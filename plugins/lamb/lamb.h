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
// get wd = 0 and therefore, as in Apex, no trust ratio unless nvlamb is set.
//
// Memory traffic per parameter: stage 1 reads g, m, v, w and writes m, v (24 bytes);
// stage 2 reads m, v, w, recomputes u and writes w (16 bytes). Recomputing u costs no
// more traffic than storing it, and needs no scratch buffer.
#pragma once

#include <megabatch/plugin.h>

#include <cmath>
#include <vector>

namespace megabatch::plugins {

// Stage 1: moments, and the squared norms of the update and of the weights.
template <bool kNoise>
struct LambMoments {
  const float* g;
  const float* noise;  // kNoise only: standard normal draws for this tensor
  float *m, *v;
  const float* w;
  float grad_scale, noise_std, b1, b2, inv_bc1, inv_bc2, eps, wd;
  MB_HOST_DEVICE megabatch::plugin::Sums<2> operator()(int64_t j) const {
    float gj = g[j] * grad_scale;
    if constexpr (kNoise) gj += noise_std * noise[j];
    const float mj = b1 * m[j] + (1.0f - b1) * gj;
    const float vj = b2 * v[j] + (1.0f - b2) * gj * gj;
    m[j] = mj;
    v[j] = vj;
    const float u = (mj * inv_bc1) / (std::sqrt(vj * inv_bc2) + eps) + wd * w[j];
    return {{static_cast<double>(u) * u, static_cast<double>(w[j]) * w[j]}};
  }
};

// Stage 2: the update again from the new moments, scaled by lr x trust ratio.
struct LambUpdate {
  const float *m, *v;
  float* w;
  float inv_bc1, inv_bc2, eps, wd, step_size;
  MB_HOST_DEVICE void operator()(int64_t j) const {
    const float u = (m[j] * inv_bc1) / (std::sqrt(v[j] * inv_bc2) + eps) + wd * w[j];
    w[j] -= step_size * u;
  }
};

class Lamb : public megabatch::plugin::Optimizer {
 public:
  explicit Lamb(const megabatch::plugin::Context& ctx)
      : Optimizer(ctx), b1_(hparam("beta1")), b2_(hparam("beta2")), eps_(hparam("eps")), wd_(hparam("weight_decay")),
        max_grad_norm_(hparam("max_grad_norm")), nvlamb_(hparam("nvlamb") != 0.0) {
    for (size_t i = 0; i < num_params(); ++i) {
      m_.push_back(alloc_state(i, "exp_avg"));
      v_.push_back(alloc_state(i, "exp_avg_sq"));
    }
  }

  void step(const mb_step_info& info) override {
    const double t = static_cast<double>(info.step);
    const float inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(b1_, t)));
    const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(b2_, t)));
    const float b1 = static_cast<float>(b1_), b2 = static_cast<float>(b2_), eps = static_cast<float>(eps_);
    const double clip = max_grad_norm_ > 0 && info.grad_norm > max_grad_norm_ ? info.grad_norm / max_grad_norm_ : 1.0;
    const float grad_scale = static_cast<float>(1.0 / clip);

    const std::vector<float> noise_std = noise_stds(info, grad_scale);
    std::vector<std::array<double, 2>> sums;  // per tensor: |u|^2, |w|^2
    if (noise_std.empty()) {
      std::vector<megabatch::plugin::TensorJob<LambMoments<false>>> jobs;
      for (size_t i = 0; i < num_params(); ++i)
        jobs.push_back({param(i).numel, {param(i).grad, nullptr, m_[i], v_[i], param(i).data, grad_scale, 0.0f, b1, b2,
                                         inv_bc1, inv_bc2, eps, decay(i)}});
      sums = megabatch::plugin::multi_tensor_sum<2>(jobs);
    } else {
      std::vector<megabatch::plugin::TensorJob<LambMoments<true>>> jobs;
      for (size_t i = 0; i < num_params(); ++i)
        jobs.push_back({param(i).numel, {param(i).grad, noise(i), m_[i], v_[i], param(i).data, grad_scale,
                                         noise_std[i], b1, b2, inv_bc1, inv_bc2, eps, decay(i)}});
      sums = megabatch::plugin::multi_tensor_sum<2>(jobs);
    }
    tp_sum_sharded(sums);

    std::vector<megabatch::plugin::TensorJob<LambUpdate>> jobs;
    for (size_t i = 0; i < num_params(); ++i) {
      const double update_norm = std::sqrt(sums[i][0]), weight_norm = std::sqrt(sums[i][1]);
      const bool adapt = nvlamb_ || decay(i) != 0.0f;
      const double ratio = adapt && update_norm > 0 && weight_norm > 0 ? weight_norm / update_norm : 1.0;
      const double lr = info.lr * lr_multiplier(i, info);
      jobs.push_back({param(i).numel, {m_[i], v_[i], param(i).data, inv_bc1, inv_bc2, eps, decay(i),
                                       static_cast<float>(lr * ratio)}});
      if (info.diagnostics) {
        metric("trust_ratio", i, ratio);
        metric("weight_norm", i, weight_norm);
        metric("update_norm", i, update_norm);
        if (!noise_std.empty()) metric("noise_std", i, noise_std[i]);
      }
    }
    megabatch::plugin::multi_tensor_apply(jobs);
  }

 protected:
  // lamb_embscale: the factor on parameter i's learning rate.
  virtual double lr_multiplier(size_t /*i*/, const mb_step_info& /*info*/) const { return 1.0; }
  // lamb_noise: per tensor, the std of the Gaussian noise added to the scaled gradient
  // (g / c); empty for no noise. Also draws the noise that noise(i) returns.
  virtual std::vector<float> noise_stds(const mb_step_info& /*info*/, float /*grad_scale*/) { return {}; }
  virtual const float* noise(size_t /*i*/) const { return nullptr; }

  float decay(size_t i) const {
    const mb_role r = param(i).role;
    return r == MB_ROLE_WEIGHT || r == MB_ROLE_EMBEDDING ? static_cast<float>(wd_) : 0.0f;
  }

 private:
  double b1_, b2_, eps_, wd_, max_grad_norm_;
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
