// SGD with momentum and optional Nesterov, with torch.optim.SGD's arithmetic:
//   g' = g + wd * p                   (weights and embeddings only)
//   b  = g' at the first step, then momentum * b + (1 - dampening) * g'
//   d  = g' + momentum * b (Nesterov) or b;   p <- p - lr * d
// With momentum 0 this is plain SGD and no state is kept.
#include <megabatch/plugin.h>

#include <stdexcept>
#include <vector>

namespace {

class Sgd final : public megabatch::plugin::Optimizer {
 public:
  explicit Sgd(const megabatch::plugin::Context& ctx)
      : Optimizer(ctx), momentum_(hparam("momentum")), dampening_(hparam("dampening")),
        wd_(hparam("weight_decay")), nesterov_(hparam("nesterov") != 0.0) {
    if (nesterov_ && (momentum_ <= 0.0 || dampening_ != 0.0))
      throw std::invalid_argument("sgd: nesterov needs momentum > 0 and dampening 0");
    if (momentum_ > 0.0)
      for (size_t i = 0; i < num_params(); ++i) buf_.push_back(alloc_state(i, "momentum_buffer"));
  }

  void step(const mb_step_info& info) override {
    const float lr = static_cast<float>(info.lr), mu = static_cast<float>(momentum_);
    const float damp = info.step == 1 ? 0.0f : static_cast<float>(dampening_);
    const bool first = info.step == 1, nesterov = nesterov_, momentum = momentum_ > 0.0;
    for (size_t i = 0; i < num_params(); ++i) {
      const mb_param& p = param(i);
      const float wd = (p.role == MB_ROLE_WEIGHT || p.role == MB_ROLE_EMBEDDING) ? static_cast<float>(wd_) : 0.0f;
      float* w = p.data;
      float* b = momentum ? buf_[i] : nullptr;
      const float* g = p.grad;
      megabatch::plugin::for_each(p.numel, [&](int64_t j) {
        const float gj = g[j] + wd * w[j];
        float d = gj;
        if (momentum) {
          b[j] = first ? gj : mu * b[j] + (1.0f - damp) * gj;
          d = nesterov ? gj + mu * b[j] : b[j];
        }
        w[j] -= lr * d;
      });
    }
  }

 private:
  double momentum_, dampening_, wd_;
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

MEGABATCH_OPTIMIZER_PLUGIN(Sgd, "sgd", "1.0.0", "SGD with momentum and Nesterov (torch.optim.SGD arithmetic)", kSchema)
