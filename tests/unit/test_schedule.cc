// LR schedules against values worked out by hand from Megatron's definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/optim/schedule.h"
#include "core/train/options.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
using mb::optim::DecayStyle;
using nlohmann::json;

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

// WSD (Megatron's "WSD"): warmup, max_lr until the last wsd_decay_samples of the decay span,
// then each decay shape down to min_lr; here warmup 100, span 1100, decay over its last 400,
// so the decay runs from sample 700 and r = (samples - 700) / 400.
TEST(LrSchedule, WsdHoldsThePeakThenDecaysOverTheEndOfTheSpan) {
  mb::optim::LrSchedule s{1.0, 0.1, 100, 1100, DecayStyle::kWsd, 1.0, 400};
  EXPECT_DOUBLE_EQ(s.lr(50), 0.5) << "the warmup as for every style";
  EXPECT_DOUBLE_EQ(s.lr(100), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(400), 1.0) << "stable";
  EXPECT_DOUBLE_EQ(s.lr(700), 1.0) << "the decay's first sample is the next";
  EXPECT_DOUBLE_EQ(s.lr(1100), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(1101), 0.1) << "min_lr past the span";
  // r = 1/4 at sample 800, each shape's coefficient c: min_lr + 0.9 c
  const std::vector<std::pair<mb::optim::WsdStyle, double>> shapes = {
      {mb::optim::WsdStyle::kExponential, 2.0 * std::pow(0.5, 0.25) - 1.0},
      {mb::optim::WsdStyle::kLinear, 0.75},
      {mb::optim::WsdStyle::kCosine, 0.5 * (std::cos(M_PI * 0.25) + 1.0)},
      {mb::optim::WsdStyle::kMinusSqrt, 0.5},
  };
  for (const auto& [shape, c] : shapes) {
    s.wsd_style = shape;
    EXPECT_NEAR(s.lr(800), 0.1 + 0.9 * c, 1e-15) << mb::optim::wsd_style_name(shape);
    EXPECT_NEAR(s.lr(1100), 0.1, 1e-15) << mb::optim::wsd_style_name(shape) << ": every shape ends at min_lr";
  }
  s.wsd_decay_samples = 0;  // no decay: the peak to the end of the span, then min_lr
  EXPECT_DOUBLE_EQ(s.lr(1100), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(1101), 0.1);
  // --lr-warmup-init: the warmup starts there (any style)
  s.init_lr = 0.2;
  EXPECT_DOUBLE_EQ(s.lr(0), 0.2);
  EXPECT_DOUBLE_EQ(s.lr(50), 0.6);
  EXPECT_EQ(mb::optim::parse_decay_style("WSD"), DecayStyle::kWsd);
  EXPECT_STREQ(mb::optim::decay_style_name(DecayStyle::kWsd), "WSD");
  mb::testing::expect_error([] { mb::optim::parse_wsd_style("sqrt"); },
                            "lr_wsd_decay_style: unknown style 'sqrt'; use exponential, linear, cosine or minus_sqrt");
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

// Schedule options that a run would ignore, or that contradict one another, are refused with
// what to give instead, as Megatron's validate_args refuses them. Before, a warmup counted in
// samples in a run counted in iterations (a sweep's sample budget makes every point one) was
// dropped without a word: the run had no warmup. What goes together passes, defaults filled
// in or not.
TEST(LrOptions, IgnoredOrContradictoryScheduleKeysAreNamedWithWhatToGiveInstead) {
  const auto key = [](const std::string& k) { return k; };
  const std::vector<std::pair<json, std::string>> refused = {
      {{{"train_iters", 10}, {"lr_warmup_samples", 64}},
       "lr_warmup_samples counts samples, but this run counts iterations (train_iters), which would ignore it; give "
       "lr_warmup_fraction (a share of the decay span) or lr_warmup_iters instead, or train by train_samples"},
      {{{"train_iters", 10}, {"lr_decay_samples", 640}},
       "lr_decay_samples counts samples, but this run counts iterations (train_iters), which would ignore it; give "
       "lr_decay_iters instead, or train by train_samples"},
      {{{"train_samples", 640}, {"lr_warmup_iters", 2}},
       "lr_warmup_iters counts iterations, but this run counts samples (train_samples), which would ignore it; give "
       "lr_warmup_samples or lr_warmup_fraction instead, or train by train_iters"},
      {{{"train_samples", 640}, {"lr_decay_iters", 8}},
       "lr_decay_iters counts iterations, but this run counts samples (train_samples), which would ignore it; give "
       "lr_decay_samples instead, or train by train_iters"},
      {{{"train_iters", 10}, {"lr_warmup_iters", 2}, {"lr_warmup_fraction", 0.1}},
       "lr_warmup_fraction and lr_warmup_iters both set the warmup; give one of them"},
      {{{"train_samples", 640}, {"lr_warmup_samples", 64}, {"lr_warmup_fraction", 0.1}},
       "lr_warmup_fraction and lr_warmup_samples both set the warmup; give one of them"},
      {{{"train_iters", 10}, {"lr", 0.001}, {"min_lr", 0.01}},
       "min_lr (0.01) is above lr (0.001): the learning rate would rise as it decays; give a min_lr at or below lr"},
      {{{"train_iters", 10}, {"lr", 0.001}, {"lr_scaling", "none"}, {"lr_scaling_ref_batch", 256}},
       "lr_scaling_ref_batch is the batch at which lr is given for lr_scaling, which is none here, so it would do "
       "nothing; set lr_scaling to sqrt or linear, or drop it"},
      // WSD's keys: counted as the run counts, only with WSD, and its decay's length given
      {{{"train_iters", 10}, {"lr_decay_style", "WSD"}, {"lr_wsd_decay_samples", 64}},
       "lr_wsd_decay_samples counts samples, but this run counts iterations (train_iters), which would ignore it; "
       "give lr_wsd_decay_iters instead, or train by train_samples"},
      {{{"train_samples", 640}, {"lr_decay_style", "WSD"}, {"lr_wsd_decay_iters", 2}},
       "lr_wsd_decay_iters counts iterations, but this run counts samples (train_samples), which would ignore it; "
       "give lr_wsd_decay_samples instead, or train by train_iters"},
      {{{"train_iters", 10}, {"lr_wsd_decay_iters", 2}},
       "lr_wsd_decay_iters shapes the decay of lr_decay_style WSD, which this run does not use (the default, "
       "linear), so it would do nothing; set lr_decay_style WSD, or drop it"},
      {{{"train_iters", 10}, {"lr_decay_style", "cosine"}, {"lr_wsd_decay_style", "linear"}},
       "lr_wsd_decay_style shapes the decay of lr_decay_style WSD, which this run does not use (cosine), so it would "
       "do nothing; set lr_decay_style WSD, or drop it"},
      {{{"train_samples", 640}, {"lr_decay_style", "WSD"}},
       "lr_decay_style WSD decays over the last lr_wsd_decay_samples of the decay span, which is not given; give it "
       "(0: no decay before the span ends)"},
      {{{"train_iters", 10}, {"lr_warmup_init", 0.0001}},
       "lr_warmup_init is where the warmup starts, and this run has none, so it would do nothing; give a warmup "
       "(lr_warmup_iters, lr_warmup_samples or lr_warmup_fraction), or drop it"},
  };
  for (const auto& [values, message] : refused) EXPECT_EQ(mb::train::schedule_conflict(values, key), message) << values;
  // a sweep's sample budget made the points count iterations: said, and the fraction offered
  // (under one budget, the same warmup samples at every batch size)
  EXPECT_EQ(mb::train::schedule_conflict({{"train_iters", 10}, {"lr_warmup_samples", 64}}, key, "derive.sample_budget"),
            "lr_warmup_samples counts samples, but this run counts iterations (train_iters, from "
            "derive.sample_budget), which would ignore it; give lr_warmup_fraction (a share of the decay span: the "
            "same samples at every batch size) or lr_warmup_iters instead");
  const std::vector<json> accepted = {
      // train's defaults filled in: zero counts of the other kind, min_lr 0, no scaling
      {{"train_iters", 10},
       {"lr", 0.001},
       {"min_lr", 0.0},
       {"lr_warmup_iters", 2},
       {"lr_warmup_samples", 0},
       {"lr_decay_iters", 8},
       {"lr_scaling", "none"}},
      {{"train_samples", 640},
       {"lr", 0.001},
       {"min_lr", 0.001},
       {"lr_warmup_samples", 64},
       {"lr_warmup_iters", 0},
       {"lr_decay_samples", 600}},
      {{"train_iters", 10},
       {"lr", 0.001},
       {"lr_warmup_fraction", 0.1},
       {"lr_warmup_iters", 0},
       {"lr_warmup_samples", 0},
       {"lr_scaling", "sqrt"},
       {"lr_scaling_ref_batch", 256}},
      {{"train_iters", 10}, {"lr_decay_samples", nullptr}, {"lr_warmup_fraction", nullptr}},  // null: unset
      // WSD with train's defaults filled in (the default decay shape on any style; init 0 without a warmup)
      {{"train_iters", 10}, {"lr_decay_style", "WSD"}, {"lr_wsd_decay_iters", 2}, {"lr_wsd_decay_style", "cosine"}},
      {{"train_iters", 10},
       {"lr_decay_style", "linear"},
       {"lr_wsd_decay_style", "exponential"},
       {"lr_warmup_init", 0.0}},
      {{"train_samples", 640},
       {"lr_decay_style", "WSD"},
       {"lr_wsd_decay_samples", 0},
       {"lr_warmup_samples", 64},
       {"lr_warmup_init", 0.0001}},
  };
  for (const json& values : accepted) EXPECT_EQ(mb::train::schedule_conflict(values, key), "") << values;
}

// What train_options refuses of `train --micro-batch-size 4 --global-batch-size 8 --lr 1e-3`
// and `args` ("(accepted)" when nothing).
namespace {
std::string train_refusal(std::vector<std::string> args) {
  args.insert(args.begin(), {"train", "--micro-batch-size", "4", "--global-batch-size", "8", "--lr", "1e-3"});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  const auto r = mb::config::resolve(mb::train::train_schema(), static_cast<int>(argv.size()), argv.data(), 1);
  try {
    mb::train::train_options(r, mb::DType::kF32, 1, 128);
  } catch (const mb::Error& e) {
    return e.what();
  }
  return "(accepted)";
}
}  // namespace

// A warmup longer than the decay span is refused by the flags that set the two, as the run
// counts them: before, a run counted in iterations was told of samples it never gave
// ("lr warmup (80 samples) is longer than the decay span (32 samples)").
TEST(LrOptions, AWarmupLongerThanTheDecaySpanIsNamedByItsFlags) {
  EXPECT_EQ(train_refusal({"--train-iters", "4", "--lr-warmup-iters", "10"}),
            "the lr warmup (--lr-warmup-iters 10) is longer than the decay span (--train-iters 4): the decay would end "
            "before the warmup does; give a shorter warmup or a longer --lr-decay-iters");
  EXPECT_EQ(train_refusal({"--train-iters", "40", "--lr-warmup-iters", "10", "--lr-decay-iters", "6"}),
            "the lr warmup (--lr-warmup-iters 10) is longer than the decay span (--lr-decay-iters 6): the decay would "
            "end before the warmup does; give a shorter warmup or a longer --lr-decay-iters");
  EXPECT_EQ(train_refusal({"--train-samples", "64", "--lr-warmup-samples", "65"}),
            "the lr warmup (--lr-warmup-samples 65) is longer than the decay span (--train-samples 64): the decay "
            "would end before the warmup does; give a shorter warmup or a longer --lr-decay-samples");
  // as long as the span, or with a style that has no span: accepted
  EXPECT_EQ(train_refusal({"--train-iters", "4", "--lr-warmup-iters", "4"}), "(accepted)");
  EXPECT_EQ(train_refusal({"--train-iters", "4", "--lr-warmup-iters", "10", "--lr-decay-style", "constant"}),
            "(accepted)");
}

// So is a WSD decay longer than what the decay span leaves after the warmup.
TEST(LrOptions, AWsdDecayThatWouldStartDuringTheWarmupIsNamedByItsFlags) {
  EXPECT_EQ(train_refusal({"--lr-decay-style", "WSD", "--train-iters", "10", "--lr-warmup-iters", "4",
                           "--lr-wsd-decay-iters", "7"}),
            "--lr-decay-style WSD: its decay (--lr-wsd-decay-iters 7) is longer than what the decay span "
            "(--train-iters 10) leaves after the warmup (--lr-warmup-iters 4), so it would start during the warmup; "
            "give a shorter --lr-wsd-decay-iters or a shorter warmup");
  EXPECT_EQ(train_refusal({"--lr-decay-style", "WSD", "--train-samples", "80", "--lr-warmup-fraction", "0.5",
                           "--lr-wsd-decay-samples", "41"}),
            "--lr-decay-style WSD: its decay (--lr-wsd-decay-samples 41) is longer than what the decay span "
            "(--train-samples 80) leaves after the warmup (--lr-warmup-fraction 0.5), so it would start during the "
            "warmup; give a shorter --lr-wsd-decay-samples or a shorter warmup");
  EXPECT_EQ(train_refusal({"--lr-decay-style", "WSD", "--train-iters", "10", "--lr-warmup-iters", "4",
                           "--lr-wsd-decay-iters", "6"}),
            "(accepted)");
}

// Megatron's weight-decay increment (--weight-decay-incr-style) over a run of 1000 samples,
// from 0.1 to 0.5: linear and cosine by hand, end after the span, constant holds its end.
TEST(WdSchedule, LinearAndCosineFromStartToEndThenHeld) {
  using mb::optim::WdIncrStyle;
  mb::optim::WdSchedule s{WdIncrStyle::kLinear, 0.1, 0.5, 1000};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(250), 0.2);
  EXPECT_DOUBLE_EQ(s.at(500), 0.3);
  EXPECT_DOUBLE_EQ(s.at(1000), 0.5);
  EXPECT_DOUBLE_EQ(s.at(4000), 0.5);
  s.style = WdIncrStyle::kCosine;  // 0.1 + 0.4 (1 - cos(pi r)) / 2: slow at both ends
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_NEAR(s.at(250), 0.1 + 0.4 * (1 - std::sqrt(0.5)) / 2, 1e-15);
  EXPECT_NEAR(s.at(500), 0.3, 1e-15);
  EXPECT_NEAR(s.at(750), 0.1 + 0.4 * (1 + std::sqrt(0.5)) / 2, 1e-15);
  EXPECT_DOUBLE_EQ(s.at(1000), 0.5);
  // a decreasing schedule is as valid (Megatron asserts nothing about the order)
  s = {WdIncrStyle::kLinear, 0.4, 0.0, 100};
  EXPECT_DOUBLE_EQ(s.at(25), 0.3);
  s = {WdIncrStyle::kConstant, 0.05, 0.05, 0};
  EXPECT_FALSE(s.scheduled());
  EXPECT_DOUBLE_EQ(s.at(0), 0.05);
  EXPECT_DOUBLE_EQ(s.at(123456), 0.05);
  EXPECT_EQ(mb::optim::parse_wd_incr_style("cosine"), WdIncrStyle::kCosine);
  EXPECT_THROW(mb::optim::parse_wd_incr_style("exponential"), mb::Error);
}

