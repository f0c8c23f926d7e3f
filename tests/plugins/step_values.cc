// Test plugin: plain SGD whose learning rate comes only through info.values (the decoupled
// one for the embedding), and which reports, as diagnostics every step, what the host gave it:
//   values_step, values_lr, values_batch,  *info.values
//   values_wd, values_dlr
//   info_wd, info_dlr                      info.weight_decay, info.decoupled_lr
//   embedding_or_output                    per parameter: its mb_param.embedding_or_output
//   grad_norm                              *info.grad_norm
//   values_moved                           1 when info.values or info.grad_norm has another
//                                          address than at the step before
//   scratch_moved                          1 when this step's scratch requests (the same
//                                          sizes in the same order every step) got other
//                                          addresses than at the step before
// Everything is read through host->download, so it runs wherever the host's memory is.
#include <megabatch/plugin_kit.h>

#include <vector>

namespace {
struct Sgd {
  float* w;
  const float* g;
  const double* lr_at;
  float lr = 0.0f;  // set by prepared()
  float unused = 0.0f;
  MB_HOST_DEVICE Sgd prepared() const {
    Sgd p = *this;
    p.lr = static_cast<float>(*lr_at);
    return p;
  }
  MB_HOST_DEVICE void operator()(int64_t j) const { w[j] -= lr * g[j]; }
};

class StepValues final : public megabatch::plugin::Optimizer {
 public:
  // takes a weight-decay schedule (and reports it; decays nothing) and a decoupled lr
  static constexpr uint32_t kFlags = MB_PLUGIN_WD_SCHEDULE | MB_PLUGIN_DECOUPLED_LR;
  explicit StepValues(const megabatch::plugin::Context& ctx) : Optimizer(ctx) {}
  void step(const mb_step_info& info) override {
    mb_step_values v{};
    host().download(host().ctx, &v, info.values, sizeof v);
    double norm = 0;
    host().download(host().ctx, &norm, info.grad_norm, sizeof norm);
    const std::vector<void*> scratch = {host().scratch(host().ctx, 100), host().scratch(host().ctx, 5000),
                                        host().scratch(host().ctx, 8)};
    metric("values_step", 0, static_cast<double>(v.step));
    metric("values_lr", 0, v.lr);
    metric("values_batch", 0, static_cast<double>(v.global_batch));
    metric("values_wd", 0, v.weight_decay);
    metric("info_wd", 0, info.weight_decay);
    metric("values_dlr", 0, v.decoupled_lr);
    metric("info_dlr", 0, info.decoupled_lr);
    for (size_t i = 0; i < num_params(); ++i) metric("embedding_or_output", i, param(i).embedding_or_output);
    metric("grad_norm", 0, norm);
    metric("values_moved", 0, last_values_ && (last_values_ != info.values || last_norm_ != info.grad_norm) ? 1 : 0);
    metric("scratch_moved", 0, !last_scratch_.empty() && last_scratch_ != scratch ? 1 : 0);
    last_values_ = info.values;
    last_norm_ = info.grad_norm;
    last_scratch_ = scratch;
    std::vector<megabatch::plugin::TensorJob<Sgd>> jobs;
    for (size_t i = 0; i < num_params(); ++i)
      jobs.push_back({param(i).numel, {param(i).data, param(i).grad, lr_of(i, info)}});
    apply(jobs);
  }

 private:
  const mb_step_values* last_values_ = nullptr;
  const double* last_norm_ = nullptr;
  std::vector<void*> last_scratch_;
};
const mb_hparam_spec kSchema[] = {{"unused", MB_HPARAM_FLOAT, 0, 0, 1, "no effect"},
                                  {"weight_decay", MB_HPARAM_FLOAT, 0, 0, 10, "reported, not applied"}};
}  // namespace

MEGABATCH_OPTIMIZER_PLUGIN(StepValues, "step_values", "0.0.1", "reports the step's values and their addresses", kSchema)
