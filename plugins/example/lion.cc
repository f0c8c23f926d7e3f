// lion: the Lion optimizer (Chen et al. 2023, "Symbolic Discovery of Optimization
// Algorithms"), an example of a plugin built outside the megabatch tree.
//   c = b1 m + (1 - b1) g;   w <- w (1 - lr wd) - lr sign(c);   m <- b2 m + (1 - b2) g
// Weight decay applies to weights and embeddings only. One state tensor ("exp_avg").
#include <megabatch/plugin.h>

#include <cmath>
#include <vector>

namespace {

// The math, once, as a functor: multi_tensor_apply runs it over every tensor.
struct LionUpdate {
  float *w, *m;
  const float* g;
  float lr, keep, b1, b2;  // keep = 1 - lr * wd (1 for biases and norms)
  MB_HOST_DEVICE void operator()(int64_t j) const {
    const float c = b1 * m[j] + (1.0f - b1) * g[j];
    const float sign = static_cast<float>((c > 0.0f) - (c < 0.0f));
    w[j] = w[j] * keep - lr * sign;
    m[j] = b2 * m[j] + (1.0f - b2) * g[j];
  }
};

class Lion final : public megabatch::plugin::Optimizer {
 public:
  explicit Lion(const megabatch::plugin::Context& ctx)
      : Optimizer(ctx), b1_(hparam("beta1")), b2_(hparam("beta2")), wd_(hparam("weight_decay")) {
    for (size_t i = 0; i < num_params(); ++i) m_.push_back(alloc_state(i, "exp_avg"));  // host-owned, checkpointed
  }

  void step(const mb_step_info& info) override {
    const float lr = static_cast<float>(info.lr);
    std::vector<megabatch::plugin::TensorJob<LionUpdate>> jobs;
    for (size_t i = 0; i < num_params(); ++i) {
      const mb_param& p = param(i);
      const bool decay = p.role == MB_ROLE_WEIGHT || p.role == MB_ROLE_EMBEDDING;
      jobs.push_back({p.numel, {p.data, m_[i], p.grad, lr, decay ? 1.0f - lr * static_cast<float>(wd_) : 1.0f,
                                static_cast<float>(b1_), static_cast<float>(b2_)}});
    }
    megabatch::plugin::multi_tensor_apply(jobs);
    if (info.diagnostics)  // the update is lr * sign(c): its norm is lr * sqrt(nonzeros); report |w|
      for (size_t i = 0; i < num_params(); ++i) metric("weight_norm", i, std::sqrt(sum_squares(i, param(i).data)));
  }

 private:
  double b1_, b2_, wd_;
  std::vector<float*> m_;
};

const mb_hparam_spec kSchema[] = {
    {"beta1", MB_HPARAM_FLOAT, 0.9, 0.0, 1.0, "interpolation of momentum and gradient for the sign"},
    {"beta2", MB_HPARAM_FLOAT, 0.99, 0.0, 1.0, "momentum decay"},
    {"weight_decay", MB_HPARAM_FLOAT, 0.0, 0.0, 10.0, "decoupled weight decay of weights and embeddings"},
};

}  // namespace

MEGABATCH_OPTIMIZER_PLUGIN(Lion, "lion", "0.1.0", "Lion: sign of interpolated momentum (example plugin)", kSchema)
