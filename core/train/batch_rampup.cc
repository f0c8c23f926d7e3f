#include "core/train/batch_rampup.h"

#include <algorithm>

#include "core/util/error.h"

namespace megabatch::train {

namespace {
__extension__ typedef __int128 Wide;  // consumed (< 2^63) times increments (< 2^63): no overflow
int64_t increments(const BatchRampup& r, int64_t final_batch) { return (final_batch - r.start) / r.increment; }
}  // namespace

int64_t global_batch_at(const BatchRampup& r, int64_t final_batch, int64_t consumed) {
  if (!r.on() || consumed > r.samples) return final_batch;
  // floor(consumed * n / samples), in 128 bits: consumed * n may pass 2^63
  const auto k = static_cast<int64_t>(static_cast<Wide>(consumed) * increments(r, final_batch) / r.samples);
  return r.start + k * r.increment;
}

RampRun ramp_run(const BatchRampup& r, int64_t final_batch, int64_t train_samples) {
  if (!r.on()) return {train_samples / final_batch, train_samples / final_batch * final_batch};
  const int64_t n = increments(r, final_batch), limit = std::min(r.samples, train_samples);
  RampRun run;
  // Megatron steps one iteration at a time while consumed <= limit; here a whole stage of
  // equal batches at once: stage k holds the consumed counts c with floor(c * n / samples) = k.
  while (run.samples <= limit) {
    const int64_t batch = global_batch_at(r, final_batch, run.samples);
    const int64_t k = (batch - r.start) / r.increment;
    int64_t last = limit;  // the last consumed count of this stage within the limit
    if (k < n) {
      // the first c of stage k + 1: ceil((k + 1) * samples / n)
      const Wide num = static_cast<Wide>(k + 1) * r.samples;
      const auto next = static_cast<int64_t>((num + n - 1) / n);
      last = std::min(last, next - 1);
    }
    const int64_t steps = (last - run.samples) / batch + 1;
    run.samples += steps * batch;
    run.iterations += steps;
  }
  if (train_samples > run.samples) {
    const int64_t rest = (train_samples - run.samples) / final_batch;
    run.iterations += rest;
    run.samples += rest * final_batch;
  }
  return run;
}

int64_t ramp_iterations(const BatchRampup& r, int64_t final_batch, int64_t train_samples) {
  return ramp_run(r, final_batch, train_samples).iterations;
}

std::string rampup_problem(const BatchRampup& r, int64_t final_batch, int64_t micro_batch, int64_t dp_size) {
  if (!r.on()) return "";
  const auto n = [](int64_t x) { return std::to_string(x); };
  const std::string given = "--rampup-batch-size " + n(r.start) + " " + n(r.increment) + " " + n(r.samples);
  if (r.increment < 1 || r.samples < 1) return given + ": START, INCREMENT and SAMPLES must each be >= 1";
  if (r.start >= final_batch)
    return "--rampup-batch-size: the start batch " + n(r.start) + " is not below --global-batch-size " +
           n(final_batch) + ", so there is nothing to ramp; give a smaller start, or drop --rampup-batch-size";
  if ((final_batch - r.start) % r.increment != 0)
    return "--rampup-batch-size: the increment " + n(r.increment) + " does not divide the ramp from " + n(r.start) +
           " to --global-batch-size " + n(final_batch) + " (" + n(final_batch - r.start) +
           " samples); give an increment that divides it";
  const int64_t unit = micro_batch * dp_size;
  if (r.start % unit != 0 || r.increment % unit != 0)
    return given +
           ": every batch of the ramp must be whole micro-batches on each data-parallel rank, so the start and the "
           "increment must be multiples of micro_batch_size x data-parallel size (" +
           n(micro_batch) + " x " + n(dp_size) + " = " + n(unit) + ")";
  return "";
}

void check_rampup(const BatchRampup& r, int64_t final_batch, int64_t micro_batch, int64_t dp_size) {
  const std::string problem = rampup_problem(r, final_batch, micro_batch, dp_size);
  check(problem.empty(), problem);
}

std::string rampup_text(const BatchRampup& r, int64_t final_batch) {
  return std::to_string(r.start) + " to " + std::to_string(final_batch) + " by " + std::to_string(r.increment) +
         " over " + std::to_string(r.samples) + " samples";
}

}  // namespace megabatch::train
