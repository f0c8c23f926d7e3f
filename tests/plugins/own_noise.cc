// Test plugin: plain SGD that adds to every weight a shift drawn each step from a generator of
// its own (std::random_device), not from the host's Philox streams: the mistake that makes the
// data-parallel replicas of a run drift apart, each drawing other noise, which
// --check-weight-hash-across-dp-replicas-interval exists to catch. In one process it trains.
#include <megabatch/plugin_kit.h>

#include <random>
#include <vector>

namespace {
struct NoisySgd {
  float* w;
  const float* g;
  const double* lr_at;
  float shift;
  float lr = 0.0f;  // set by prepared()
  MB_HOST_DEVICE NoisySgd prepared() const {
    NoisySgd p = *this;
    p.lr = static_cast<float>(*lr_at);
    return p;
  }
  MB_HOST_DEVICE void operator()(int64_t j) const { w[j] -= lr * g[j] + shift; }
};

class OwnNoise final : public megabatch::plugin::Optimizer {
 public:
  explicit OwnNoise(const megabatch::plugin::Context& ctx) : Optimizer(ctx) {}
  void step(const mb_step_info& info) override {
    const float shift = std::uniform_real_distribution<float>(-1e-4f, 1e-4f)(rng_);
    std::vector<megabatch::plugin::TensorJob<NoisySgd>> jobs;
    for (size_t i = 0; i < num_params(); ++i)
      jobs.push_back({param(i).numel, {param(i).data, param(i).grad, lr_of(i, info), shift}});
    apply(jobs);
  }

 private:
  std::mt19937 rng_{std::random_device{}()};
};
const mb_hparam_spec kSchema[] = {{"weight_decay", MB_HPARAM_FLOAT, 0, 0, 10, "not applied"}};
}  // namespace

MEGABATCH_OPTIMIZER_PLUGIN(OwnNoise, "own_noise", "0.0.1", "SGD with noise from a generator of its own (a mistake)",
                           kSchema)
