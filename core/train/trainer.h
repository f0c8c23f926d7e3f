// The one training loop: gradient accumulation over micro-batches, data-parallel
// reduction, Megatron's mixed-precision chores (unscale and inf check, loss scaling),
// global-norm clipping, the optimizer plugin's step on fp32 masters, the LR schedule,
// Megatron console lines, metrics, evaluation and checkpoints.
//
// A step runs on the model's device from end to end: losses, norms, the overflow flag and
// the loss scale stay there, one row per iteration, until the host reads the rows at a log
// interval (or a checkpoint, an evaluation, the end). The only value the host needs sooner
// is an fp16 step's overflow flag (a skipped step advances neither the optimizer's step
// count nor the LR schedule, as in Megatron); it is read one step late, when the GPU has
// long produced it, so no step waits for the device.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>

#include "core/comm/communicator.h"
#include "core/device/runtime.h"
#include "core/io/checkpoint.h"
#include "core/io/metrics.h"
#include "core/ops/loss_scaler.h"
#include "core/optim/optimizer.h"
#include "core/optim/schedule.h"
#include "core/train/grad_buckets.h"
#include "core/train/model.h"
#include "core/train/noise_scale.h"

namespace megabatch::train {

// Fills a micro-batch with samples [first, first + count) of a deterministic sample order.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual void fill(uint64_t first, int64_t count, Batch& out) = 0;
  // Distinct samples before the order repeats (0: unknown). An evaluation by eval_samples
  // covers at most this many, each once.
  virtual uint64_t samples_per_epoch() const { return 0; }
};

struct TrainOptions {
  int64_t micro_batch_size = 8, global_batch_size = 8, train_iters = 0;
  optim::LrSchedule schedule;
  double clip_grad = 1.0;
  int64_t log_interval = 100, eval_interval = 1000, eval_iters = 100;
  int64_t eval_samples = 0;          // > 0: samples per evaluation (at most one pass over the split) instead of eval_iters global batches
  int64_t diagnostics_interval = 0;  // per-tensor optimizer diagnostics every N iterations (0: off)
  bool noise_scale = false;          // estimate the gradient noise scale B_simple
  double noise_scale_ema = 0.99;     // decay of its moving averages, a step
  double noise_scale_window = 0;     // > 0: their window in samples instead (decay exp(-B / window) a step)
  // fp16 loss scaling (used when the model's parameters are f16; bf16 and f32 need none)
  ops::LossScalerConfig loss_scaler;
  // Checkpoints: written to save_dir every save_interval iterations (0: none on a
  // schedule), at the end of training, at exit_interval, and on SIGTERM / SIGUSR1.
  std::string save_dir;              // empty: no checkpoints
  int64_t save_interval = 0;
  int keep_checkpoints = 0;          // newest K kept (0: all)
  int64_t exit_interval = 0;         // stop after this iteration (0: run to train_iters)
  int64_t profile_steps = 0;         // print where N iterations' time went, after 2 warm-up ones (0: off)
  io::CheckpointState checkpoint;    // what the caller knows: model config, optimizer name, params
  uint64_t seed = 1234;
  int64_t tokens_per_sample = 0;  // for tokens/s
  // Megatron's optional fields of the iteration line: throughput per GPU from the model's
  // FLOPs per iteration (Megatron's formula, computed by the caller) over world_size GPUs,
  // the parameters' L2 norm, the number of zeros in the gradients.
  bool log_throughput = false;
  double flops_per_iteration = 0;
  int world_size = 1;
  bool log_params_norm = false;
  bool log_num_zeros_in_grad = false;
  // Divergence: a NaN or infinite loss or gradient norm stops the run at once; an lm loss
  // whose log-interval mean stays above divergence_loss for divergence_intervals intervals
  // in a row stops it too (0: only NaN/inf). A diverged run saves no checkpoint.
  double divergence_loss = 0;
  int64_t divergence_intervals = 3;
  // Data parallelism (Megatron's DDP flags): gradients are summed over the DP group in
  // buckets of ddp_bucket_size elements (0: Megatron's default, core/train/grad_buckets.h);
  // with overlap_grad_reduce each bucket starts during the last micro-batch's backward pass.
  bool overlap_grad_reduce = false;
  int64_t ddp_bucket_size = 0;
};

// Why run() returned.
enum class StopReason { kFinished, kExitInterval, kSignal, kDiverged };

class Trainer {
 public:
  Trainer(TrainOptions options, Model& model, optim::PluginOptimizer& optimizer, comm::Communicator& tp,
          BatchSource& train, BatchSource* validation, io::MetricsFile* metrics, std::ostream& console);
  ~Trainer();
  // Test data: evaluated once at the end of training ("on test set"), as Megatron does.
  void set_test_data(BatchSource* test) { test_ = test; }
  // Runs to train_iters, or to exit_interval, or until SIGTERM / SIGUSR1 / SIGINT arrives
  // at any rank (then every rank finishes the current iteration, a checkpoint is written
  // when save_dir is set, and it returns kSignal). A diverged run (see TrainOptions) stops
  // with kDiverged, its metrics flushed and no checkpoint written. On an error (a plugin
  // failure) the metrics are flushed first, then the Error propagates.
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
  double params_norm();          // L2 norm of the (master) parameters, over the TP group
  int64_t num_zeros_in_grad();   // zeros in the main gradients, each element once over TP
  // One iteration (run() calls it; tests may too). The host learns its values at drain().
  void train_step();
  // Reads the device rows of the iterations since the last drain: metrics rows, losses(),
  // noise-scale averages, divergence check. (run() drains at every log interval.)
  void drain();

