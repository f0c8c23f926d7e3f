// Test plugin: plain SGD that throws from step() at the step given by `fail_at`.
#include <megabatch/plugin_kit.h>

#include <stdexcept>
#include <string>

namespace {
class Throwing final : public megabatch::plugin::Optimizer {
 public:
  explicit Throwing(const megabatch::plugin::Context& ctx) : Optimizer(ctx), fail_at_(static_cast<int64_t>(hparam("fail_at"))) {}
  void step(const mb_step_info& info) override {
    if (info.step == fail_at_)
      throw std::runtime_error("deliberate failure at step " + std::to_string(info.step));
    for (size_t i = 0; i < num_params(); ++i) {
      const mb_param& p = param(i);
      for (int64_t j = 0; j < p.numel; ++j) p.data[j] -= static_cast<float>(info.lr) * p.grad[j];
    }
  }

 private:
  int64_t fail_at_;
};
const mb_hparam_spec kSchema[] = {{"fail_at", MB_HPARAM_INT, 3, 1, 1000000, "step that throws"}};
}  // namespace

MEGABATCH_OPTIMIZER_PLUGIN(Throwing, "throwing", "0.0.1", "throws from step() on purpose", kSchema)
