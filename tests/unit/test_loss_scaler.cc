// Megatron's dynamic loss scaler, semantics one by one (megatron/core/optimizer/
// grad_scaler.py): hysteresis counts inf steps, not consecutive ones, and is restored only
// by a full clean window; every backoff halves, never below the minimum; growth doubles
// after `window` clean steps in a row; a static scaler never moves. The expected sequences
// are written out by hand from those rules. The device op is the same function
// (test_mixed_precision.cc runs it through the trainer).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/ops/loss_scaler.h"
#include "core/ops/gradients.h"
#include "core/tensor/tensor.h"

namespace mb = megabatch;
using mb::ops::LossScalerConfig;
using mb::ops::LossScalerState;

namespace {
std::vector<float> scales(LossScalerConfig c, const std::vector<bool>& infs) {
  LossScalerState s = mb::ops::initial_scaler_state(c);
  std::vector<float> out;
  for (bool inf : infs) {
    mb::ops::update_loss_scale(s, inf, c);
    out.push_back(s.scale);
  }
  return out;
}
}  // namespace

TEST(LossScaler, HysteresisTwoHalvesOnTheSecondInfAndOnEveryLaterOne) {
  LossScalerConfig c;
  c.initial_scale = 1024;
  c.window = 1000;
  c.hysteresis = 2;
  // inf, inf, clean, inf: the first inf is tolerated, the second halves, a clean step does
  // not restore the hysteresis (no full window), so the next inf halves at once
  EXPECT_EQ(scales(c, {true, true, false, true, true}), (std::vector<float>{1024, 512, 512, 256, 128}));
}

TEST(LossScaler, AFullCleanWindowDoublesAndRestoresTheHysteresis) {
  LossScalerConfig c;
  c.initial_scale = 8;
  c.window = 3;
  c.hysteresis = 2;
  EXPECT_EQ(scales(c, {true, true, false, false, false, true, false, false, false, true, true}),
            (std::vector<float>{8, 4, 4, 4, 8, 8, 8, 8, 16, 16, 8}));
  // an inf in the middle of a window restarts the count
  EXPECT_EQ(scales(c, {false, false, true, false, false, false}), (std::vector<float>{8, 8, 8, 8, 8, 16}));
}

TEST(LossScaler, BackoffStopsAtTheMinimum) {
  LossScalerConfig c;
  c.initial_scale = 4;
  c.min_scale = 1;
  c.hysteresis = 1;
  EXPECT_EQ(scales(c, {true, true, true, true}), (std::vector<float>{2, 1, 1, 1}));
}

TEST(LossScaler, AStaticScaleNeverMoves) {
  LossScalerConfig c;
  c.dynamic = false;
  c.initial_scale = 128;
  c.window = 1;
  EXPECT_EQ(scales(c, {true, false, false, true}), (std::vector<float>{128, 128, 128, 128}));
}

TEST(LossScaler, TheOpUpdatesTheDeviceStateAsTheHostFunction) {
  LossScalerConfig c;
  c.initial_scale = 64;
  c.window = 2;
  const LossScalerState s0 = mb::ops::initial_scaler_state(c);
  mb::Tensor state = mb::from_host(std::vector<float>{s0.scale, s0.growth_tracker, s0.hysteresis_tracker}, {3});
  LossScalerState host = s0;
  for (bool inf : {false, false, true, true, false}) {
    const mb::Tensor flag = mb::from_host(std::vector<float>{inf ? 1.0f : 0.0f}, {1});
    mb::ops::loss_scaler_update(state, flag, c);
    mb::ops::update_loss_scale(host, inf, c);
    EXPECT_EQ(mb::to_host_f32(state), (std::vector<float>{host.scale, host.growth_tracker, host.hysteresis_tracker}));
  }
}

TEST(LossScaler, UnscaleFindsEveryKindOfNonFiniteGradient) {
  const mb::Tensor scaler = mb::from_host(std::vector<float>{4.0f, 0.0f, 2.0f}, {3});
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (float bad : {kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> g(70001, 8.0f);
    g[66000] = bad;
    const mb::Tensor grads = mb::from_host(g, {70001}), found({1});
    mb::ops::unscale_and_check(grads, found, scaler);
    EXPECT_EQ(found.data<float>()[0], 1.0f) << bad;
    EXPECT_EQ(grads.data<float>()[0], 2.0f) << "unscaled by 1/4";
  }
  const mb::Tensor clean = mb::from_host(std::vector<float>(100, 8.0f), {100}), found({1});
  mb::ops::unscale_and_check(clean, found, scaler);
  EXPECT_EQ(found.data<float>()[0], 0.0f);
}
