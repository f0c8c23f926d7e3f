#include "core/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <signal.h>
#include <unistd.h>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#include "core/comm/collectives.h"
#include "core/ops/gradients.h"
#include "core/ops/reduce.h"
#include "core/device/profile.h"
#include "core/train/step_profile.h"
#include "core/train/stop_signals.h"
#include "core/util/error.h"

namespace megabatch::train {

namespace {
// A field of a checkpoint's trainer state ("lr_samples", "loss_scaler.scale") as
// save_checkpoint() writes it, T being int64_t or double; `fallback` where a checkpoint from
// before the field lacks it. A hand-edited or damaged attribute is refused naming the file
// and the field, not met as a JSON library's type error.
template <class T>
T trainer_field(const io::CheckpointState& state, const std::string& path, std::optional<T> fallback = std::nullopt) {
  const std::string where = state.file.string() + ": attribute 'trainer': ";
  const char* damaged = io::kDamagedCheckpoint;
  const size_t dot = path.find('.');
  const nlohmann::json* o = &state.trainer;
  if (dot != std::string::npos) {
    const std::string outer = path.substr(0, dot);
    check(state.trainer.contains(outer), where, "no '", outer, "'", damaged);
    o = &state.trainer[outer];
    check(o->is_object(), where, outer, " is ", o->dump(), ", not an object", damaged);
  }
  const std::string key = dot == std::string::npos ? path : path.substr(dot + 1);
  if (!o->contains(key)) {
    check(fallback.has_value(), where, "no '", path, "'", damaged);
    return *fallback;
  }
  const nlohmann::json& v = (*o)[key];
  constexpr bool integer = std::is_integral_v<T>;
  check(integer ? v.is_number_integer() : v.is_number(), where, path, " is ", v.dump(), ", not ",
        integer ? "an integer" : "a number", damaged);
  return v.get<T>();
}

std::string timestamp() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}
// "sop loss" -> "sop_loss": the metrics.h5 series of a console loss name.
std::string series_name(std::string name) {
  for (char& c : name)
    if (c == ' ') c = '_';
  return name;
}
std::string format(const char* fmt, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

// The slots of a step row after the 1 + E loss terms (L = 1 + E).
enum Slot : size_t {
  kSqSharded = 0, kSqReplicated,       // squared gradient norm, by sharding (summed over TP)
  kNorm, kClipCoeff, kClippedNorm,     // global norm, clip coefficient, norm after clipping
  kFoundInf, kLossScale,               // fp16: overflow flag, the loss scale of the step
  kSmallSharded, kSmallReplicated,     // a micro-batch's squared norm, mean over micro-batches (noise scale)
  kSlotsAfterLosses
};
constexpr int64_t kRingCapacity = 512;
}  // namespace

Trainer::Trainer(TrainOptions options, Model& model, optim::PluginOptimizer& optimizer, comm::Communicator& tp,
                 BatchSource& train, BatchSource* validation, io::MetricsFile* metrics, std::ostream& console)
    : opt_(std::move(options)), model_(model), optimizer_(optimizer), tp_(tp), train_(train), valid_(validation),
      metrics_(metrics), console_(console), device_(model.parameters().device()) {
  check(opt_.micro_batch_size >= 1, "micro_batch_size must be >= 1");
  check(opt_.global_batch_size % opt_.micro_batch_size == 0, "global_batch_size (", opt_.global_batch_size,
        ") must be a multiple of micro_batch_size (", opt_.micro_batch_size, ")");
  check(!opt_.noise_scale || opt_.global_batch_size >= 2 * opt_.micro_batch_size,
        "--log-noise-scale compares micro-batch and global-batch gradients, so a global batch needs at least 2 "
        "micro-batches (global batch ", opt_.global_batch_size, ", micro batch ", opt_.micro_batch_size,
        "); lower --micro-batch-size");
  check(opt_.noise_scale_ema >= 0 && opt_.noise_scale_ema < 1, "--noise-scale-ema must be in [0, 1) (got ",
        opt_.noise_scale_ema, ")");
  check(opt_.noise_scale_window >= 0, "--noise-scale-window must be >= 0 samples (0: a decay a step), got ",
        opt_.noise_scale_window);
  noise_scale_ = NoiseScaleEstimator(opt_.noise_scale_ema, opt_.noise_scale_window);
  const nn::ParameterStore& P = model_.parameters();
  for (const auto& info : P.infos())
    (info.sharding.sharded ? sharded_ : replicated_).emplace_back(info.offset, info.offset + info.numel);
  grad_sharded_ = sharded_;
  grad_replicated_ = replicated_;
  scaler_.resize({3}, DType::kF32, device_);
  found_inf_.resize({1}, DType::kF32, device_);
  const ops::LossScalerState s = ops::initial_scaler_state(opt_.loss_scaler);
  copy(scaler_, from_host(std::vector<float>{s.scale, s.growth_tracker, s.hysteresis_tracker}, {3}));
  overflow_ = std::make_unique<runtime::Readback>(device_, sizeof(float));
  interval_start_ = std::chrono::steady_clock::now();
}

Trainer::~Trainer() = default;

bool Trainer::stop_agreed() {
  float sig = static_cast<float>(stop_signal_received());  // 2, 10 or 15: exact in a float
  if (world_->size() > 1) world_->all_reduce(&sig, 1, comm::ReduceOp::kMax);
  stop_signal_ = static_cast<int>(sig);
  return stop_signal_ != 0;
}

void Trainer::set_data_parallel(comm::Communicator& dp) {
  check(opt_.global_batch_size % (opt_.micro_batch_size * dp.size()) == 0, "global_batch_size (",
        opt_.global_batch_size, ") must be a multiple of micro_batch_size x data-parallel size (",
        opt_.micro_batch_size, " x ", dp.size(), ")");
  optim::DpShards* shards = optimizer_.shards();
  check(!shards || &shards->dp() == &dp, "internal error: the optimizer's shards are over another data-parallel group");
  dp_ = &dp;
  buckets_.reset();
  if (dp.size() > 1) {
    nn::ParameterStore& P = model_.parameters();
    std::vector<optim::DpShards::Range> ranges;
    if (!shards)
      ranges = bucket_ranges(P, bucket_elems(opt_.ddp_bucket_size, P.flat_size(), dp.size(), opt_.overlap_grad_reduce));
    buckets_ = std::make_unique<GradientBuckets>(P, dp, std::move(ranges), opt_.overlap_grad_reduce, shards);
  }
  if (shards) {  // norms over the pieces of this rank's shards
    sharded_ = shards->segments(true);
    replicated_ = shards->segments(false);
  }
}

const Tensor& Trainer::main_grads() const {
  return optimizer_.shards() ? optimizer_.shards()->grads() : model_.parameters().grads();
}

ops::LossScalerState Trainer::loss_scaler_state() const {
  const std::vector<float> s = to_host_f32(scaler_);
  return {s[0], s[1], s[2]};
}

void Trainer::allocate_step_buffers(size_t extra_terms) {
  slots_ = 1 + extra_terms + kSlotsAfterLosses;
  step_.resize({static_cast<int64_t>(slots_)}, DType::kF64, device_);
  ring_.resize({std::min<int64_t>(kRingCapacity, std::max<int64_t>(opt_.log_interval, 1)), static_cast<int64_t>(slots_)},
               DType::kF64, device_);
  if (opt_.noise_scale) {
    noise_sums_.resize({2}, DType::kF64, device_);
    noise_before_.resize({static_cast<int64_t>(model_.parameters().grads().numel())}, DType::kF32, device_);
  }
}

// ---- the step ---------------------------------------------------------------------------

void Trainer::train_step() {
  const auto t0 = std::chrono::steady_clock::now();
  ++iteration_;
  if (ring_.defined() && ring_rows_ == ring_.dim(0)) drain();
  if (step_.defined()) step_.zero();
  forward_backward();
  reduce_gradients();
  unscale_and_check();
  clip_gradients();
  optimizer_step();
  consumed_ += opt_.global_batch_size;
  record_step(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

void Trainer::forward_backward() {
  // Data parallelism: rank r of D takes the r-th contiguous share of the global batch, in
  // micro-batches; micro-batch indices (which key dropout) are global, so D ranks compute
  // what one process with D times the accumulation steps computes.
  const int64_t D = dp_->size(), r = dp_->rank();
  const int64_t local = opt_.global_batch_size / (opt_.micro_batch_size * D);  // micro-batches on this rank
  const int64_t micro_batches = local * D;                                    // in the whole global batch
  // The noise scale's small-batch term: the mean over micro-batches of |gradient of one
  // micro-batch|^2, each read as the accumulated gradient's growth over its forward and
  // backward passes (the training gradients untouched): noise_before_ holds the sum of the
  // micro-batches before, taken after the last one's backward pass (the LM head adds its
  // weight gradient during the forward pass, so the forward counts). Under data
  // parallelism the last micro-batch of a rank is left out where it is not the only one:
  // its buckets may start reducing during its backward pass.
  auto measured = [&](int64_t k) { return opt_.noise_scale && (k == 0 || !buckets_ || k < local - 1); };
  int64_t n_measured = 0;
  for (int64_t k = 0; k < local; ++k) n_measured += measured(k);
  nn::ParameterStore& P = model_.parameters();
  P.zero_grad();
  for (int64_t k = 0; k < local; ++k) {
    const int64_t m = r * local + k;
    train_.fill(static_cast<uint64_t>(consumed_ + m * opt_.micro_batch_size), opt_.micro_batch_size, batch_);
    StepContext ctx{opt_.seed, iteration_, m, true};
    if (fp16()) ctx.loss_scale = scaler_.flat(0, 1);
    const LossOutput out = model_.forward(batch_, ctx, 1.0f / static_cast<float>(micro_batches));
    // the last micro-batch: buckets may start during its backward pass
    if (buckets_ && k == local - 1 && !measured(k)) buckets_->arm();
    model_.backward();
    if (!step_.defined()) {
      for (const auto& [name, count] : out.extra) extra_names_.push_back(name);
      allocate_step_buffers(extra_names_.size());
      step_.zero();
    }
    std::vector<double> w = out.mean_weights();
    for (double& x : w) x /= static_cast<double>(micro_batches);
    ops::weighted_accumulate(step_.flat(0, w.size()), out.sums, w);
    if (measured(k)) {  // this micro-batch's gradient alone (scaled by 1 / micro_batches)
      if (k == 0) {  // the gradients grew from zero
        ops::split_sum_squares(noise_sums_, P.grads(), grad_sharded_, grad_replicated_);
        if (k + 1 < local && measured(k + 1)) copy(noise_before_, P.grads());
      } else {  // |gradients now - noise_before_|^2, and noise_before_ = gradients now, in one pass
        ops::split_sum_squares_of_growth(noise_sums_, P.grads(), noise_before_, grad_sharded_, grad_replicated_);
      }
      const double mean = 1.0 / static_cast<double>(n_measured * D);  // summed over the DP group later
      ops::weighted_accumulate(step_.flat(loss_slots() + kSmallSharded, 2), noise_sums_, {mean, mean});
    }
  }
  if (opt_.noise_scale) comm::all_reduce(tp_, step_.flat(loss_slots() + kSmallSharded, 1), comm::ReduceOp::kSum);
}

void Trainer::reduce_gradients() {
  if (dp_->size() == 1) return;
  // the sum of the ranks' shares of the mean gradient of the global batch, in buckets
  // (those not started during the backward pass start now)
  buckets_->finish();
  if (!bucket_line_said_) {  // once per run: what the reduction looked like
    bucket_line_said_ = true;
    console_ << "> data parallel: gradients " << (optimizer_.shards() ? "reduce-scattered" : "summed") << " over "
             << dp_->size() << " ranks (" << dp_->backend() << ") in " << buckets_->count() << " bucket(s)";
    if (opt_.overlap_grad_reduce)
      console_ << ", " << buckets_->started_early() << " started during the backward pass";
    console_ << std::endl;
  }
  comm::all_reduce(*dp_, step_.flat(0, loss_slots()), comm::ReduceOp::kSum);
  if (opt_.noise_scale)  // the mean over every rank's micro-batches
    comm::all_reduce(*dp_, step_.flat(loss_slots() + kSmallSharded, 2), comm::ReduceOp::kSum);
}

void Trainer::unscale_and_check() {
  const profile::Region mark(profile::Family::kOptimizer);
  if (!fp16()) return;
  const size_t L = loss_slots();
  ops::weighted_accumulate(step_.flat(L + kLossScale, 1), scaler_.flat(0, 1), {1.0});  // the scale of this step
  ops::unscale_and_check(main_grads(), found_inf_, scaler_);
  // one overflowing rank skips the step everywhere (a local flag would let scales diverge)
  comm::all_reduce(tp_, found_inf_, comm::ReduceOp::kMax);
  comm::all_reduce(*dp_, found_inf_, comm::ReduceOp::kMax);
  ops::weighted_accumulate(step_.flat(L + kFoundInf, 1), found_inf_, {1.0});
  ops::loss_scaler_update(scaler_, found_inf_, opt_.loss_scaler);
}

void Trainer::clip_gradients() {
  const profile::Region mark(profile::Family::kOptimizer);
  const size_t L = loss_slots();
  const Tensor& g = main_grads();
  const Tensor sums = step_.flat(L + kSqSharded, 2), norm = step_.flat(L + kNorm, 3);
  ops::split_sum_squares(sums, g, sharded_, replicated_);
  if (optimizer_.shards()) comm::all_reduce(*dp_, sums, comm::ReduceOp::kSum);  // the ranks' pieces
  comm::all_reduce(tp_, sums.flat(0, 1), comm::ReduceOp::kSum);  // sharded tensors: their squares over the group
  ops::clip_coefficient(norm, sums, opt_.clip_grad);
  ops::scale_by(g, norm, 1);
}

void Trainer::resolve_overflow() {
  if (overflow_iteration_ == 0) return;  // none started, or this one counted already
  const float flag = *static_cast<const float*>(overflow_->get());
  if (flag == 0.0f) {
    ++optimizer_steps_;
    lr_samples_ += opt_.global_batch_size;
  }
  // (a skipped step is counted from the drained rows)
  overflow_iteration_ = 0;
}

void Trainer::optimizer_step() {
  const profile::Region mark(profile::Family::kOptimizer);
  const size_t L = loss_slots();
  const bool diagnostics = opt_.diagnostics_interval > 0 && iteration_ % opt_.diagnostics_interval == 0;
  const Tensor clipped_norm = step_.flat(L + kClippedNorm, 1);
  if (!fp16()) {  // every step is applied
    step_lr_ = opt_.schedule.lr(lr_samples_);
    optimizer_.step(++optimizer_steps_, step_lr_, opt_.global_batch_size, clipped_norm, diagnostics);
    lr_samples_ += opt_.global_batch_size;
  } else if (device_.is_cpu()) {
    // The flag is in host memory already: an overflowing step is not given to the optimizer.
    overflow_->start(found_inf_.raw());
    overflow_iteration_ = iteration_;
    const bool skip = *static_cast<const float*>(overflow_->get()) != 0.0f;
    step_lr_ = opt_.schedule.lr(lr_samples_);
    if (!skip) optimizer_.step(optimizer_steps_ + 1, step_lr_, opt_.global_batch_size, clipped_norm, diagnostics);
    resolve_overflow();
  } else {
    // The previous step's flag (read one step late, long since produced) decides this step's
    // count and learning rate; this step's own flag makes its kernels skip on the device.
    resolve_overflow();
    step_lr_ = opt_.schedule.lr(lr_samples_);
    optimizer_.step(optimizer_steps_ + 1, step_lr_, opt_.global_batch_size, clipped_norm, diagnostics, found_inf_);
    overflow_->start(found_inf_.raw());
    overflow_iteration_ = iteration_;
  }
  if (diagnostics && metrics_ && !optimizer_.diagnostics().empty()) {
    if (!names_written_) {
      std::vector<std::string> names;
      for (const auto& info : model_.parameters().infos()) names.push_back(info.name);
      metrics_->set_strings("optimizer/tensor_names", names);
      names_written_ = true;
    }
    metrics_->append("optimizer/iteration", static_cast<double>(iteration_));
    for (const auto& [series, values] : optimizer_.diagnostics()) metrics_->append_row("optimizer/" + series, values);
  }
}

void Trainer::record_step(double seconds) {
  if (ring_rows_ == 0) ring_first_ = iteration_;
  copy(ring_.rows(ring_rows_, ring_rows_ + 1).view({static_cast<int64_t>(slots_)}), step_);
  ring_seconds_.push_back(seconds);
  ring_lr_.push_back(step_lr_);
  ring_consumed_.push_back(consumed_);
  ++ring_rows_;
  // On the CPU the row is already in host memory: catch a diverged run at once.
  if (device_.is_cpu()) {
    const double* row = step_.data<double>();
    const size_t L = loss_slots();
    double objective = 0;
    for (size_t k = 0; k < L; ++k) objective += row[k];
    const bool skipped = fp16() && row[L + kFoundInf] != 0.0;
    if (!skipped && (!std::isfinite(objective) || !std::isfinite(row[L + kNorm]))) drain();
  }
  if (iteration_ % opt_.log_interval == 0 || iteration_ == 1 || iteration_ == opt_.train_iters) {  // Megatron logs iteration 1 too
    drain();
    write_log_line();
  }
}

// ---- what the host learns at a drain ------------------------------------------------------

void Trainer::drain() {
  if (ring_rows_ == 0) return;
  const std::vector<double> rows = to_host_f64(ring_.rows(0, ring_rows_));  // the one read of the interval
  const size_t L = loss_slots(), S = slots_;
  const int64_t micro_batches = opt_.global_batch_size / opt_.micro_batch_size;
  if (interval_extra_.size() != extra_names_.size()) interval_extra_.assign(extra_names_.size(), 0.0);
  for (int64_t r = 0; r < ring_rows_; ++r) {
    const double* v = rows.data() + static_cast<size_t>(r) * S;
    const int64_t it = ring_first_ + r;
    const bool skipped = fp16() && v[L + kFoundInf] != 0.0;
    const double loss = v[0], norm = v[L + kNorm];
    double objective = 0;
    for (size_t k = 0; k < L; ++k) objective += v[k];
    const double scale = fp16() ? v[L + kLossScale] : 1.0;
    if (skipped && !std::isfinite(objective)) ++interval_nan_;  // fp16: counted and skipped, as Megatron
    if (!skipped && (!std::isfinite(objective) || !std::isfinite(norm)) && diverged_at_ == 0) {
      diverged_at_ = it;  // recorded in the metrics below; run() stops after this step
      divergence_reason_ = std::string(!std::isfinite(objective) ? "lm loss" : "gradient norm") + " is " +
                           format("%g", !std::isfinite(objective) ? objective : norm);
    }
    NoiseScaleEstimator::Step noise{std::nan(""), std::nan("")};  // NaN: not estimated at this step
    if (opt_.noise_scale && !skipped) {
      const double mb = static_cast<double>(micro_batches);
      const double small_sq = (v[L + kSmallSharded] + v[L + kSmallReplicated]) * mb * mb / (scale * scale);
      if (std::isfinite(small_sq))
        noise = noise_scale_.add(small_sq, static_cast<double>(opt_.micro_batch_size), norm * norm,
                                 static_cast<double>(opt_.global_batch_size));
    }
    if (skipped) ++skipped_total_, ++interval_skipped_;
    const double dt = ring_seconds_[static_cast<size_t>(r)];
    losses_.push_back(loss);
    interval_loss_ += loss;
    for (size_t k = 0; k < extra_names_.size(); ++k) interval_extra_[k] += v[1 + k];
    interval_grad_norm_ = norm;
    interval_loss_scale_ = scale;
    ++interval_iters_;
    if (metrics_) {
      metrics_->append("train/iteration", static_cast<double>(it));
      metrics_->append("train/consumed_samples", static_cast<double>(ring_consumed_[static_cast<size_t>(r)]));
      metrics_->append("train/lm_loss", loss);
      for (size_t k = 0; k < extra_names_.size(); ++k) metrics_->append("train/" + series_name(extra_names_[k]), v[1 + k]);
      metrics_->append("train/learning_rate", ring_lr_[static_cast<size_t>(r)]);
      metrics_->append("train/grad_norm", norm);
      if (opt_.noise_scale) {  // each step's own estimates, for averages centred anywhere (sweep analyze)
        metrics_->append("train/noise_grad_sq_norm", noise.grad_sq_norm);
        metrics_->append("train/noise_trace_cov", noise.trace_cov);
      }
      if (fp16()) {
        metrics_->append("train/loss_scale", scale);
        metrics_->append("train/skipped", skipped ? 1.0 : 0.0);
      }
      metrics_->append("train/tokens_per_second",
                       static_cast<double>(opt_.global_batch_size * opt_.tokens_per_sample) / dt);
      metrics_->append("train/iteration_time_ms", dt * 1e3);
    }
  }
  ring_rows_ = 0;
  ring_seconds_.clear();
  ring_lr_.clear();
  ring_consumed_.clear();
}

void Trainer::write_log_line() {
  if (interval_iters_ == 0) return;
  const double k = static_cast<double>(interval_iters_);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - interval_start_).count();
  std::string line = " [" + timestamp() + "]";
  line += format(" iteration %8lld/%8lld |", static_cast<long long>(iteration_), static_cast<long long>(opt_.train_iters));
  line += format(" consumed samples: %12lld |", static_cast<long long>(consumed_));
  line += format(" elapsed time per iteration (ms): %.1f |", seconds / k * 1e3);
  if (opt_.log_throughput)
    line += format(" throughput per GPU (TFLOP/s/GPU): %.1f |",
                   opt_.flops_per_iteration / (seconds / k * 1e12 * static_cast<double>(opt_.world_size)));
  line += format(" throughput (tokens/s): %.0f |",
                 static_cast<double>(opt_.global_batch_size * opt_.tokens_per_sample) * k / seconds);
  line += format(" learning rate: %.6E |", step_lr_);
  line += format(" global batch size: %5lld |", static_cast<long long>(opt_.global_batch_size));
  line += format(" lm loss: %.6E |", interval_loss_ / k);
  for (size_t e = 0; e < extra_names_.size(); ++e) line += format(" %s: %.6E |", extra_names_[e].c_str(), interval_extra_[e] / k);
  line += format(" loss scale: %.1f |", interval_loss_scale_);
  line += format(" grad norm: %.3f |", interval_grad_norm_);
  if (opt_.log_num_zeros_in_grad) line += format(" num zeros: %lld |", static_cast<long long>(num_zeros_in_grad()));
  if (opt_.log_params_norm) line += format(" params norm: %.3f |", params_norm());
  if (opt_.noise_scale) line += format(" noise scale: %.4g |", noise_scale_.b_simple());
  line += format(" number of skipped iterations: %3lld |", static_cast<long long>(interval_skipped_));
  line += format(" number of nan iterations: %3lld |", static_cast<long long>(interval_nan_));
  const double mean_loss = interval_loss_ / k;
  intervals_above_ = opt_.divergence_loss > 0 && mean_loss > opt_.divergence_loss ? intervals_above_ + 1 : 0;
  if (diverged_at_ == 0 && opt_.divergence_intervals > 0 && intervals_above_ >= opt_.divergence_intervals) {
    diverged_at_ = iteration_;
    divergence_reason_ = format("lm loss above %g (divergence_loss) for %lld log intervals, last %g", opt_.divergence_loss,
                                static_cast<long long>(intervals_above_), mean_loss);
  }
  if (metrics_ && opt_.noise_scale) {
    metrics_->append("noise_scale/iteration", static_cast<double>(iteration_));
    metrics_->append("noise_scale/b_simple", noise_scale_.b_simple());
    metrics_->append("noise_scale/grad_sq_norm", noise_scale_.grad_sq_norm());
    metrics_->append("noise_scale/trace_cov", noise_scale_.trace_cov());
  }
  interval_loss_ = 0;
  std::fill(interval_extra_.begin(), interval_extra_.end(), 0.0);
  interval_iters_ = interval_skipped_ = interval_nan_ = 0;
  interval_start_ = std::chrono::steady_clock::now();
  // the metrics first: a logged line means its interval is on disk (a kill right after the
  // line appears loses nothing of it)
  if (metrics_) metrics_->flush();
  console_ << line << std::endl;
}

// ---- evaluation, checkpoints, the loop ---------------------------------------------------

// Computed on the host from copies, only when asked for (--log-params-norm,
// --log-num-zeros-in-grad), at log intervals. Sharded tensors are summed over the
// tensor-parallel group, replicated ones counted once.
double Trainer::params_norm() {
  nn::ParameterStore& P = model_.parameters();
  const optim::DpShards* shards = optimizer_.shards();
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

int64_t Trainer::num_zeros_in_grad() {
  nn::ParameterStore& P = model_.parameters();
  const optim::DpShards* shards = optimizer_.shards();
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

int64_t Trainer::eval_sample_count(const BatchSource& data) const {
  if (opt_.eval_samples <= 0) return opt_.eval_iters * opt_.global_batch_size;  // Megatron's: the split repeats
  const auto epoch = static_cast<int64_t>(data.samples_per_epoch());
  return epoch > 0 ? std::min(opt_.eval_samples, epoch) : opt_.eval_samples;
}

std::vector<std::pair<std::string, double>> Trainer::evaluate(BatchSource& data) {
  Tensor sums;  // f64 on the device: summed losses of every term
  int64_t count = 0;
  std::vector<std::pair<std::string, int64_t>> extra;
  const int64_t samples = eval_sample_count(data);
  for (int64_t m = 0, next = 0; next < samples; ++m) {
    data.fill(static_cast<uint64_t>(next), std::min<int64_t>(opt_.micro_batch_size, samples - next), batch_);
    next += batch_.batch;
    const LossOutput out = model_.forward(batch_, StepContext{opt_.seed, iteration_, m, false}, 0.0f);
    if (!sums.defined()) {
      sums.resize({static_cast<int64_t>(1 + out.extra.size())}, DType::kF64, device_);
      extra = out.extra;
      for (auto& e : extra) e.second = 0;
    }
    ops::weighted_accumulate(sums, out.sums, std::vector<double>(1 + out.extra.size(), 1.0));
    count += out.count;
    for (size_t k = 0; k < extra.size() && k < out.extra.size(); ++k) extra[k].second += out.extra[k].second;
  }
  const std::vector<double> s = sums.defined() ? to_host_f64(sums) : std::vector<double>{0.0};
  std::vector<std::pair<std::string, double>> result{{"lm loss", count ? s[0] / static_cast<double>(count) : 0.0}};
  for (size_t k = 0; k < extra.size(); ++k)
    result.emplace_back(extra[k].first, extra[k].second ? s[k + 1] / static_cast<double>(extra[k].second) : 0.0);
  return result;
}

void Trainer::restore(const io::CheckpointState& state) {
  const nlohmann::json& t = state.trainer;
  iteration_ = state.iteration;
  consumed_ = state.consumed_samples;
  if (t.contains("noise_scale")) {  // checked field by field, then read by the estimator
    for (const char* f : {"noise_scale.g2", "noise_scale.trace", "noise_scale.decay_pow"})
      trainer_field<double>(state, f);
    trainer_field<int64_t>(state, "noise_scale.count");
    noise_scale_.restore(t["noise_scale"]);
  }
  // checkpoints before loss scaling: every iteration was an optimizer step
  optimizer_steps_ = trainer_field<int64_t>(state, "optimizer_steps", state.iteration);
  lr_samples_ = trainer_field<int64_t>(state, "lr_samples", state.consumed_samples);
  skipped_total_ = trainer_field<int64_t>(state, "skipped_iterations", int64_t{0});
  if (t.contains("loss_scaler")) {
    std::vector<float> scaler;
    for (const char* f : {"loss_scaler.scale", "loss_scaler.growth_tracker", "loss_scaler.hysteresis_tracker"})
      scaler.push_back(static_cast<float>(trainer_field<double>(state, f)));
    copy(scaler_, from_host(scaler, {3}));
  }
  last_saved_ = iteration_;
}

std::filesystem::path Trainer::save_checkpoint() {
  check(!opt_.save_dir.empty(), "save_checkpoint(): no --save directory");
  drain();  // the noise-scale averages and skip counts of every iteration so far
  if (device_.is_cuda()) resolve_overflow();
  io::CheckpointState s = opt_.checkpoint;
  s.iteration = iteration_;
  s.consumed_samples = consumed_;
  s.seed = opt_.seed;
  const ops::LossScalerState scaler = loss_scaler_state();
  s.loss_scale = fp16() ? scaler.scale : 1.0;
  // The LR schedule is a pure function of the applied steps' samples and these settings;
  // they are stored so that a checkpoint says which schedule produced it.
  const auto& sc = opt_.schedule;
  s.trainer = {{"noise_scale", noise_scale_.state()},
               {"optimizer_steps", optimizer_steps_},
               {"lr_samples", lr_samples_},
               {"skipped_iterations", skipped_total_},
               {"loss_scaler",
                {{"scale", scaler.scale}, {"growth_tracker", scaler.growth_tracker},
                 {"hysteresis_tracker", scaler.hysteresis_tracker}, {"dynamic", opt_.loss_scaler.dynamic}}},
               {"lr_schedule",
                {{"max_lr", sc.max_lr}, {"min_lr", sc.min_lr}, {"warmup_samples", sc.warmup_samples},
                 {"decay_samples", sc.decay_samples}, {"style", optim::decay_style_name(sc.style)}, {"power", sc.power},
                 {"lr", sc.lr(lr_samples_)}}}};
  const auto t0 = std::chrono::steady_clock::now();
  // Data-parallel replicas are identical: the first tensor-parallel group writes.
  // With the distributed optimizer the pieces of the state and of the fp32 masters are
  // gathered first (every DP rank).
  std::filesystem::path path = io::checkpoint_path(opt_.save_dir, iteration_);
  const optim::OptimizerState state = optimizer_.whole_state();
  const optim::DpShards* shards = optimizer_.shards();
  const std::vector<Tensor> masters = shards ? shards->whole_masters() : std::vector<Tensor>{};
  if (dp_->rank() == 0)
    path = io::save_checkpoint(opt_.save_dir, s, model_.parameters(), tp_, &state, opt_.keep_checkpoints,
                               shards ? &masters : nullptr);
  dp_->barrier();
  last_saved_ = iteration_;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  console_ << format(" saved checkpoint at iteration %8lld to %s (%.1f s)", static_cast<long long>(iteration_),
                     path.string().c_str(), dt)
           << std::endl;
  return path;
}

StopReason Trainer::run() {
  // Megatron's evaluation block: "validation loss at iteration N |" during training, and
  // "... at iteration N on validation set |" / "... on test set |" after it.
  auto validate = [&](BatchSource& data, const std::string& set) {
    drain();
    const auto losses = evaluate(data);
    std::string line = format(" validation loss at iteration %lld", static_cast<long long>(iteration_)) +
                       (set.empty() ? std::string("") : " on " + set + " set") + " |";
    const std::string group = set == "test" ? "test/" : "validation/";
    if (metrics_) metrics_->append(group + "iteration", static_cast<double>(iteration_));
    for (const auto& [name, loss] : losses) {
      const double ppl = std::exp(std::min(20.0, loss));
      line += format(" %s value: %.6E | %s PPL: %.6E |", name.c_str(), loss, name.c_str(), ppl);
      if (metrics_) {
        metrics_->append(group + series_name(name), loss);
        metrics_->append(group + series_name(name) + "_ppl", ppl);
      }
    }
    line += " ";
    const std::string rule(line.size() + 1, '-');
    console_ << rule << "\n" << line << "\n" << rule << std::endl;
    if (metrics_) metrics_->flush();
  };
  const bool saving = !opt_.save_dir.empty();
  auto save_once = [&]() {
    if (saving && last_saved_ != iteration_) save_checkpoint();
  };
  stop_signal_ = 0;
  const StopSignals handlers;  // (clears the signal received)
  interval_start_ = std::chrono::steady_clock::now();
  StopReason reason = StopReason::kFinished;
  StepProfile profile(opt_.profile_steps, iteration_, device_, console_);
  const auto drained = [this] { drain(); };
  try {
    while (iteration_ < opt_.train_iters) {
      profile.before_step(iteration_);
      train_step();
      profile.after_step(iteration_, drained);
      const bool save_now = saving && opt_.save_interval > 0 && iteration_ % opt_.save_interval == 0;
      if (save_now) drain();  // a GPU run learns of a NaN here at the latest: never checkpoint one
      if (diverged_at_ != 0) {
        reason = StopReason::kDiverged;
        break;
      }
      if (save_now) {
        if (metrics_) metrics_->flush();  // the metrics of every checkpointed iteration are on disk
        save_checkpoint();
      }
      if (stop_agreed()) {
        reason = StopReason::kSignal;
        break;
      }
      if (opt_.exit_interval > 0 && iteration_ >= opt_.exit_interval && iteration_ < opt_.train_iters) {
        reason = StopReason::kExitInterval;
        break;
      }
      if (valid_ && opt_.eval_interval > 0 && evaluating() && iteration_ % opt_.eval_interval == 0 &&
          iteration_ < opt_.train_iters)
        validate(*valid_, "");
    }
    profile.finish(iteration_, drained);
    drain();
    if (device_.is_cuda()) resolve_overflow();
    if (diverged_at_ != 0) reason = StopReason::kDiverged;
    if (metrics_) metrics_->flush();
    if (reason == StopReason::kDiverged) {
      console_ << " diverged at iteration " << diverged_at_ << ": " << divergence_reason_
               << (saving && last_saved_ >= 0 ? "; the last checkpoint before it is kept" : "") << std::endl;
      return reason;
    }
    if (reason == StopReason::kFinished && valid_ && evaluating()) validate(*valid_, "validation");
    if (reason == StopReason::kFinished && test_ && evaluating()) validate(*test_, "test");
    save_once();
    if (reason == StopReason::kSignal)
      console_ << " stopped by signal " << stop_signal_ << " after iteration " << iteration_
               << (saving ? "; resume with --load " + opt_.save_dir : "; no --save directory, nothing was saved")
               << std::endl;
    if (reason == StopReason::kExitInterval)
      console_ << " exiting after iteration " << iteration_ << " (--exit-interval)" << std::endl;
  } catch (...) {
    if (metrics_) {
      try {
        drain();
      } catch (const std::exception&) {
      }
      try {
        metrics_->flush();
      } catch (const std::exception&) {
      }
    }
    throw;
  }
  return reason;
}

}  // namespace megabatch::train
