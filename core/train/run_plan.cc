#include "core/train/run_plan.h"

#include <ostream>
#include <sstream>

#include "core/util/numbers.h"

namespace megabatch::train {

namespace {
std::string as_streamed(double x) {  // as the line's other learning rates are written
  std::ostringstream os;
  os << x;
  return os.str();
}
}  // namespace

void print_plan(const RunPlan& plan, const TrainOptions& opt, std::ostream& console) {
  const int64_t gbs = opt.global_batch_size;
  const auto& s = opt.schedule;
  const std::string layout = plan.world_size > 1 ? ", " + std::to_string(plan.world_size) + " ranks: TP " +
                                                       std::to_string(plan.tp_size) + " x DP " + std::to_string(plan.dp_size)
                                                 : std::string();
  console << "> " << plan.model << "\n"
          << "> optimizer: " << plan.optimizer << "\n"
          << "> data: " << plan.data << "\n";
  if (plan.evaluation_only) {
    console << "> evaluation only (--skip-train): micro batch " << opt.micro_batch_size << layout << "; "
            << plan.threads << " threads\n"
            << "> writing " << plan.metrics.string() << " (validation/, test/)" << std::endl;
    return;
  }
  console << "> " << opt.train_iters << " iterations x global batch "
          << (opt.rampup.on() ? rampup_text(opt.rampup, gbs) + " (--rampup-batch-size), then " : "") << gbs
          << " (micro batch " << opt.micro_batch_size << ", " << gbs / (opt.micro_batch_size * plan.dp_size)
          << " accumulation steps" << layout << "), lr " << s.max_lr << " " << optim::decay_style_name(s.style)
          << (s.style == optim::DecayStyle::kWsd
                  ? " (stable until sample " + std::to_string(s.decay_samples - s.wsd_decay_samples) + ", then " +
                        optim::wsd_style_name(s.wsd_style) + " over " + std::to_string(s.wsd_decay_samples) + ")"
                  : std::string())
          << " to " << s.min_lr << ", warmup " << s.warmup_samples << " samples"
          << (s.init_lr > 0 ? " from " + shortest(s.init_lr) : std::string())
          << (s.decoupled ? ", embedding lr " + as_streamed(s.decoupled_max_lr) + " to " +
                                as_streamed(s.decoupled_min_lr) + " (--decoupled-lr)"
                          : std::string())
          << (s.wd.scheduled()
                  ? ", weight decay " + shortest(s.wd.start) + " " + optim::wd_incr_style_name(s.wd.style) + " to " +
                        shortest(s.wd.end) + " over " + std::to_string(s.wd.incr_samples) + " samples"
                  : std::string())
          << "; " << plan.threads << " threads\n"
          << "> writing " << plan.metrics.string() << "; diverged when the lm loss is NaN/inf or above "
          << opt.divergence_loss << " for " << opt.divergence_intervals << " log intervals" << std::endl;
}

}  // namespace megabatch::train
