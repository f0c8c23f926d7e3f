// The one training loop: gradient accumulation over micro-batches, data-parallel
// reduction, then Megatron's optimizer chores and the plugin's step
// (optim::MixedPrecisionOptimizer), a row of the step's values for the host
// (StepRecorder: metrics, console lines, divergence), evaluation and checkpoints.
//
// A step runs on the model's device from end to end: losses, norms, the overflow flag and
// the loss scale stay there, one row per iteration, until the host reads the rows at a log
// interval (or a checkpoint, an evaluation, the end); no step waits for the device.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <vector>

#include "core/comm/communicator.h"
#include "core/io/checkpoint.h"
#include "core/io/metrics.h"
#include "core/ops/loss_scaler.h"
#include "core/optim/mixed_precision.h"
#include "core/optim/optimizer.h"
#include "core/train/batch_source.h"
#include "core/train/grad_buckets.h"
#include "core/train/model.h"
#include "core/train/noise_scale.h"
#include "core/train/step_recorder.h"
#include "core/train/train_options.h"

namespace megabatch::train {

// Why run() returned.
enum class StopReason { kFinished, kExitInterval, kSignal, kExitDuration, kDiverged };

class Trainer {
 public:
  Trainer(TrainOptions options, Model& model, optim::PluginOptimizer& optimizer, comm::Communicator& tp,
          BatchSource& train, BatchSource* validation, io::MetricsFile* metrics, std::ostream& console);
  ~Trainer();
  // Test data: evaluated once at the end of training ("on test set"), as Megatron does.
  void set_test_data(BatchSource* test) { test_ = test; }
  // Runs to train_iters, or to exit_interval, or until SIGTERM / SIGUSR1 / SIGINT arrives
  // at any rank (then every rank finishes the current iteration, a checkpoint is written
  // when save_dir is set, and it returns kSignal), or until an iteration ends
  // exit_duration_minutes after run() began on any rank (the same, and kExitDuration). A
  // diverged run (see TrainOptions; also an evaluation's NaN or infinite loss, and weights
  // that are not finite where a checkpoint is due) stops with kDiverged, its metrics flushed
  // and no checkpoint written. On an error (a plugin failure) the metrics are flushed first, then
  // the Error propagates.
  StopReason run();
  // Continues from a checkpoint: iteration, consumed samples (the data position) and the
  // trainer's own state (loss scaler, noise-scale averages, optimizer steps). Parameters
  // and optimizer state are loaded by io::load_checkpoint.
  void restore(const io::CheckpointState& state);
  // Data parallelism over `dp` (default: none): each rank takes its share of every global
  // batch and gradients are averaged over the group. Must outlive the trainer. When the
  // optimizer has shards (the distributed optimizer, over the same group) gradients are
  // reduce-scattered into them, and clipping and the overflow check run on the shards.
  void set_data_parallel(comm::Communicator& dp);
  // The whole job (default: this process alone), for the decision to stop on a signal:
  // a signal reaches the ranks at different moments (scancel, a time limit), so after each
  // iteration the ranks agree on whether any of them has one, and all stop after the same
  // iteration. A host communicator (MPI), so that the GPU need not wait. Must outlive the
  // trainer.
  void set_world(comm::Communicator& world) { world_ = &world; }
  // Writes a checkpoint of the current state to save_dir; returns its path.
  std::filesystem::path save_checkpoint();
  // Mean validation losses over eval_iters global batches, or eval_samples samples (no dropout, no gradients):
  // ("lm loss", mean) first, then the model's extra terms. eval_samples over a split with fewer
  // samples evaluates each of them once (the last micro-batch smaller), not the split repeated.
  std::vector<std::pair<std::string, double>> evaluate(BatchSource& data);
  int64_t eval_sample_count(const BatchSource& data) const;  // samples one evaluation of `data` covers
  // Megatron's evaluation after training, where evaluation is on: "validation loss at iteration N
  // on validation set |", then "... on test set |", each into metrics (validation/, test/). run()
  // calls it when the run finishes; --skip-train calls it alone, after restore().
  void final_evaluation();
  // One iteration (run() calls it; tests may too). The host learns its values at drain().
  void train_step();
  // An iteration of --iterations-to-skip: its global batch consumed, nothing trained, the
  // schedule where it was; no row of metrics.
  void skip_step();
  // Reads the device rows of the iterations since the last drain: metrics rows, losses(),
  // noise-scale averages, divergence check. (run() drains at every log interval.)
  void drain();

