#include "core/train/run_plan.h"

#include <ostream>

namespace megabatch::train {

void print_plan(const RunPlan& plan, const TrainOptions& opt, std::ostream& console) {
  const int64_t gbs = opt.global_batch_size;
  const auto& s = opt.schedule;
  const std::string layout = plan.world_size > 1 ? ", " + std::to_string(plan.world_size) + " ranks: TP " +
                                                       std::to_string(plan.tp_size) + " x DP " + std::to_string(plan.dp_size)
                                                 : std::string();
  console << "> " << plan.model << "\n"
          << "> optimizer: " << plan.optimizer << "\n"
          << "> data: " << plan.data << "\n"
          << "> " << opt.train_iters << " iterations x global batch "
          << (opt.rampup.on() ? rampup_text(opt.rampup, gbs) + " (--rampup-batch-size), then " : "") << gbs
          << " (micro batch " << opt.micro_batch_size << ", " << gbs / (opt.micro_batch_size * plan.dp_size)
          << " accumulation steps" << layout << "), lr " << s.max_lr << " " << optim::decay_style_name(s.style)
          << " to " << s.min_lr << ", warmup " << s.warmup_samples << " samples; " << plan.threads << " threads\n"
          << "> writing " << plan.metrics.string() << "; diverged when the lm loss is NaN/inf or above "
          << opt.divergence_loss << " for " << opt.divergence_intervals << " log intervals" << std::endl;
}

}  // namespace megabatch::train
