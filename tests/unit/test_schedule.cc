// LR schedules against values worked out by hand from Megatron's definitions.
#include <gtest/gtest.h>

#include <cmath>

#include "core/optim/schedule.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
using mb::optim::DecayStyle;

TEST(LrSchedule, WarmupThenEachDecayStyle) {
  mb::optim::LrSchedule s{1.0, 0.1, 100, 1100, DecayStyle::kLinear, 1.0};
  EXPECT_DOUBLE_EQ(s.lr(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(50), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(100), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(600), 0.55);   // halfway: 0.1 + 0.5 * 0.9
  EXPECT_DOUBLE_EQ(s.lr(1100), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(5000), 0.1);
  s.style = DecayStyle::kCosine;
  EXPECT_NEAR(s.lr(600), 0.55, 1e-15);  // cos(pi/2) = 0
  EXPECT_NEAR(s.lr(350), 0.1 + 0.9 * 0.5 * (std::cos(M_PI * 0.25) + 1), 1e-15);
  s.style = DecayStyle::kPolynomial;
  s.power = 2.0;
  EXPECT_NEAR(s.lr(600), 0.1 + 0.9 * 0.25, 1e-15);
  s.style = DecayStyle::kConstant;
  EXPECT_DOUBLE_EQ(s.lr(5000), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(50), 0.5) << "warmup applies to constant too";
  s.style = DecayStyle::kInverseSquareRoot;
  EXPECT_NEAR(s.lr(400), 0.5, 1e-15);  // sqrt(100 / 400)
  EXPECT_NEAR(s.lr(1e6), 0.1, 1e-15);  // floored at min_lr
}

TEST(LrSchedule, ScalingRulesAndClipping) {
  EXPECT_DOUBLE_EQ(mb::optim::scaled_lr(0.01, mb::optim::LrScaling::kSqrt, 4096, 1024), 0.02);
  EXPECT_DOUBLE_EQ(mb::optim::scaled_lr(0.01, mb::optim::LrScaling::kLinear, 4096, 1024), 0.04);
  EXPECT_DOUBLE_EQ(mb::optim::scaled_lr(0.01, mb::optim::LrScaling::kNone, 4096, 0), 0.01);
  mb::testing::expect_error([] { mb::optim::scaled_lr(0.01, mb::optim::LrScaling::kSqrt, 4096, 0); },
                            "lr_scaling_ref_batch must be > 0");
  mb::testing::expect_error([] { mb::optim::parse_decay_style("cosin"); }, "unknown style 'cosin'");
  EXPECT_DOUBLE_EQ(mb::optim::clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_NEAR(mb::optim::clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-15);
  EXPECT_DOUBLE_EQ(mb::optim::clip_coefficient(4.0, 0.0), 1.0) << "0 turns clipping off";
}
