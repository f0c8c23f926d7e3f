// Megatron-LM's gradient scalers (megatron/core/optimizer/grad_scaler.py) as
// device-independent logic: the same update runs on the host for a CPU run and in a
// one-thread kernel for a GPU run (ops::loss_scaler_update, gradients.h), so the scale
// never has to travel to the host.
//
// fp16 training multiplies the loss by `scale` before backward; an iteration whose
// gradients are not all finite is skipped (no optimizer step) and updates the scaler:
//   dynamic: an inf step resets the growth tracker and counts down the hysteresis tracker;
//            once that reaches 0 the scale is multiplied by backoff (0.5), never below
//            min_scale (so with hysteresis 2 the second inf step halves the scale, and every
//            later one halves it again, until a clean window restores the hysteresis).
//            A clean step counts up the growth tracker; after `window` clean steps in a row
//            the scale is multiplied by growth (2) and the hysteresis tracker is reset.
//   static (--loss-scale S): the scale stays S; inf steps are still skipped.
#pragma once

#include <cstdint>

#include "core/util/host_device.h"


namespace megabatch::ops {

struct LossScalerConfig {
  bool dynamic = true;
  float initial_scale = 4294967296.0f;  // 2^32 (--initial-loss-scale)
  float min_scale = 1.0f;               // --min-loss-scale
  int32_t window = 1000;                // --loss-scale-window
  int32_t hysteresis = 2;               // --hysteresis
  float growth = 2.0f, backoff = 0.5f;
};

// The scaler's state, as three floats (the form it takes on the device and in checkpoints).
struct LossScalerState {
  float scale = 1.0f;
  float growth_tracker = 0.0f;      // clean steps since the last inf step or growth
  float hysteresis_tracker = 0.0f;  // inf steps still tolerated before a backoff
};

inline LossScalerState initial_scaler_state(const LossScalerConfig& c) {
  return {c.initial_scale, 0.0f, static_cast<float>(c.hysteresis)};
}

MB_HOST_DEVICE inline void update_loss_scale(LossScalerState& s, bool found_inf, const LossScalerConfig& c) {
  if (!c.dynamic) return;
  if (found_inf) {
    s.growth_tracker = 0.0f;
    s.hysteresis_tracker -= 1.0f;
    if (s.hysteresis_tracker <= 0.0f) {
      const float backed = s.scale * c.backoff;
      s.scale = backed > c.min_scale ? backed : c.min_scale;
    }
  } else {
    s.growth_tracker += 1.0f;
    if (s.growth_tracker >= static_cast<float>(c.window)) {
      s.growth_tracker = 0.0f;
      s.hysteresis_tracker = static_cast<float>(c.hysteresis);
      s.scale *= c.growth;
    }
  }
}

}  // namespace megabatch::ops
