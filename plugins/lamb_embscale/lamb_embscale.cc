// lamb_embscale: LAMB whose embedding parameters (word, position, token type) learn at
//   lr x (B / ref_batch)^(alpha / 2)      (B: this step's global batch)
// or at lr x multiplier when multiplier > 0. With lr itself scaled by sqrt(B / ref) (the
// square-root rule, --lr-scaling sqrt), alpha = 1 makes embeddings scale linearly with
// the batch while every other tensor follows the square-root rule.
#include <cmath>

#include "../lamb/lamb.h"

namespace {

class LambEmbScale final : public megabatch::plugins::Lamb {
 public:
  explicit LambEmbScale(const megabatch::plugin::Context& ctx)
      : Lamb(ctx), alpha_(hparam("alpha")), ref_batch_(hparam("ref_batch")), multiplier_(hparam("multiplier")) {}

 protected:
  double lr_multiplier(size_t i, const mb_step_info& info) const override {
    if (param(i).role != MB_ROLE_EMBEDDING) return 1.0;
    if (multiplier_ > 0) return multiplier_;
    return std::pow(static_cast<double>(info.global_batch) / ref_batch_, alpha_ / 2.0);
  }

 private:
  double alpha_, ref_batch_, multiplier_;
};

const mb_hparam_spec kSchema[] = {
    MEGABATCH_LAMB_HPARAMS,
    {"alpha", MB_HPARAM_FLOAT, 1.0, -8.0, 8.0, "embedding lr x (B / ref_batch)^(alpha / 2)"},
    {"ref_batch", MB_HPARAM_INT, 512, 1, 1e12, "global batch at which embeddings use the base lr"},
    {"multiplier", MB_HPARAM_FLOAT, 0.0, 0.0, 1e6, "explicit embedding lr multiplier (0: use alpha and ref_batch)"},
};

}  // namespace

MEGABATCH_OPTIMIZER_PLUGIN(LambEmbScale, "lamb_embscale", "1.2.0",
                           "LAMB with the embedding learning rate scaled by (B / ref_batch)^(alpha / 2)", kSchema)
