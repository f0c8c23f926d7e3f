// AdamW (Loshchilov & Hutter 2019) with PyTorch's torch.optim.AdamW arithmetic:
//   p <- p * (1 - lr * wd)                       (decoupled decay; weights and embeddings only)
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   p <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Biases and norms get no weight decay (Megatron's default grouping).
#include <megabatch/plugin_kit.h>

#include <cmath>
#include <vector>

namespace {

// The step's lr, weight decay and bias corrections come from `values` on the device
// (prepared() once per chunk or thread), so the job table is the same every step: `lr_at`
// points at values->lr, or at values->decoupled_lr for the embedding. Members ordered by size: no
// padding, so equal jobs have equal bytes.
struct AdamWUpdate {
  float *w, *m, *v;
  const float* g;
  const mb_step_values* values;
  const double* lr_at;
  double beta1, beta2, wd;  // the table: 1 (weights, embeddings) or 0 (biases, norms); prepared(): x the step's
  float b1, b2, eps;
  float keep = 1.0f, step_size = 0.0f, bc2_sqrt = 1.0f;  // 1 - lr wd, lr / (1 - b1^t), sqrt(1 - b2^t): prepared()
  MB_HOST_DEVICE AdamWUpdate prepared() const {
    AdamWUpdate p = *this;
    const double t = static_cast<double>(values->step);
    const float lr = static_cast<float>(*lr_at);
    p.wd = wd * values->weight_decay;
    const float bc1 = static_cast<float>(1.0 - std::pow(beta1, t));
    p.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t)));
    p.keep = p.wd != 0.0 ? 1.0f - lr * static_cast<float>(p.wd) : 1.0f;
    p.step_size = lr / bc1;
    return p;
  }
  MB_HOST_DEVICE void operator()(int64_t j) const {
    const float wj = w[j] * keep;
    const float mj = b1 * m[j] + (1.0f - b1) * g[j];
    const float vj = b2 * v[j] + (1.0f - b2) * g[j] * g[j];
    m[j] = mj;
    v[j] = vj;
    w[j] = wj - step_size * mj / (std::sqrt(vj) / bc2_sqrt + eps);
  }
};

class AdamW final : public megabatch::plugin::Optimizer {
 public:
  // elementwise, per-tensor sums through sum_shards; decays by the step's weight decay; steps
  // the embedding at the decoupled lr
  static constexpr uint32_t kFlags = MB_PLUGIN_DP_SHARDS | MB_PLUGIN_WD_SCHEDULE | MB_PLUGIN_DECOUPLED_LR;
  explicit AdamW(const megabatch::plugin::Context& ctx)
      : Optimizer(ctx), b1_(hparam("beta1")), b2_(hparam("beta2")), eps_(hparam("eps")) {
    for (size_t i = 0; i < num_params(); ++i) {
      m_.push_back(alloc_state(i, "exp_avg"));
      v_.push_back(alloc_state(i, "exp_avg_sq"));
    }
  }

  void step(const mb_step_info& info) override {
    std::vector<megabatch::plugin::TensorJob<AdamWUpdate>> jobs;
    for (size_t i = 0; i < num_params(); ++i) {
      const mb_param& p = param(i);
      const bool decay = p.role == MB_ROLE_WEIGHT || p.role == MB_ROLE_EMBEDDING;
      jobs.push_back({p.numel,
                      {p.data, m_[i], v_[i], p.grad, info.values, lr_of(i, info), b1_, b2_, decay ? 1.0 : 0.0,
                       static_cast<float>(b1_), static_cast<float>(b2_), static_cast<float>(eps_)}});
    }
    apply(jobs);
  }

 private:
  double b1_, b2_, eps_;
  std::vector<float*> m_, v_;
};

const mb_hparam_spec kSchema[] = {
    {"beta1", MB_HPARAM_FLOAT, 0.9, 0.0, 0.999999, "first-moment decay (--adam-beta1)"},
    {"beta2", MB_HPARAM_FLOAT, 0.999, 0.0, 0.999999999, "second-moment decay (--adam-beta2)"},
    {"eps", MB_HPARAM_FLOAT, 1e-8, 0.0, 1.0, "added to the denominator (--adam-eps)"},
    {"weight_decay", MB_HPARAM_FLOAT, 0.01, 0.0, 10.0, "decoupled weight decay of weights and embeddings"},
};

}  // namespace

MEGABATCH_OPTIMIZER_PLUGIN(AdamW, "adamw", "1.2.0", "AdamW with PyTorch's arithmetic; no decay of biases and norms",
                           kSchema)
