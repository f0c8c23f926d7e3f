// train --profile-steps N: times N iterations by op family (core/device/profile.h), from the
// third iteration of this run (the first two warm up: allocations, plugin set-up), and
// prints the table once; a run too short to reach them says so.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>

#include "core/device/device.h"
#include "core/device/profile.h"

namespace megabatch::train {

class StepProfile {
 public:
  // steps 0: off. first_iteration: the iteration the run starts from.
  StepProfile(int64_t steps, int64_t first_iteration, Device device, std::ostream& console);
  // Before the step that makes `iteration` + 1: starts recording at the right one.
  void before_step(int64_t iteration);
  // After a step: when the N have run, `drain` (everything issued has finished) and print.
  void after_step(int64_t iteration, const std::function<void()>& drain);
  // The run ended: prints what was recorded so far, or says nothing was.
  void finish(int64_t iteration, const std::function<void()>& drain);

 private:
  void print(int64_t iteration, const std::function<void()>& drain);
  int64_t steps_, from_;
  Device device_;
  std::ostream& console_;
  std::optional<profile::Recorder> recorder_;
  bool printed_ = false;
};

}  // namespace megabatch::train
