// What the sweep tool works out of a point's configuration and its log, against counts done by
// hand: the iterations and samples a point trains on (train's defaults, Megatron's batch ramp),
// a running point's progress from train's iteration line, and the work behind a point that the
// live table's ETA is taken from (samples, so a ramp's small early batches count as small).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sweeps/run_dir.h"
#include "sweeps/sweep_state.h"
#include "sweeps/table.h"
#include "tests/unit/test_util.h"

namespace sw = megabatch::sweeps;
using nlohmann::json;

TEST(SweepState, APointsIterationsAndSamplesAreThoseTrainRuns) {
  const json iters = {{"train_iters", 10}, {"global_batch_size", 4}};
  EXPECT_EQ(sw::iters_of(iters), 10);
  EXPECT_EQ(sw::samples_of(iters), 40);
  // whole global batches of train_samples: 7 of 8 in 63
  const json samples = {{"train_samples", 63}, {"global_batch_size", 8}};
  EXPECT_EQ(sw::iters_of(samples), 7);
  EXPECT_EQ(sw::samples_of(samples), 56);
  // without global_batch_size, train's default: micro batch x data-parallel size (4 x 2), where
  // the sweep counted batches of 1 (64 iterations)
  const json by_default = {{"train_samples", 64}, {"micro_batch_size", 4}, {"data_parallel_size", 2}};
  EXPECT_EQ(sw::global_batch_of(by_default), 8);
  EXPECT_EQ(sw::iters_of(by_default), 8);
  EXPECT_EQ(sw::global_batch_of(json{{"train_iters", 3}}), 8) << "train's default micro batch, one rank";
  // ramp 2 by 2 to 8 over 24 samples: batches 2, 2, 2, 2, 4, 4, 6, 6 (28 samples), then
  // (64 - 28) / 8 = 4 batches of 8: 12 iterations, 60 samples (not 12 x 8, nor 64)
  const json ramp = {{"train_samples", 64}, {"global_batch_size", 8}, {"rampup_batch_size", {2, 2, 24}}};
  EXPECT_EQ(sw::iters_of(ramp), 12);
  EXPECT_EQ(sw::samples_of(ramp), 60);
}

// A point without save_interval checkpoints every tenth of its iterations; with
// save_retain_interval R, at the largest divisor of R up to that (train refuses an interval
// that does not divide R); a point's own save_interval and keep_checkpoints stay.
TEST(SweepState, APointsCheckpointScheduleIsATenthOfItsIterationsDividingItsRetainInterval) {
  auto launched = [](const json& config) { return sw::launch_config(sw::Point{"p", config, {}}); };
  EXPECT_EQ(launched({{"train_iters", 100}})["save_interval"], 10);
  EXPECT_EQ(launched({{"train_iters", 100}})["keep_checkpoints"], 2);
  EXPECT_EQ(launched({{"train_iters", 100}, {"save_retain_interval", 25}})["save_interval"], 5);
  EXPECT_EQ(launched({{"train_iters", 100}, {"save_retain_interval", 40}})["save_interval"], 10);
  EXPECT_EQ(launched({{"train_iters", 100}, {"save_retain_interval", 7}})["save_interval"], 7);
  EXPECT_EQ(launched({{"train_iters", 100}, {"save_retain_interval", 13}})["save_interval"], 1);
  EXPECT_EQ(launched({{"train_iters", 100}, {"save_retain_interval", 25}, {"save_interval", 25}})["save_interval"], 25);
}

TEST(SweepState, ARunningPointsWorkIsTheSamplesItsLogSaysItConsumed) {
  megabatch::testing::TempDir tmp;
  megabatch::testing::write_text(
      tmp / "stdout.log",
      "> 12 iterations x global batch 8, ramp 2 to 8 by 2 over 24 samples\n"
      " [2026-11-28 10:00:00] iteration        5/      12 | consumed samples:           12 | elapsed time per "
      "iteration (ms): 10.0 | learning rate: 1.000000E-03 | global batch size:     4 | lm loss: 9.500000E+00 |\n"
      " [2026-11-28 10:00:01] iteration        6/      12 | consumed samples:           16 | elapsed time per "
      "iteration (ms): 10.0 | learning rate: 1.000000E-03 | global batch size:     4 | lm loss: 9.250000E+00 |\n");
  sw::PointState p;
  p.progress = sw::parse_progress(tmp / "stdout.log");
  EXPECT_EQ(p.progress.iteration, 6);
  EXPECT_EQ(p.progress.consumed, 16);
  EXPECT_DOUBLE_EQ(p.progress.loss, 9.25);
  const json ramp = {{"train_samples", 64}, {"global_batch_size", 8}, {"rampup_batch_size", {2, 2, 24}}};
  p.train_iters = sw::iters_of(ramp);
  p.global_batch = sw::global_batch_of(ramp);
  p.samples = sw::samples_of(ramp);
  p.state = sw::PointStatus::kRunning;
  EXPECT_EQ(sw::work_of(p), 16) << "6 of 12 iterations, 16 of 60 samples: not half the work";
  p.state = sw::PointStatus::kDone;
  EXPECT_EQ(sw::work_of(p), 60);
}
