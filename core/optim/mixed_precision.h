// Megatron's optimizer chores around a plugin's numeric step, in Megatron's order:
// unscale the fp32 main gradients and check them for inf/NaN (fp16), agree on the overflow
// over the tensor- and data-parallel groups, update the dynamic loss scale, clip by the
// global norm (tensor-parallel aware), then the plugin's step on the fp32 masters (skipped
// on an overflow) at the learning rate of the schedule. The plugin is only its math.
//
// Everything stays on the run's device. The one value the host needs is an fp16 step's
// overflow flag (a skipped step advances neither the optimizer's step count nor the LR
// schedule, as in Megatron): on a CPU it is in host memory already and a skipped step is
// not given to the plugin; on a GPU it is read one step late, when the GPU has long
// produced it, and the step's own flag makes the plugin's kernels change nothing. This
// class is where that difference lives: the training loop above it has no device branch.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/device/runtime.h"
#include "core/nn/parameters.h"
#include "core/ops/loss_scaler.h"
#include "core/optim/optimizer.h"
#include "core/optim/schedule.h"
#include "core/tensor/tensor.h"

namespace megabatch::optim {

// Where the chores stand, as a checkpoint stores it.
struct StepCounts {
  int64_t optimizer_steps = 0;  // steps the plugin applied (its step count t)
  int64_t lr_samples = 0;       // samples of those steps: where the LR schedule is
};

class MixedPrecisionOptimizer {
 public:
  struct Options {
    LrSchedule schedule;
    double clip_grad = 1.0;          // max global norm (<= 0: no clipping)
    ops::LossScalerConfig loss_scaler;  // used when the parameters are f16
  };
  // `plugin` steps `params` (both outlive this); `tp` reduces the norms of sharded tensors.
  MixedPrecisionOptimizer(Options options, PluginOptimizer& plugin, nn::ParameterStore& params, comm::Communicator& tp);
  ~MixedPrecisionOptimizer();
  // The data-parallel group the overflow flag is agreed over (default: none); with the
  // plugin's shards (the distributed optimizer) the norms are of this rank's pieces,
  // summed over `dp`. Must outlive this.
  void set_data_parallel(comm::Communicator& dp);

  bool fp16() const { return params_.dtype() == DType::kF16; }
  // f32 (1) on the device: the scale fp16 losses are multiplied by.
  Tensor loss_scale() const { return scaler_.flat(0, 1); }
  // The reduced fp32 gradients the plugin steps: the flat buffer, or this rank's shards.
  const Tensor& main_grads() const;
  // Segments of main_grads() holding tensor-parallel sharded / replicated parameters.
  const std::vector<std::pair<size_t, size_t>>& segments(bool sharded) const { return sharded ? sharded_ : replicated_; }

  // The chores of one step, in order. Each records what the step's log row needs into
  // f64 slots on the device:
  // fp16 only: scale_used (1) = the step's loss scale, found_inf (1) = its overflow flag.
  void unscale_and_check(const Tensor& scale_used, const Tensor& found_inf);
  // sums (2) = squared norms of the sharded and replicated gradients (over the groups);
  // norms (3) = global norm, clip coefficient, norm after clipping; gradients scaled.
  void clip(const Tensor& sums, const Tensor& norms);
  // The plugin's step at the schedule's learning rates and weight decay (with per-tensor
  // diagnostics when asked); `clipped_norm` f64 (1) is the norm it is given; `global_batch`
  // the samples of this step (the plugin's B, and the schedule's advance when applied).
  void step(const Tensor& clipped_norm, int64_t global_batch, bool diagnostics);
  // After step(): every overflow flag started is known to the host (the counts exact).
  void settle();

  double lr() const { return lr_; }  // of the last step
  double decoupled_lr() const {
    return decoupled_lr_;
  }  // of the last step: the embedding's (lr() without --decoupled-lr)
  double weight_decay() const { return plugin_.weight_decay(); }  // of the last step
  StepCounts counts() const { return counts_; }
  ops::LossScalerState loss_scaler_state() const;
  const ops::LossScalerConfig& loss_scaler_config() const { return opt_.loss_scaler; }
  const LrSchedule& schedule() const { return opt_.schedule; }
  // Megatron's optional fields of the log line, computed on the host from copies (only when
  // asked for, at log intervals; collectives: every rank calls them in the same order):
  double params_norm();          // L2 norm of the fp32 masters, over the TP (and DP pieces') group
  int64_t num_zeros_in_grad();   // zeros in the main gradients, each element once over TP
  // From a checkpoint: the counts and, where it has one, the loss scaler's state.
  void restore(StepCounts counts, const ops::LossScalerState* scaler);

 private:
  void resolve_overflow();  // the host learns the last started overflow flag
  void follow_schedule();   // the lrs and the plugin's weight decay at the samples of the steps applied

  Options opt_;
  PluginOptimizer& plugin_;
  nn::ParameterStore& params_;
  comm::Communicator& tp_;
  comm::LocalCommunicator no_dp_;
  comm::Communicator* dp_ = &no_dp_;
  std::vector<std::pair<size_t, size_t>> sharded_, replicated_;  // main_grads() segments by sharding
  Tensor scaler_, found_inf_;                  // LossScalerState f32 (3), overflow flag f32 (1)
  std::unique_ptr<runtime::Readback> overflow_;  // the overflow flag of the last step, for the host
  bool unresolved_ = false;                    // overflow_ holds a flag the counts do not include yet
  int64_t unresolved_batch_ = 0;               // the samples of that step
  StepCounts counts_;
  double lr_ = 0, decoupled_lr_ = 0;
};

}  // namespace megabatch::optim
