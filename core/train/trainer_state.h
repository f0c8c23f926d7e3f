// The training loop's own fields of a checkpoint (its 'trainer' attribute): where the
// optimizer's step count and the LR schedule are, the fp16 loss scaler, the noise-scale
// averages and the skipped steps; written by Trainer::save_checkpoint and read back,
// field by field, by Trainer::restore.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/io/checkpoint.h"
#include "core/ops/loss_scaler.h"
#include "core/optim/mixed_precision.h"
#include "core/optim/schedule.h"
#include "core/train/noise_scale.h"

namespace megabatch::train {

struct TrainerState {
  optim::StepCounts counts;
  int64_t skipped_iterations = 0;
  std::optional<ops::LossScalerState> loss_scaler;  // absent in checkpoints from before loss scaling
  std::optional<nlohmann::json> noise_scale;        // NoiseScaleEstimator::state(), checked
  std::optional<optim::LrSchedule> schedule;        // the LR schedule's settings (absent in older checkpoints)
  bool schedule_has_wd = false;  // schedule->wd was saved (checkpoints before weight-decay schedules: not)
};

// The 'trainer' attribute of a checkpoint. The LR schedule's settings, with the weight
// decay's, and its current learning rate and weight decay are stored too (pure functions of
// the counts and these settings), so that a checkpoint says which schedule produced it.
nlohmann::json trainer_state_json(const optim::MixedPrecisionOptimizer& optimizer, const NoiseScaleEstimator& noise,
                                  int64_t skipped_iterations);

// Reads it back from `state` (io::read_checkpoint_state). A checkpoint from before a field
// gets its meaning then (every iteration an optimizer step); a hand-edited or damaged field
// is refused naming the file and the field.
TrainerState read_trainer_state(const io::CheckpointState& state);

}  // namespace megabatch::train
