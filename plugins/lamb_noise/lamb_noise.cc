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

class LambNoise final : public megabatch::plugins::Lamb {
 public:
  explicit LambNoise(const megabatch::plugin::Context& ctx)
      : Lamb(ctx), scale_(hparam("scale")), ref_batch_(hparam("ref_batch")), decay_(hparam("decay")) {
    for (size_t i = 0; i < num_params(); ++i)  // each step's draws: scratch on the run's device, not checkpointed
      noise_.push_back(alloc_state(i, "noise", {param(i).numel}, -1, false));
  }

 protected:
  double noise_factor(const mb_step_info& info) const override {
    const double excess = static_cast<double>(info.global_batch) / ref_batch_ - 1.0;
    if (scale_ == 0 || excess <= 0) return 0.0;
    return scale_ * std::sqrt(excess);
  }
  double noise_decay() const override { return decay_; }
  float* noise(size_t i) const override { return noise_[i]; }

 private:
  double scale_, ref_batch_, decay_;
  std::vector<float*> noise_;  // this step's standard normal draws, per tensor
};

const mb_hparam_spec kSchema[] = {
    MEGABATCH_LAMB_HPARAMS,
    {"scale", MB_HPARAM_FLOAT, 1.0, 0.0, 1e6, "noise std in units of the reference batch's extra noise"},
    {"ref_batch", MB_HPARAM_INT, 512, 1, 1e12, "batch whose noise level is restored (no noise at B <= ref_batch)"},
    {"decay", MB_HPARAM_FLOAT, 0.0, 0.0, 10.0, "noise std decays as 1 / (1 + t)^decay"},
};

}  // namespace

MEGABATCH_OPTIMIZER_PLUGIN(LambNoise, "lamb_noise", "1.2.0",
                           "LAMB with layer-wise Gaussian gradient noise restoring a reference batch's noise level",
                           kSchema)
