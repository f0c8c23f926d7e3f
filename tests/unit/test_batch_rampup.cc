// Megatron's batch-size ramp-up (core/train/batch_rampup.h) against the rule and the
// iteration count written out here in their plainest form: the stage of c samples found by
// counting the stage starts it has passed, and Megatron's one-iteration-at-a-time loop.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/train/batch_rampup.h"
#include "core/util/error.h"

namespace mb = megabatch;
using mb::train::BatchRampup;

namespace {
struct Case {
  BatchRampup ramp;
  int64_t final_batch;
};

// Stage k of n starts at the first c with c * n >= k * samples: the batch after c samples is
// start + (the stages 1..n whose start c has reached) x increment, the final batch past the ramp.
int64_t batch_by_counting(const Case& t, int64_t consumed) {
  if (consumed > t.ramp.samples) return t.final_batch;
  const int64_t n = (t.final_batch - t.ramp.start) / t.ramp.increment;
  int64_t passed = 0;
  for (int64_t k = 1; k <= n; ++k) passed += consumed * n >= k * t.ramp.samples;
  return t.ramp.start + passed * t.ramp.increment;
}

// Megatron's update_train_iters for a ramp: one iteration at a time while the samples before it
// are within the ramp and the run, then whole final batches of the rest.
int64_t iterations_one_at_a_time(const Case& t, int64_t train_samples) {
  int64_t consumed = 0, iterations = 0;
  while (consumed <= t.ramp.samples && consumed <= train_samples) {
    consumed += batch_by_counting(t, consumed);
    ++iterations;
  }
  if (train_samples > consumed) iterations += (train_samples - consumed) / t.final_batch;
  return iterations;
}

const std::vector<Case> kCases = {
    {{2, 2, 24}, 8},      // 3 increments of 8 samples each
    {{32, 32, 1000}, 256},  // 7 increments over 1000 samples: stage starts at non-integer multiples
    {{4, 4, 10}, 16},     // 3 increments over 10 samples: 10 / 3 is not a double's exact quotient
    {{8, 8, 5}, 64},      // more increments than samples: stages of no sample are skipped
    {{1, 1, 1}, 2},
    {{16, 48, 7777}, 304},
};
}  // namespace

TEST(BatchRampup, TheBatchAfterEachSampleCountFollowsMegatronsRule) {
  for (const Case& t : kCases) {
    for (int64_t c = 0; c <= t.ramp.samples + 3 * t.final_batch; ++c)
      ASSERT_EQ(mb::train::global_batch_at(t.ramp, t.final_batch, c), batch_by_counting(t, c))
          << mb::train::rampup_text(t.ramp, t.final_batch) << ", after " << c << " samples";
    // the ramp's first and last stage: the start, and the final batch once the ramp is done
    EXPECT_EQ(mb::train::global_batch_at(t.ramp, t.final_batch, 0), t.ramp.start);
    EXPECT_EQ(mb::train::global_batch_at(t.ramp, t.final_batch, t.ramp.samples), t.final_batch);
  }
  // Without a ramp, the final batch from the start.
  EXPECT_EQ(mb::train::global_batch_at(BatchRampup{}, 8, 0), 8);
  // 1000 samples, 7 increments: stage 1 starts at 143 (7 x 143 = 1001 >= 1000), stage 2 at 286
  const BatchRampup r{32, 32, 1000};
  EXPECT_EQ(mb::train::global_batch_at(r, 256, 142), 32);
  EXPECT_EQ(mb::train::global_batch_at(r, 256, 143), 64);
  EXPECT_EQ(mb::train::global_batch_at(r, 256, 285), 64);
  EXPECT_EQ(mb::train::global_batch_at(r, 256, 286), 96);
  // Sample counts whose product with the increments passes 2^63.
  const BatchRampup huge{1, 1, int64_t{1} << 62};
  EXPECT_EQ(mb::train::global_batch_at(huge, 9, (int64_t{1} << 62) - 1), 8);
  EXPECT_EQ(mb::train::global_batch_at(huge, 9, int64_t{1} << 59), 2);
}

TEST(BatchRampup, ARunOfTrainSamplesHasTheIterationsMegatronCounts) {
  for (const Case& t : kCases)
    for (int64_t samples = 1; samples <= 2 * t.ramp.samples + 5 * t.final_batch; ++samples) {
      const int64_t iterations = iterations_one_at_a_time(t, samples);
      ASSERT_EQ(mb::train::ramp_iterations(t.ramp, t.final_batch, samples), iterations)
          << mb::train::rampup_text(t.ramp, t.final_batch) << ", " << samples << " samples";
      int64_t taken = 0;  // what those iterations take, one batch after another
      for (int64_t i = 0; i < iterations; ++i) taken += batch_by_counting(t, taken);
      const mb::train::RampRun run = mb::train::ramp_run(t.ramp, t.final_batch, samples);
      ASSERT_EQ(run.iterations, iterations);
      ASSERT_EQ(run.samples, taken) << mb::train::rampup_text(t.ramp, t.final_batch) << ", " << samples << " samples";
    }
  // 8 + 4 iterations: 2, 2, 2, 2, 4, 4, 6, 6 ramp to 28 samples, then (64 - 28) / 8 = 4 of 8
  EXPECT_EQ(mb::train::ramp_iterations({2, 2, 24}, 8, 64), 12);
  EXPECT_EQ(mb::train::ramp_run({2, 2, 24}, 8, 64).samples, 60);
  // no ramp: whole batches
  EXPECT_EQ(mb::train::ramp_iterations(BatchRampup{}, 8, 63), 7);
  EXPECT_EQ(mb::train::ramp_run(BatchRampup{}, 8, 63).samples, 56);
  // A long ramp is counted a stage at a time (a one-at-a-time loop would take 2^40 steps).
  const BatchRampup longer{1, 1, int64_t{1} << 40};
  const int64_t its = mb::train::ramp_iterations(longer, 3, int64_t{1} << 41);
  // stage 1 (batch 1) runs to c = 2^39, stage 2 (batch 2) to 2^40 exactly, then batch 3
  EXPECT_EQ(its, (int64_t{1} << 39) + (int64_t{1} << 38) + 1 + ((int64_t{1} << 41) - (int64_t{1} << 40) - 3) / 3);
}

TEST(BatchRampup, RampsThatCannotRunAreRefusedNamingTheFlag) {
  const auto refusal = [](const BatchRampup& r, int64_t final_batch, int64_t micro, int64_t dp) {
    try {
      mb::train::check_rampup(r, final_batch, micro, dp);
    } catch (const mb::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(refusal({8, 8, 100}, 32, 4, 2), "");
  EXPECT_EQ(refusal({32, 8, 100}, 32, 4, 1),
            "--rampup-batch-size: the start batch 32 is not below --global-batch-size 32, so there is nothing to ramp; "
            "give a smaller start, or drop --rampup-batch-size");
  EXPECT_EQ(refusal({8, 16, 100}, 32, 4, 1),
            "--rampup-batch-size: the increment 16 does not divide the ramp from 8 to --global-batch-size 32 (24 "
            "samples); give an increment that divides it");
  EXPECT_EQ(refusal({4, 4, 100}, 32, 4, 2),
            "--rampup-batch-size 4 4 100: every batch of the ramp must be whole micro-batches on each data-parallel "
            "rank, so the start and the increment must be multiples of micro_batch_size x data-parallel size (4 x 2 "
            "= 8)");
  EXPECT_NE(refusal({8, 4, 100}, 32, 4, 2), "");  // the increment alone is not a multiple
}
