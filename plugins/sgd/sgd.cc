// SGD with momentum and optional Nesterov, with torch.optim.SGD's arithmetic:
//   g' = g + wd * p                   (weights and embeddings only)
//   b  = momentum * b + (1 - dampening) * g', undamped at the first step
//   d  = g' + momentum * b (Nesterov) or b;   p <- p - lr * d
// With momentum 0 this is plain SGD and no state is kept. The buffer starts at zero, so the
// first step leaves the gradient in it, as torch.optim.SGD seeds an empty buffer; a buffer from
// --pretrained-optimizer-state is decayed and carried, as a resumed torch.optim.SGD carries its.
#include <megabatch/plugin_kit.h>

#include <stdexcept>
#include <vector>

namespace {

// lr, the weight decay and the first step come from `values` on the device, so the job table
// is the same every step (`lr_at`: values->lr, or values->decoupled_lr for the embedding).
// Members ordered by size: no padding, so equal jobs have equal bytes.
template <bool kMomentum, bool kNesterov>
struct SgdUpdate {
  float* w;
  float* b;  // momentum buffer (kMomentum only)
  const float* g;
  const mb_step_values* values;
  const double* lr_at;
  float wd;  // the table: 1 (weights, embeddings) or 0 (biases, norms); prepared(): x the step's weight decay
  float mu, dampening;
  float lr = 0.0f, damp = 0.0f;  // set by prepared(): the step's lr; dampening, 0 at the first step
  float unused = 0.0f;           // fills the last 8 bytes: no padding bytes
  MB_HOST_DEVICE SgdUpdate prepared() const {
    SgdUpdate p = *this;
    p.wd = wd * static_cast<float>(values->weight_decay);
    p.lr = static_cast<float>(*lr_at);
    p.damp = values->step == 1 ? 0.0f : dampening;
    return p;
  }
  MB_HOST_DEVICE void operator()(int64_t j) const {
    const float gj = g[j] + wd * w[j];
    float d = gj;
    if constexpr (kMomentum) {
      b[j] = mu * b[j] + (1.0f - damp) * gj;
      d = kNesterov ? gj + mu * b[j] : b[j];
    }
    w[j] -= lr * d;
  }
};

class Sgd final : public megabatch::plugin::Optimizer {
 public:
  // elementwise, per-tensor sums through sum_shards; decays by the step's weight decay; steps
  // the embedding at the decoupled lr
  static constexpr uint32_t kFlags = MB_PLUGIN_DP_SHARDS | MB_PLUGIN_WD_SCHEDULE | MB_PLUGIN_DECOUPLED_LR;
  explicit Sgd(const megabatch::plugin::Context& ctx)
      : Optimizer(ctx),
        momentum_(hparam("momentum")),
        dampening_(hparam("dampening")),
        nesterov_(hparam("nesterov") != 0.0) {
    if (nesterov_ && (momentum_ <= 0.0 || dampening_ != 0.0))
      throw std::invalid_argument("sgd: nesterov needs momentum > 0 and dampening 0");
    if (momentum_ > 0.0)
      for (size_t i = 0; i < num_params(); ++i) buf_.push_back(alloc_state(i, "momentum_buffer"));
  }

  void step(const mb_step_info& info) override {
    if (momentum_ <= 0.0)
      run<false, false>(info);
    else if (nesterov_)
      run<true, true>(info);
    else
      run<true, false>(info);
  }

 private:
  template <bool kMomentum, bool kNesterov>
  void run(const mb_step_info& info) {
    std::vector<megabatch::plugin::TensorJob<SgdUpdate<kMomentum, kNesterov>>> jobs;
    for (size_t i = 0; i < num_params(); ++i) {
      const mb_param& p = param(i);
      const float decays = (p.role == MB_ROLE_WEIGHT || p.role == MB_ROLE_EMBEDDING) ? 1.0f : 0.0f;
      jobs.push_back({p.numel,
                      {p.data, kMomentum ? buf_[i] : nullptr, p.grad, info.values, lr_of(i, info), decays,
                       static_cast<float>(momentum_), static_cast<float>(dampening_)}});
    }
    apply(jobs);
  }

 private:
  double momentum_, dampening_;
  bool nesterov_;
  std::vector<float*> buf_;
};

const mb_hparam_spec kSchema[] = {
    {"momentum", MB_HPARAM_FLOAT, 0.9, 0.0, 1.0, "momentum factor (--sgd-momentum)"},
    {"dampening", MB_HPARAM_FLOAT, 0.0, 0.0, 1.0, "dampening of the momentum update"},
    {"weight_decay", MB_HPARAM_FLOAT, 0.0, 0.0, 10.0, "L2 penalty added to the gradient of weights and embeddings"},
    {"nesterov", MB_HPARAM_BOOL, 0.0, 0.0, 1.0, "Nesterov momentum"},
};

}  // namespace

MEGABATCH_OPTIMIZER_PLUGIN(Sgd, "sgd", "1.3.0", "SGD with momentum and Nesterov (torch.optim.SGD arithmetic)", kSchema)
