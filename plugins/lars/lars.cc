// lars: layer-wise adaptive rate scaling (You, Gitman & Ginsburg 2017, Algorithm 1) with
// momentum. Per tensor, with weight decay wd and trust coefficient eta:
//   local = eta * |w| / (|g| + wd * |w| + eps)   (1 when |w| or |g| is 0)
//   v <- momentum * v + lr * local * (g + wd * w);   w <- w - v
// Biases and norms are excluded: local = 1 and no weight decay (plain momentum SGD).
// Norms of sharded tensors are summed over the tensor-parallel group.
#include <megabatch/plugin_kit.h>

#include <cmath>
#include <vector>

namespace {

struct SquaredNorms {  // |w|^2, |g|^2
  const float *w, *g;
  MB_HOST_DEVICE megabatch::plugin::Sums<2> operator()(int64_t j) const {
    return {{static_cast<double>(w[j]) * w[j], static_cast<double>(g[j]) * g[j]}};
  }
};

// The local lr comes from this tensor's global norms on the device (sums: |w|^2, |g|^2).
// The step's lr and weight decay come from `values` on the device, so the job table is the
// same every step (`lr_at`: values->lr, or values->decoupled_lr for the embedding).
// Members ordered by size: no padding, so equal jobs have equal bytes.
struct LarsUpdate {
  float* w;
  const float* g;
  float* v;
  const double* sums;
  const mb_step_values* values;
  const double* lr_at;
  double eta, eps;
  float momentum;
  int32_t adapt;  // weights and embeddings: trust ratio and decay; biases and norms: plain momentum SGD
  float step_size = 0.0f, decay = 0.0f;  // set by prepared() from the norms and the step's lr
  MB_HOST_DEVICE LarsUpdate prepared() const {
    LarsUpdate p = *this;
    const double wd = values->weight_decay;
    const double wn = std::sqrt(sums[0]), gn = std::sqrt(sums[1]);
    const double local = adapt && wn > 0 && gn > 0 ? eta * wn / (gn + wd * wn + eps) : 1.0;
    p.step_size = static_cast<float>(*lr_at * local);
    p.decay = adapt ? static_cast<float>(wd) : 0.0f;
    return p;
  }
  MB_HOST_DEVICE void operator()(int64_t j) const {
    const float vj = momentum * v[j] + step_size * (g[j] + decay * w[j]);
    v[j] = vj;
    w[j] -= vj;
  }
};

class Lars final : public megabatch::plugin::Optimizer {
 public:
  // elementwise, per-tensor sums through sum_shards; decays by the step's weight decay; steps
  // the embedding at the decoupled lr
  static constexpr uint32_t kFlags = MB_PLUGIN_DP_SHARDS | MB_PLUGIN_WD_SCHEDULE | MB_PLUGIN_DECOUPLED_LR;
  explicit Lars(const megabatch::plugin::Context& ctx)
      : Optimizer(ctx), momentum_(hparam("momentum")), eta_(hparam("trust_coefficient")), eps_(hparam("eps")) {
    for (size_t i = 0; i < num_params(); ++i) v_.push_back(alloc_state(i, "momentum_buffer"));
  }

  void step(const mb_step_info& info) override {
    std::vector<megabatch::plugin::TensorJob<SquaredNorms>> norms;
    for (size_t i = 0; i < num_params(); ++i) norms.push_back({param(i).numel, {param(i).data, param(i).grad}});
    auto sums = sum<2>(norms);
    sum_shards(sums);
    std::vector<megabatch::plugin::TensorJob<LarsUpdate>> jobs;
    for (size_t i = 0; i < num_params(); ++i) {
      const mb_param& p = param(i);
      const bool adapt = p.role == MB_ROLE_WEIGHT || p.role == MB_ROLE_EMBEDDING;
      jobs.push_back({p.numel,
                      {p.data, p.grad, v_[i], sums.data() + 2 * i, info.values, lr_of(i, info), eta_, eps_,
                       static_cast<float>(momentum_), adapt ? 1 : 0}});
    }
    if (info.diagnostics) {  // before the update: the norms the step used
      const auto host = sums.host();
      for (size_t i = 0; i < num_params(); ++i) {
        const mb_param& p = param(i);
        const bool adapt = p.role == MB_ROLE_WEIGHT || p.role == MB_ROLE_EMBEDDING;
        const double wn = std::sqrt(host[i][0]), gn = std::sqrt(host[i][1]);
        metric("trust_ratio", i, adapt && wn > 0 && gn > 0 ? eta_ * wn / (gn + info.weight_decay * wn + eps_) : 1.0);
        metric("weight_norm", i, wn);
        metric("grad_norm", i, gn);
      }
    }
    apply(jobs);
  }

 private:
  double momentum_, eta_, eps_;
  std::vector<float*> v_;
};

const mb_hparam_spec kSchema[] = {
    {"momentum", MB_HPARAM_FLOAT, 0.9, 0.0, 1.0, "momentum (--sgd-momentum)"},
    {"trust_coefficient", MB_HPARAM_FLOAT, 0.001, 0.0, 1e3, "eta: local lr = eta |w| / (|g| + wd |w| + eps)"},
    {"weight_decay", MB_HPARAM_FLOAT, 0.0, 0.0, 10.0, "weight decay of weights and embeddings (--weight-decay)"},
    {"eps", MB_HPARAM_FLOAT, 0.0, 0.0, 1.0, "added to the local-lr denominator"},
};

}  // namespace

MEGABATCH_OPTIMIZER_PLUGIN(Lars, "lars", "1.2.0",
                           "LARS: momentum SGD with a layer-wise trust ratio; biases and norms excluded", kSchema)
