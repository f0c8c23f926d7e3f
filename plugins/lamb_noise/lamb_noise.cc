// lamb_noise: LAMB with layer-wise Gaussian gradient noise. Before the moment update,
// each tensor l's (pre-normalized) gradient g~_l gets noise of standard deviation
//   sigma_l = scale * rms(g~_l) * sqrt(max(0, B / ref_batch - 1)) / (1 + t)^decay
// where B is the step's global batch, t = step - 1 (0 at the first step) and rms is over
// the full (unsharded) tensor. A batch of B samples has B / ref_batch times less gradient
// variance than one of ref_batch; this noise gives each tensor back, at scale 1, roughly
// the noise level of the smaller reference batch. The draws come from the host's
// counter-based RNG, keyed by (seed, step, tensor, element of the full tensor): the same
// on any thread count and any tensor-parallel layout.
#include <cmath>

#include "../lamb/lamb.h"

namespace {

struct SquaredGrad {  // |g|^2 per tensor
  const float* g;
  MB_HOST_DEVICE megabatch::plugin::Sums<1> operator()(int64_t j) const { return {{static_cast<double>(g[j]) * g[j]}}; }
};

class LambNoise final : public megabatch::plugins::Lamb {
 public:
  explicit LambNoise(const megabatch::plugin::Context& ctx)
      : Lamb(ctx), scale_(hparam("scale")), ref_batch_(hparam("ref_batch")), decay_(hparam("decay")) {
    int64_t total = 0;
    for (size_t i = 0; i < num_params(); ++i) {
      offset_.push_back(total);
      total += param(i).numel;
    }
    noise_.resize(static_cast<size_t>(total));
  }

 protected:
  std::vector<float> noise_stds(const mb_step_info& info, float grad_scale) override {
    const double excess = static_cast<double>(info.global_batch) / ref_batch_ - 1.0;
    if (scale_ == 0 || excess <= 0) return {};
    const double factor = scale_ * std::sqrt(excess) / std::pow(static_cast<double>(info.step), decay_);
    std::vector<megabatch::plugin::TensorJob<SquaredGrad>> jobs;
    for (size_t i = 0; i < num_params(); ++i) jobs.push_back({param(i).numel, {param(i).grad}});
    auto sums = megabatch::plugin::multi_tensor_sum<1>(jobs);
    tp_sum_sharded(sums);
    std::vector<float> stds(num_params());
    for (size_t i = 0; i < num_params(); ++i) {
      const double rms = grad_scale * std::sqrt(sums[i][0] / static_cast<double>(full_numel(i)));
      stds[i] = static_cast<float>(factor * rms);
      host().normal(host().ctx, i, info.step, noise_.data() + offset_[i], static_cast<size_t>(param(i).numel));
    }
    return stds;
  }
  const float* noise(size_t i) const override { return noise_.data() + offset_[i]; }

 private:
  double scale_, ref_batch_, decay_;
  std::vector<int64_t> offset_;
  std::vector<float> noise_;  // this step's standard normal draws, all tensors
};

const mb_hparam_spec kSchema[] = {
    MEGABATCH_LAMB_HPARAMS,
    {"scale", MB_HPARAM_FLOAT, 1.0, 0.0, 1e6, "noise std in units of the reference batch's extra noise"},
    {"ref_batch", MB_HPARAM_INT, 512, 1, 1e12, "batch whose noise level is restored (no noise at B <= ref_batch)"},
    {"decay", MB_HPARAM_FLOAT, 0.0, 0.0, 10.0, "noise std decays as 1 / (1 + t)^decay"},
};

}  // namespace

MEGABATCH_OPTIMIZER_PLUGIN(LambNoise, "lamb_noise", "1.0.0",
                           "LAMB with layer-wise Gaussian gradient noise restoring a reference batch's noise level",
                           kSchema)
