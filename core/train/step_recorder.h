// What a training step records, and what the host learns of it. Each step writes one row
// of f64 values on the run's device (its losses, gradient norms, the fp16 overflow flag and
// loss scale, the noise scale's small-batch term); the row joins a ring on the device, and
// the host reads the ring at a drain: at each log interval, a checkpoint, an evaluation,
// the end. A drain appends every row to metrics.h5, feeds the noise-scale estimator and
// checks for divergence; the log line is Megatron's iteration line over the interval.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "core/io/metrics.h"
#include "core/tensor/tensor.h"
#include "core/train/noise_scale.h"
#include "core/train/train_options.h"

namespace megabatch::train {

// The slots of a step row after its 1 + E loss terms (the lm loss and the model's extra terms).
enum Slot : size_t {
  kSqSharded = 0, kSqReplicated,       // squared gradient norm, by sharding (summed over TP)
  kNorm, kClipCoeff, kClippedNorm,     // global norm, clip coefficient, norm after clipping
  kFoundInf, kLossScale,               // fp16: overflow flag, the loss scale of the step
  kSmallSharded, kSmallReplicated,     // a micro-batch's squared norm, mean over micro-batches (noise scale)
  kSlotsAfterLosses
};

class StepRecorder {
 public:
  // Writes metrics rows to `metrics` (may be null: a rank that does not log) and log lines
  // to `console`; fp16: rows carry an overflow flag and a loss scale.
  StepRecorder(const TrainOptions& options, bool fp16, io::MetricsFile* metrics, std::ostream& console);

  // The first step's forward pass names the model's extra loss terms, which fix the row.
  bool allocated() const { return step_.defined(); }
  void allocate(const std::vector<std::string>& extra_names, Device device);
  const std::vector<std::string>& extra_names() const { return extra_names_; }
  size_t loss_slots() const { return 1 + extra_names_.size(); }
  Tensor losses() const { return step_.flat(0, loss_slots()); }     // f64 (1 + E) of this step
  Tensor slots(Slot first, size_t n = 1) const { return step_.flat(loss_slots() + first, n); }

  // Before a step: the row zeroed.
  void begin_step();
  // After it: the row joins the ring with the host's values of the step (`batch`: its global
  // batch; `seconds`: its time; `weight_decay` and `decoupled_lr`: the schedule's, written where
  // the run has them);
  // a full ring is drained. Where the host reads the row for free (a CPU run), a NaN loss or
  // norm is drained at once.
  void record(int64_t iteration, int64_t consumed, int64_t batch, double lr, double seconds, double weight_decay = 0,
              double decoupled_lr = 0);
  // Reads the rows since the last drain: metrics rows, losses(), the noise scale, divergence.
  void drain();
  // The device's memory at a log line, in bytes: its tensors' now and at most since start, and
  // what the run holds from the device (a GPU's caching allocator; the CPU's: the tensors').
  struct Memory {
    double allocated = 0, max_allocated = 0, reserved = 0, max_reserved = 0;
  };
  // Optional fields of the iteration line (--decoupled-lr, --log-num-zeros-in-grad, --log-params-norm),
  // and the memory (metrics memory/..., and Megatron's memory line after the first iteration line).
  struct LineExtras {
    std::optional<double> decoupled_lr;  // --decoupled-lr: the embedding's, after the learning rate
    std::optional<int64_t> num_zeros;
    std::optional<double> params_norm;
    std::optional<Memory> memory;
  };
  // Megatron's iteration line over the interval since the last one (after a drain); the
  // interval's metrics are flushed first, so a logged line means they are on disk.
  void write_log_line(int64_t iteration, int64_t consumed, double lr, const LineExtras& extras);
  void restart_interval_clock() { interval_start_ = std::chrono::steady_clock::now(); }

  const std::vector<double>& losses_drained() const { return losses_; }
  NoiseScaleEstimator& noise_scale() { return noise_scale_; }
  const NoiseScaleEstimator& noise_scale() const { return noise_scale_; }
  int64_t skipped_total() const { return skipped_total_; }
  void set_skipped_total(int64_t n) { skipped_total_ = n; }
  bool diverged() const { return !divergence_reason_.empty(); }
  int64_t diverged_at() const { return diverged_at_; }  // where diverged(): the iteration
  // A divergence: found in the step rows, or by the trainer outside them (an evaluation, the
  // weights before a checkpoint); the first one found stands.
  void diverge(int64_t iteration, const std::string& reason) {
    if (diverged()) return;
    diverged_at_ = iteration;
    divergence_reason_ = reason;
  }
  const std::string& divergence_reason() const { return divergence_reason_; }

 private:
  void drain_row(const double* v, int64_t iteration, size_t r);

  const TrainOptions& opt_;
  bool fp16_;
  io::MetricsFile* metrics_;
  std::ostream& console_;
  NoiseScaleEstimator noise_scale_;
  std::vector<std::string> extra_names_;
  size_t slots_ = 0;                       // values per row
  Tensor step_;                            // f64 (slots_): this step's row
  Tensor ring_;                            // f64 (capacity, slots_): rows not yet drained
  int64_t ring_rows_ = 0, ring_first_ = 0;  // rows held, iteration of the first
  std::vector<double> ring_seconds_, ring_lr_, ring_wd_, ring_dlr_;  // host-side values of those rows
  std::vector<int64_t> ring_consumed_, ring_batch_;
  std::vector<double> losses_;             // lm loss per drained iteration
  int64_t skipped_total_ = 0;
  // the interval since the last log line (host, filled at drain)
  double interval_loss_ = 0, interval_grad_norm_ = 0, interval_loss_scale_ = 1;
  std::vector<double> interval_extra_;
  int64_t interval_iters_ = 0, interval_skipped_ = 0, interval_nan_ = 0;
  int64_t interval_samples_ = 0, last_batch_ = 0;  // samples of the interval; the global batch of its last step
  int64_t intervals_above_ = 0;            // log intervals in a row above divergence_loss
  int64_t intervals_stuck_ = 0;            // fp16: log intervals in a row of nothing but overflows at the lowest scale
  int64_t diverged_at_ = 0;
  std::string divergence_reason_;
  std::chrono::steady_clock::time_point interval_start_;
  bool memory_said_ = false;  // Megatron's memory line, once
};

}  // namespace megabatch::train