namespace {
mb::optim::WdSchedule wd_of(std::vector<std::string> args) {
  args.insert(args.begin(), {"train", "--micro-batch-size", "4", "--global-batch-size", "8", "--lr", "1e-3"});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  const auto r = mb::config::resolve(mb::train::train_schema(), static_cast<int>(argv.size()), argv.data(), 1);
  return mb::train::train_options(r, mb::DType::kF32, 1, 128).schedule.wd;
}
}  // namespace

// The schedule spans the run in samples (Megatron's wd_incr_steps: train_iters x global batch,
// or train_samples); flags that would do nothing or contradict each other are refused by name.
TEST(WdOptions, TheScheduleSpansTheRunAndItsFlagsComeTogether) {
  auto s = wd_of({"--train-iters", "10", "--weight-decay-incr-style", "cosine", "--start-weight-decay", "0",
                  "--end-weight-decay", "0.1"});
  EXPECT_EQ(s.style, mb::optim::WdIncrStyle::kCosine);
  EXPECT_EQ(s.start, 0.0);
  EXPECT_EQ(s.end, 0.1);
  EXPECT_EQ(s.incr_samples, 80);
  s = wd_of({"--train-samples", "200", "--weight-decay-incr-style", "linear", "--start-weight-decay", "0.2",
             "--end-weight-decay", "0.05"});
  EXPECT_EQ(s.incr_samples, 200);
  EXPECT_FALSE(wd_of({"--train-iters", "10"}).scheduled());

  EXPECT_EQ(train_refusal({"--train-iters", "10", "--start-weight-decay", "0.1"}),
            "--start-weight-decay moves the weight decay over the run only with --weight-decay-incr-style linear or "
            "cosine, which is not given (constant holds --weight-decay); give the style, or drop "
            "--start-weight-decay and --end-weight-decay");
  EXPECT_EQ(train_refusal({"--train-iters", "10", "--end-weight-decay", "0.1"}).substr(0, 40),
            "--end-weight-decay moves the weight deca");
  EXPECT_EQ(train_refusal({"--train-iters", "10", "--weight-decay-incr-style", "linear", "--end-weight-decay", "0.1"}),
            "--weight-decay-incr-style linear moves the weight decay from --start-weight-decay to "
            "--end-weight-decay; give both");
  EXPECT_EQ(train_refusal({"--train-iters", "10", "--weight-decay-incr-style", "cosine", "--start-weight-decay", "0",
                           "--end-weight-decay", "0.1", "--weight-decay", "0.01"}),
            "--weight-decay-incr-style cosine sets the weight decay from --start-weight-decay to --end-weight-decay, "
            "so --weight-decay 0.01 would be ignored; drop it (null in a config or sweep file)");
  EXPECT_EQ(train_refusal({"--train-iters", "10", "--weight-decay-incr-style", "square"}),
            "weight_decay_incr_style: unknown style 'square'; use constant, linear or cosine");
  mb::testing::expect_error(
      [] {
        wd_of({"--train-iters", "10", "--weight-decay-incr-style", "linear", "--start-weight-decay", "-1",
               "--end-weight-decay", "0.1"});
      },
      "--start-weight-decay: -1.0 is out of range: start_weight_decay must be >= 0");
}