  int64_t iteration() const { return iteration_; }
  int64_t consumed_samples() const { return consumed_; }
  const std::vector<double>& losses() const { return losses_; }  // per drained iteration
  const NoiseScaleEstimator& noise_scale() const { return noise_scale_; }
  int64_t skipped_iterations() const { return skipped_total_; }  // fp16 overflows
  int64_t optimizer_steps() const { return optimizer_steps_; }   // steps applied (not skipped)
  // After run() returned kDiverged: the iteration it was detected at and why.
  int64_t diverged_at() const { return diverged_at_; }
  const std::string& divergence_reason() const { return divergence_reason_; }
  ops::LossScalerState loss_scaler_state() const;

 private:
  // The phases of train_step, in order.
  void forward_backward();    // micro-batches: forward and backward each, losses into the step row
  void reduce_gradients();    // data parallel: sum of the ranks' gradients (and losses)
  void unscale_and_check();   // fp16: gradients / loss scale, overflow flag, scaler update
  void clip_gradients();      // global norm (tensor-parallel aware), clip coefficient, scaling
  void optimizer_step();      // the plugin on fp32 masters (not on an overflow), masters -> params
  void record_step(double seconds);  // the step row into the ring the host drains

  void allocate_step_buffers(size_t extra_terms);
  // The reduced fp32 gradients the optimizer steps: the flat buffer, or this rank's shards.
  const Tensor& main_grads() const;
  void resolve_overflow();    // the host learns the last started overflow flag
  void write_log_line();
  bool stop_agreed();  // after an iteration: did any rank of the job receive a stop signal?
  bool evaluating() const { return opt_.eval_iters > 0 || opt_.eval_samples > 0; }
  size_t loss_slots() const { return 1 + extra_names_.size(); }  // step_'s loss and extra losses, before the Slots
  bool fp16() const { return model_.parameters().dtype() == DType::kF16; }

  TrainOptions opt_;
  Model& model_;
  optim::PluginOptimizer& optimizer_;
  comm::Communicator& tp_;
  comm::LocalCommunicator no_dp_;
  comm::Communicator* dp_ = &no_dp_;
  comm::Communicator* world_ = &no_dp_;
  int stop_signal_ = 0;  // the signal every rank stops for (the largest any rank received)
  std::unique_ptr<GradientBuckets> buckets_;  // with data parallelism
  bool bucket_line_said_ = false;
  BatchSource& train_;
  BatchSource* valid_;
  BatchSource* test_ = nullptr;
  io::MetricsFile* metrics_;
  std::ostream& console_;
  Device device_;
  int64_t iteration_ = 0, consumed_ = 0;
  int64_t optimizer_steps_ = 0;  // steps the optimizer applied (its step count t)
  int64_t lr_samples_ = 0;       // samples of those steps: where the LR schedule is
  int64_t skipped_total_ = 0;
  NoiseScaleEstimator noise_scale_;
  bool names_written_ = false;
  int64_t last_saved_ = -1;
  std::vector<double> losses_;
  Batch batch_;

  // device state of the step
  std::vector<std::string> extra_names_;   // the model's extra loss terms
  size_t slots_ = 0;                       // values per step row
  Tensor step_;                            // f64 (slots_): this step's row
  Tensor ring_;                            // f64 (capacity, slots_): rows not yet drained
  int64_t ring_rows_ = 0, ring_first_ = 0;  // rows held, iteration of the first
  std::vector<double> ring_seconds_, ring_lr_;  // host-side values of those rows
  std::vector<int64_t> ring_consumed_;
  Tensor noise_before_, noise_sums_;       // noise scale: gradients before a micro-batch f32, its |g|^2 f64 (2)
  Tensor scaler_, found_inf_;              // fp16: LossScalerState f32 (3), overflow flag f32 (1)
  std::unique_ptr<runtime::Readback> overflow_;  // the overflow flag of the last step, for the host
  int64_t overflow_iteration_ = 0;         // whose flag overflow_ holds, until counted (0: none)
  std::vector<std::pair<size_t, size_t>> sharded_, replicated_;  // main_grads() segments by sharding
  std::vector<std::pair<size_t, size_t>> grad_sharded_, grad_replicated_;  // the same of the whole local gradients
  double step_lr_ = 0;

  // interval accumulators (host, filled at drain)
  double interval_loss_ = 0, interval_grad_norm_ = 0, interval_loss_scale_ = 1;
  std::vector<double> interval_extra_;
  int64_t interval_iters_ = 0, interval_skipped_ = 0, interval_nan_ = 0;
  int64_t intervals_above_ = 0;            // log intervals in a row above divergence_loss
  int64_t diverged_at_ = 0;                // 0: not diverged
  std::string divergence_reason_;
  std::chrono::steady_clock::time_point interval_start_;
};

}  // namespace megabatch::train