  int64_t iteration() const { return iteration_; }
  int64_t consumed_samples() const { return consumed_; }
  const std::vector<double>& losses() const { return recorder_.losses_drained(); }  // per drained iteration
  const NoiseScaleEstimator& noise_scale() const { return recorder_.noise_scale(); }
  int64_t skipped_iterations() const { return recorder_.skipped_total(); }  // fp16 overflows
  int64_t optimizer_steps() const { return optimizer_.counts().optimizer_steps; }  // steps applied (not skipped)
  // After run() returned kDiverged: the iteration it was detected at and why.
  bool diverged() const { return recorder_.diverged(); }
  int64_t diverged_at() const { return recorder_.diverged_at(); }
  const std::string& divergence_reason() const { return recorder_.divergence_reason(); }
  ops::LossScalerState loss_scaler_state() const { return optimizer_.loss_scaler_state(); }

 private:
  // The phases of train_step, in order.
  void forward_backward();    // micro-batches: forward and backward each, losses into the step row
  void reduce_gradients();    // data parallel: sum of the ranks' gradients (and losses)
  void optimizer_step();      // the chores and the plugin's step, diagnostics into metrics
  void record_step(double seconds);  // the step row into the ring the host drains
  StepRecorder::Memory memory_use() const;  // the model's device's, now

  void first_forward(const LossOutput& out);  // the step row's layout, from the model's loss terms
  void measure_micro_batch(int64_t k, int64_t local, int64_t n_measured);  // noise scale's small-batch term
  void validate(BatchSource& data, const std::string& set);  // Megatron's evaluation block
  StopReason loop();          // run()'s iterations, until a reason to stop
  void finish(StopReason reason);  // after the last checkpoint: what stopped the run
  // Before a checkpoint: the weights are finite on every rank; else the run has diverged (false).
  bool weights_finite();
  // After an iteration: did any rank of the job receive a stop signal (then stop_signal_ says
  // which) or spend --exit-duration-in-mins? One all-reduce over the job.
  bool stop_agreed();
  double minutes_training() const;  // since run() began
  bool evaluating() const { return opt_.eval_iters > 0 || opt_.eval_samples > 0; }
  bool fp16() const { return model_.parameters().dtype() == DType::kF16; }

  TrainOptions opt_;
  Model& model_;
  optim::PluginOptimizer& plugin_;
  optim::MixedPrecisionOptimizer optimizer_;
  comm::Communicator& tp_;
  comm::LocalCommunicator no_dp_;
  comm::Communicator* dp_ = &no_dp_;
  comm::Communicator* world_ = &no_dp_;
  int stop_signal_ = 0;                            // the signal every rank stops for (the largest any rank received)
  std::chrono::steady_clock::time_point started_;  // when run() began
  std::unique_ptr<GradientBuckets> buckets_;  // with data parallelism
  bool bucket_line_said_ = false;
  BatchSource& train_;
  BatchSource* valid_;
  BatchSource* test_ = nullptr;
  io::MetricsFile* metrics_;
  std::ostream& console_;
  Device device_;
  StepRecorder recorder_;
  int64_t iteration_ = 0, consumed_ = 0;
  int64_t step_batch_ = 0;  // the global batch of the current step (with --rampup-batch-size: of the ramp)
  bool names_written_ = false;
  bool no_diagnostics_said_ = false;
  int64_t last_saved_ = -1;
  Batch batch_;
  std::vector<Batch> step_batches_;  // --calculate-per-token-loss: the step's micro-batches, filled to count tokens
  // the noise scale's small-batch term: gradients before a micro-batch f32, its |g|^2 f64 (2),
  // over segments of the whole local gradient buffer by sharding
  Tensor noise_before_, noise_sums_;
  std::vector<std::pair<size_t, size_t>> grad_sharded_, grad_replicated_;
};

}  // namespace megabatch::train
