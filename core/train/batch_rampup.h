// Megatron's batch-size ramp-up (--rampup-batch-size START INCREMENT SAMPLES): the global
// batch starts at START and grows by INCREMENT at a time to --global-batch-size over the
// first SAMPLES training samples, in equal shares of samples per increment; from then on it
// is --global-batch-size. The iteration that starts after c samples takes
//   START + INCREMENT * floor(c * n / SAMPLES)   (c <= SAMPLES; n = increments to the end)
// samples, and --global-batch-size after. Megatron computes the quotient as
// int(c / (SAMPLES / n)) in floating point; here it is exact, so where the two differ (a c at
// which the double quotient rounds across an integer) the batch grows at the exact boundary.
#pragma once

#include <cstdint>
#include <string>

namespace megabatch::train {

struct BatchRampup {
  int64_t start = 0, increment = 0, samples = 0;  // start 0: no ramp
  bool on() const { return start > 0; }
};

// The global batch of the iteration that starts after `consumed` training samples, with
// `final_batch` (--global-batch-size) at the end of the ramp.
int64_t global_batch_at(const BatchRampup& ramp, int64_t final_batch, int64_t consumed);

// The iterations of a run of `train_samples` samples, as Megatron counts them: iterations of
// the ramp while the samples consumed before them are within both the ramp and the run (the
// last of them may go past train_samples), then whole final batches of what is left.
int64_t ramp_iterations(const BatchRampup& ramp, int64_t final_batch, int64_t train_samples);

// Those iterations and the samples they take: train_samples rounded down to whole final
// batches, or with a ramp what its batches add up to (a few more where its last step passes
// train_samples, fewer where the final batches leave a remainder).
struct RampRun {
  int64_t iterations = 0, samples = 0;
};
RampRun ramp_run(const BatchRampup& ramp, int64_t final_batch, int64_t train_samples);

// What makes a ramp one that Megatron refuses or that would fail mid-run ("" when nothing): a
// number below 1, a start at or above the final batch, an increment that does not divide the
// distance, and (every batch of the ramp must be whole micro-batches on every data-parallel
// rank) a start or increment that is not a multiple of micro batch x data-parallel size. The
// text names the flag. check_rampup throws it.
std::string rampup_problem(const BatchRampup& ramp, int64_t final_batch, int64_t micro_batch, int64_t dp_size);
void check_rampup(const BatchRampup& ramp, int64_t final_batch, int64_t micro_batch, int64_t dp_size);

// "8 to 32 by 8 over 1000 samples" for plan lines.
std::string rampup_text(const BatchRampup& ramp, int64_t final_batch);

}  // namespace megabatch::train
