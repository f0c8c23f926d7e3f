#include "core/optim/mixed_precision.h"

#include <cmath>

#include "core/comm/collectives.h"
#include "core/device/profile.h"
#include "core/ops/gradients.h"
#include "core/ops/reduce.h"
#include "core/util/error.h"

namespace megabatch::optim {

MixedPrecisionOptimizer::MixedPrecisionOptimizer(Options options, PluginOptimizer& plugin, nn::ParameterStore& params,
                                                 comm::Communicator& tp)
    : opt_(std::move(options)), plugin_(plugin), params_(params), tp_(tp), sharded_(params.segments(true)),
      replicated_(params.segments(false)) {
  const Device device = params_.device();
  scaler_.resize({3}, DType::kF32, device);
  found_inf_.resize({1}, DType::kF32, device);
  const ops::LossScalerState s = ops::initial_scaler_state(opt_.loss_scaler);
  copy(scaler_, from_host(std::vector<float>{s.scale, s.growth_tracker, s.hysteresis_tracker}, {3}));
  overflow_ = std::make_unique<runtime::Readback>(device, sizeof(float));
}

MixedPrecisionOptimizer::~MixedPrecisionOptimizer() = default;

void MixedPrecisionOptimizer::set_data_parallel(comm::Communicator& dp) {
  const DpShards* shards = plugin_.shards();
  check(!shards || &shards->dp() == &dp, "internal error: the optimizer's shards are over another data-parallel group");
  dp_ = &dp;
  if (shards) {  // norms over the pieces of this rank's shards
    sharded_ = shards->segments(true);
    replicated_ = shards->segments(false);
  }
}

const Tensor& MixedPrecisionOptimizer::main_grads() const {
  return plugin_.shards() ? plugin_.shards()->grads() : params_.grads();
}

ops::LossScalerState MixedPrecisionOptimizer::loss_scaler_state() const {
  const std::vector<float> s = to_host_f32(scaler_);
  return {s[0], s[1], s[2]};
}

void MixedPrecisionOptimizer::restore(StepCounts counts, const ops::LossScalerState* scaler) {
  counts_ = counts;
  if (scaler)
    copy(scaler_, from_host(std::vector<float>{scaler->scale, scaler->growth_tracker, scaler->hysteresis_tracker}, {3}));
}

void MixedPrecisionOptimizer::unscale_and_check(const Tensor& scale_used, const Tensor& found_inf) {
  const profile::Region mark(profile::Family::kOptimizer);
  if (!fp16()) return;
  ops::weighted_accumulate(scale_used, scaler_.flat(0, 1), {1.0});  // the scale of this step
  ops::unscale_and_check(main_grads(), found_inf_, scaler_);
  // one overflowing rank skips the step everywhere (a local flag would let scales diverge)
  comm::all_reduce(tp_, found_inf_, comm::ReduceOp::kMax);
  comm::all_reduce(*dp_, found_inf_, comm::ReduceOp::kMax);
  ops::weighted_accumulate(found_inf, found_inf_, {1.0});
  ops::loss_scaler_update(scaler_, found_inf_, opt_.loss_scaler);
}

void MixedPrecisionOptimizer::clip(const Tensor& sums, const Tensor& norms) {
  const profile::Region mark(profile::Family::kOptimizer);
  const Tensor& g = main_grads();
  ops::split_sum_squares(sums, g, sharded_, replicated_);
  if (plugin_.shards()) comm::all_reduce(*dp_, sums, comm::ReduceOp::kSum);  // the ranks' pieces
  comm::all_reduce(tp_, sums.flat(0, 1), comm::ReduceOp::kSum);  // sharded tensors: their squares over the group
  ops::clip_coefficient(norms, sums, opt_.clip_grad);
  ops::scale_by(g, norms, 1);
}

void MixedPrecisionOptimizer::resolve_overflow() {
  if (!unresolved_) return;
  const float flag = *static_cast<const float*>(overflow_->get());
  if (flag == 0.0f) {
    ++counts_.optimizer_steps;
    counts_.lr_samples += unresolved_batch_;
  }
  unresolved_ = false;
}

void MixedPrecisionOptimizer::settle() { resolve_overflow(); }

void MixedPrecisionOptimizer::follow_schedule() {
  lr_ = opt_.schedule.lr(counts_.lr_samples);
  decoupled_lr_ = opt_.schedule.decoupled_lr(counts_.lr_samples);
  if (opt_.schedule.wd.scheduled()) plugin_.set_weight_decay(opt_.schedule.wd.at(counts_.lr_samples));
  if (opt_.schedule.decoupled) plugin_.set_decoupled_lr(decoupled_lr_);
}

void MixedPrecisionOptimizer::step(const Tensor& clipped_norm, int64_t gbs, bool diagnostics) {
  const profile::Region mark(profile::Family::kOptimizer);
  if (!fp16()) {  // every step is applied
    follow_schedule();
    plugin_.step(++counts_.optimizer_steps, lr_, gbs, clipped_norm, diagnostics);
    counts_.lr_samples += gbs;
  } else if (params_.device().is_cpu()) {
    // The flag is in host memory already: an overflowing step is not given to the plugin.
    overflow_->start(found_inf_.raw());
    unresolved_ = true;
    unresolved_batch_ = gbs;
    const bool skip = *static_cast<const float*>(overflow_->get()) != 0.0f;
    follow_schedule();
    if (!skip) plugin_.step(counts_.optimizer_steps + 1, lr_, gbs, clipped_norm, diagnostics);
    resolve_overflow();
  } else {
    // The previous step's flag (read one step late, long since produced) decides this step's
    // count and learning rate; this step's own flag makes its kernels skip on the device.
    resolve_overflow();
    follow_schedule();
    plugin_.step(counts_.optimizer_steps + 1, lr_, gbs, clipped_norm, diagnostics, found_inf_);
    overflow_->start(found_inf_.raw());
    unresolved_ = true;
    unresolved_batch_ = gbs;
  }
}

// Computed on the host from copies, only when asked for (--log-params-norm,
// --log-num-zeros-in-grad), at log intervals. Sharded tensors are summed over the
// tensor-parallel group, replicated ones counted once.
double MixedPrecisionOptimizer::params_norm() {
  nn::ParameterStore& P = params_;
  const DpShards* shards = plugin_.shards();
  double sums[2] = {0, 0};  // sharded, replicated
  for (size_t i = 0; i < P.count(); ++i) {
    const auto id = static_cast<int>(i);
    double s = 0;
    for (const float x : to_host_f32(shards ? shards->master_piece(id) : P.master(id))) s += static_cast<double>(x) * x;
    sums[P.info(id).sharding.sharded ? 0 : 1] += s;
  }
  if (shards) dp_->all_reduce(sums, 2, comm::ReduceOp::kSum);  // the ranks' pieces
  tp_.all_reduce(&sums[0], 1, comm::ReduceOp::kSum);
  return std::sqrt(sums[0] + sums[1]);
}

int64_t MixedPrecisionOptimizer::num_zeros_in_grad() {
  nn::ParameterStore& P = params_;
  const DpShards* shards = plugin_.shards();
  double zeros[2] = {0, 0};
  for (size_t i = 0; i < P.count(); ++i) {
    const auto id = static_cast<int>(i);
    double z = 0;
    const Tensor g = shards ? main_grads().flat(shards->piece(id).at, static_cast<size_t>(shards->piece(id).numel()))
                            : P.grad(id);
    for (const float x : to_host_f32(g)) z += x == 0.0f ? 1.0 : 0.0;
    zeros[P.info(id).sharding.sharded ? 0 : 1] += z;
  }
  if (shards) dp_->all_reduce(zeros, 2, comm::ReduceOp::kSum);  // the ranks' pieces
  tp_.all_reduce(&zeros[0], 1, comm::ReduceOp::kSum);
  return static_cast<int64_t>(zeros[0] + zeros[1]);
}

}  // namespace megabatch::optim
