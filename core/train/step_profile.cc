#include "core/train/step_profile.h"

#include <ostream>

#include "core/train/train_options.h"

namespace megabatch::train {

StepProfile::StepProfile(int64_t steps, int64_t first_iteration, Device device, std::ostream& console)
    : steps_(steps), from_(first_iteration + kProfileWarmup), device_(device), console_(console) {}

void StepProfile::before_step(int64_t iteration) {
  if (steps_ > 0 && iteration == from_) recorder_.emplace(device_);
}

void StepProfile::after_step(int64_t iteration, const std::function<void()>& drain) {
  if (recorder_ && iteration - from_ == steps_) print(iteration, drain);
}

void StepProfile::finish(int64_t iteration, const std::function<void()>& drain) {
  if (recorder_) print(iteration, drain);  // the run ended first: the iterations it had
  if (steps_ > 0 && !printed_)
    console_ << " warning: --profile-steps " << steps_ << ": nothing was profiled, the run ended within "
             << "its first " << kProfileWarmup << " iterations (warm-up); ask for more --train-iters" << std::endl;
}

void StepProfile::print(int64_t iteration, const std::function<void()>& drain) {
  drain();
  console_ << profile::format(recorder_->stop(iteration - from_)) << std::flush;
  recorder_.reset();
  printed_ = true;
}

}  // namespace megabatch::train
