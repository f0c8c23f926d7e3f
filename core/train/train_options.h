// The settings of a run of the training loop, as the flags give them (core/train/flags.h).
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "core/io/checkpoint.h"
#include "core/ops/loss_scaler.h"
#include "core/optim/schedule.h"
#include "core/train/batch_rampup.h"

namespace megabatch::train {

// --profile-steps times iterations after this many of the run's first (allocations, plugin set-up).
constexpr int64_t kProfileWarmup = 2;

struct TrainOptions {
  int64_t micro_batch_size = 8, global_batch_size = 8, train_iters = 0;
  BatchRampup rampup;  // --rampup-batch-size: the global batch grows to global_batch_size
  // The global batch of the iteration that starts after `consumed` samples.
  int64_t global_batch(int64_t consumed) const { return global_batch_at(rampup, global_batch_size, consumed); }
  optim::LrSchedule schedule;
  double clip_grad = 1.0;
  int64_t log_interval = 100, eval_interval = 1000, eval_iters = 100;
  int64_t eval_samples = 0;          // > 0: samples per evaluation (at most one pass over the split) instead of eval_iters global batches
  int64_t diagnostics_interval = 0;  // per-tensor optimizer diagnostics every N iterations (0: off)
  bool diagnostics_asked = false;    // --diagnostics-interval given: say so when the plugin reports none
  bool noise_scale = false;          // estimate the gradient noise scale B_simple
  bool per_token_loss = false;  // --calculate-per-token-loss: the lm loss weighs every token of the global batch alike
  double noise_scale_ema = 0.99;     // decay of its moving averages, a step
  double noise_scale_window = 0;     // > 0: their window in samples instead (decay exp(-B / window) a step)
  // fp16 loss scaling (used when the model's parameters are f16; bf16 and f32 need none)
  ops::LossScalerConfig loss_scaler;
  // Checkpoints: written to save_dir every save_interval iterations (0: none on a
  // schedule), at the end of training, at exit_interval, and on SIGTERM / SIGUSR1.
  std::string save_dir;              // empty: no checkpoints
  int64_t save_interval = 0;
  int keep_checkpoints = 0;          // newest K kept (0: all)
  int64_t save_retain_interval = 0;  // ... and those of its multiples (0: none besides)
  int64_t exit_interval = 0;         // stop after this iteration (0: run to train_iters)
  double exit_duration_minutes = 0;  // > 0: stop (resumable) after the iteration that ends this long into run()
  int64_t profile_steps = 0;         // print where N iterations' time went, after kProfileWarmup (0: off)
  // iterations (numbered from 1) that pass over their global batch untrained (Megatron's
  // --iterations-to-skip): consumed, no step, the schedule not advanced
  std::set<int64_t> iterations_to_skip;
  // compare the data-parallel replicas' weights at the start and every N iterations (0: never)
  int64_t replica_check_interval = 0;
  io::CheckpointState checkpoint;    // what the caller knows: model config, optimizer name, params
  uint64_t seed = 1234;
  int64_t tokens_per_sample = 0;  // for tokens/s
  // Megatron's optional fields of the iteration line: throughput per GPU from the model's
  // FLOPs per sample (Megatron's formula, computed by the caller) over world_size GPUs,
  // the parameters' L2 norm, the number of zeros in the gradients.
  bool log_throughput = false;
  double flops_per_sample = 0;
  int world_size = 1;
  bool log_params_norm = false;
  bool log_num_zeros_in_grad = false;
  // Divergence: a NaN or infinite loss or gradient norm stops the run at once; an lm loss
  // whose log-interval mean stays above divergence_loss for divergence_intervals intervals
  // in a row stops it too (0: only NaN/inf), as do (fp16) that many intervals whose every step
  // overflowed at the lowest loss scale. A diverged run saves no checkpoint.
  double divergence_loss = 0;
  int64_t divergence_intervals = 3;
  // Data parallelism (Megatron's DDP flags): gradients are summed over the DP group in
  // buckets of ddp_bucket_size elements (0: Megatron's default, core/train/grad_buckets.h);
  // with overlap_grad_reduce each bucket starts during the last micro-batch's backward pass.
  bool overlap_grad_reduce = false;
  int64_t ddp_bucket_size = 0;
};

}  // namespace megabatch::train
