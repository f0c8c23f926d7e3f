#include "core/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <utility>

#include "core/comm/collectives.h"
#include "core/device/allocator.h"
#include "core/device/runtime.h"
#include "core/ops/gradients.h"
#include "core/ops/reduce.h"
#include "core/train/finite_weights.h"
#include "core/train/replica_check.h"
#include "core/train/step_profile.h"
#include "core/train/stop_signals.h"
#include "core/train/trainer_state.h"
#include "core/util/error.h"
#include "core/util/strings.h"

namespace megabatch::train {


Trainer::Trainer(TrainOptions options, Model& model, optim::PluginOptimizer& optimizer, comm::Communicator& tp,
                 BatchSource& train, BatchSource* validation, io::MetricsFile* metrics, std::ostream& console)
    : opt_(std::move(options)), model_(model), plugin_(optimizer),
      optimizer_({opt_.schedule, opt_.clip_grad, opt_.loss_scaler}, optimizer, model.parameters(), tp),
      tp_(tp), train_(train), valid_(validation), metrics_(metrics), console_(console),
      device_(model.parameters().device()), recorder_(opt_, fp16(), metrics, console),
      grad_sharded_(model.parameters().segments(true)), grad_replicated_(model.parameters().segments(false)) {
  check(opt_.micro_batch_size >= 1, "micro_batch_size must be >= 1");
  check(opt_.global_batch_size % opt_.micro_batch_size == 0, "global_batch_size (", opt_.global_batch_size,
        ") must be a multiple of micro_batch_size (", opt_.micro_batch_size, ")");
  check_rampup(opt_.rampup, opt_.global_batch_size, opt_.micro_batch_size, 1);
  // the ramp's first batch is its smallest
  if (opt_.noise_scale) check_noise_scale_batch(opt_.global_batch(0), opt_.micro_batch_size, opt_.rampup.on());
  check(opt_.noise_scale_ema >= 0 && opt_.noise_scale_ema < 1, "--noise-scale-ema must be in [0, 1) (got ",
        opt_.noise_scale_ema, ")");
  check(opt_.noise_scale_window >= 0, "--noise-scale-window must be >= 0 samples (0: a decay a step), got ",
        opt_.noise_scale_window);
}

Trainer::~Trainer() = default;

double Trainer::minutes_training() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count() / 60.0;
}

bool Trainer::stop_agreed() {
  float v[2] = {static_cast<float>(stop_signal_received()),  // 2, 10 or 15: exact in a float
                opt_.exit_duration_minutes > 0 && minutes_training() >= opt_.exit_duration_minutes ? 1.0f : 0.0f};
  if (world_->size() > 1) world_->all_reduce(v, 2, comm::ReduceOp::kMax);
  stop_signal_ = static_cast<int>(v[0]);
  return stop_signal_ != 0 || v[1] != 0.0f;
}

void Trainer::set_data_parallel(comm::Communicator& dp) {
  check(opt_.global_batch_size % (opt_.micro_batch_size * dp.size()) == 0, "global_batch_size (",
        opt_.global_batch_size, ") must be a multiple of micro_batch_size x data-parallel size (",
        opt_.micro_batch_size, " x ", dp.size(), ")");
  check_rampup(opt_.rampup, opt_.global_batch_size, opt_.micro_batch_size, dp.size());
  optimizer_.set_data_parallel(dp);
  optim::DpShards* shards = plugin_.shards();
  dp_ = &dp;
  buckets_.reset();
  if (dp.size() == 1) return;
  nn::ParameterStore& P = model_.parameters();
  std::vector<optim::DpShards::Range> ranges;
  if (!shards)
    ranges = bucket_ranges(P, bucket_elems(opt_.ddp_bucket_size, P.flat_size(), dp.size(), opt_.overlap_grad_reduce));
  buckets_ = std::make_unique<GradientBuckets>(P, dp, std::move(ranges), opt_.overlap_grad_reduce, shards);
}

// ---- the step ---------------------------------------------------------------------------

void Trainer::train_step() {
  const auto t0 = std::chrono::steady_clock::now();
  ++iteration_;
  step_batch_ = opt_.global_batch(consumed_);
  recorder_.begin_step();
  forward_backward();
  reduce_gradients();
  optimizer_step();
  consumed_ += step_batch_;
  record_step(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

void Trainer::skip_step() {
  ++iteration_;
  step_batch_ = opt_.global_batch(consumed_);
  console_ << "> iteration " << iteration_ << " skipped (--iterations-to-skip): samples " << consumed_ << " to "
           << consumed_ + step_batch_ - 1 << " passed over untrained" << std::endl;
  consumed_ += step_batch_;
}

void Trainer::first_forward(const LossOutput& out) {
  std::vector<std::string> extra;
  for (const auto& [name, count] : out.extra) extra.push_back(name);
  recorder_.allocate(extra, device_);
  if (opt_.noise_scale) {
    noise_sums_.resize({2}, DType::kF64, device_);
    noise_before_.resize({static_cast<int64_t>(model_.parameters().grads().numel())}, DType::kF32, device_);
  }
}

void Trainer::forward_backward() {
  // Data parallelism: rank r of D takes the r-th contiguous share of the global batch, in
  // micro-batches; micro-batch indices (which key dropout) are global, so D ranks compute
  // what one process with D times the accumulation steps computes.
  const int64_t D = dp_->size(), r = dp_->rank();
  const int64_t local = step_batch_ / (opt_.micro_batch_size * D);            // micro-batches on this rank
  const int64_t micro_batches = local * D;                                    // in the whole global batch
  // Under data parallelism the noise scale leaves out the last micro-batch of a rank where
  // it is not the only one: its buckets may start reducing during its backward pass.
  auto measured = [&](int64_t k) { return opt_.noise_scale && (k == 0 || !buckets_ || k < local - 1); };
  int64_t n_measured = 0;
  for (int64_t k = 0; k < local; ++k) n_measured += measured(k);
  // --calculate-per-token-loss: every token of the global batch weighs the same, so the lm
  // term's divisor is the global batch's counted tokens (over every rank) per micro-batch; the
  // micro-batches filled to count them are the ones trained on (not filled again)
  double lm_divisor = 0;
  if (opt_.per_token_loss) {
    step_batches_.resize(static_cast<size_t>(local));
    double tokens = 0;
    for (int64_t k = 0; k < local; ++k) {
      Batch& b = step_batches_[static_cast<size_t>(k)];
      train_.fill(static_cast<uint64_t>(consumed_ + (r * local + k) * opt_.micro_batch_size), opt_.micro_batch_size, b);
      tokens += static_cast<double>(counted_tokens(b));
    }
    dp_->all_reduce(&tokens, 1, comm::ReduceOp::kSum);
    lm_divisor = tokens > 0 ? tokens / static_cast<double>(micro_batches) : 1.0;  // none at all: no lm loss
  }
  model_.parameters().zero_grad();
  for (int64_t k = 0; k < local; ++k) {
    const int64_t m = r * local + k;
    if (!opt_.per_token_loss)
      train_.fill(static_cast<uint64_t>(consumed_ + m * opt_.micro_batch_size), opt_.micro_batch_size, batch_);
    const Batch& batch = opt_.per_token_loss ? step_batches_[static_cast<size_t>(k)] : batch_;
    StepContext ctx{opt_.seed, iteration_, m, true};
    if (fp16()) ctx.loss_scale = optimizer_.loss_scale();
    ctx.lm_divisor = lm_divisor;
    const LossOutput out = model_.forward(batch, ctx, 1.0f / static_cast<float>(micro_batches));
    if (opt_.per_token_loss) {
      const int64_t labelled = counted_tokens(batch);
      check(out.count == labelled, "--calculate-per-token-loss: the model counted ", out.count,
            " lm-loss tokens in micro-batch ", m, ", its labels ", labelled);
    }
    // the last micro-batch: buckets may start during its backward pass
    if (buckets_ && k == local - 1 && !measured(k)) buckets_->arm();
    model_.backward();
    if (!recorder_.allocated()) first_forward(out);
    std::vector<double> w = out.mean_weights();
    if (lm_divisor > 0) w[0] = 1.0 / lm_divisor;  // the logged lm loss: the global batch's token mean
    for (double& x : w) x /= static_cast<double>(micro_batches);
    ops::weighted_accumulate(recorder_.losses().flat(0, w.size()), out.sums, w);
    if (measured(k)) measure_micro_batch(k, local, n_measured * D);
  }
  if (opt_.noise_scale) comm::all_reduce(tp_, recorder_.slots(kSmallSharded), comm::ReduceOp::kSum);
}

// The noise scale's small-batch term: the mean over micro-batches of |gradient of one
// micro-batch|^2, each read as the accumulated gradient's growth over its forward and
// backward passes (the training gradients untouched): noise_before_ holds the sum of the
// micro-batches before, taken after the last one's backward pass (the LM head adds its
// weight gradient during the forward pass, so the forward counts). `measured`: the
// micro-batches measured over the data-parallel group, which sums them later.
void Trainer::measure_micro_batch(int64_t k, int64_t local, int64_t measured) {
  const Tensor& g = model_.parameters().grads();  // this micro-batch's gradient, scaled by 1 / micro_batches
  if (k == 0) {  // the gradients grew from zero
    ops::split_sum_squares(noise_sums_, g, grad_sharded_, grad_replicated_);
    const bool next_measured = k + 1 < local && (!buckets_ || k + 1 < local - 1);
    if (next_measured) copy(noise_before_, g);
  } else {  // |gradients now - noise_before_|^2, and noise_before_ = gradients now, in one pass
    ops::split_sum_squares_of_growth(noise_sums_, g, noise_before_, grad_sharded_, grad_replicated_);
  }
  const double mean = 1.0 / static_cast<double>(measured);
  ops::weighted_accumulate(recorder_.slots(kSmallSharded, 2), noise_sums_, {mean, mean});
}

void Trainer::reduce_gradients() {
  if (dp_->size() == 1) return;
  // the sum of the ranks' shares of the mean gradient of the global batch, in buckets
  // (those not started during the backward pass start now)
  buckets_->finish();
  if (!bucket_line_said_) {  // once per run: what the reduction looked like
    bucket_line_said_ = true;
    console_ << "> data parallel: gradients " << (plugin_.shards() ? "reduce-scattered" : "summed") << " over "
             << dp_->size() << " ranks (" << dp_->backend() << ") in " << buckets_->count() << " bucket(s)";
    if (opt_.overlap_grad_reduce)
      console_ << ", " << buckets_->started_early() << " started during the backward pass";
    console_ << std::endl;
  }
  comm::all_reduce(*dp_, recorder_.losses(), comm::ReduceOp::kSum);
  if (opt_.noise_scale)  // the mean over every rank's micro-batches
    comm::all_reduce(*dp_, recorder_.slots(kSmallSharded, 2), comm::ReduceOp::kSum);
}

void Trainer::optimizer_step() {
  optimizer_.unscale_and_check(recorder_.slots(kLossScale), recorder_.slots(kFoundInf));
  optimizer_.clip(recorder_.slots(kSqSharded, 2), recorder_.slots(kNorm, 3));
  const bool diagnostics = opt_.diagnostics_interval > 0 && iteration_ % opt_.diagnostics_interval == 0;
  optimizer_.step(recorder_.slots(kClippedNorm), step_batch_, diagnostics);
  if (diagnostics && plugin_.diagnostics().empty() && opt_.diagnostics_asked && !no_diagnostics_said_) {
    no_diagnostics_said_ = true;  // asked for by name, and nothing comes of it
    console_ << "> note: optimizer " << plugin_.plugin().name()
             << " reports no per-tensor diagnostics, so --diagnostics-interval " << opt_.diagnostics_interval
             << " adds nothing to metrics.h5" << std::endl;
  }
  if (!diagnostics || !metrics_ || plugin_.diagnostics().empty()) return;
  if (!names_written_) {
    std::vector<std::string> names;
    for (const auto& info : model_.parameters().infos()) names.push_back(info.name);
    metrics_->set_strings("optimizer/tensor_names", names);
    names_written_ = true;
  }
  metrics_->append("optimizer/iteration", static_cast<double>(iteration_));
  for (const auto& [series, values] : plugin_.diagnostics()) metrics_->append_row("optimizer/" + series, values);
}

void Trainer::record_step(double seconds) {
  recorder_.record(iteration_, consumed_, step_batch_, optimizer_.lr(), seconds, optimizer_.weight_decay(),
                   optimizer_.decoupled_lr());
  if (iteration_ % opt_.log_interval == 0 || iteration_ == 1 || iteration_ == opt_.train_iters) {  // Megatron logs iteration 1 too
    recorder_.drain();
    StepRecorder::LineExtras extras;  // in this order on every rank: both are collectives
    if (opt_.schedule.decoupled) extras.decoupled_lr = optimizer_.decoupled_lr();
    if (opt_.log_num_zeros_in_grad) extras.num_zeros = optimizer_.num_zeros_in_grad();
    if (opt_.log_params_norm) extras.params_norm = optimizer_.params_norm();
    extras.memory = memory_use();
    recorder_.write_log_line(iteration_, consumed_, optimizer_.lr(), extras);
  }
}

void Trainer::drain() { recorder_.drain(); }

StepRecorder::Memory Trainer::memory_use() const {
  const Device d = model_.parameters().device();
  const TensorMemory t = tensor_memory(d);
  StepRecorder::Memory m;
  m.allocated = static_cast<double>(t.in_use);
  m.max_allocated = static_cast<double>(t.peak);
  if (d.is_cpu()) {  // no cache: what the tensors hold is what the run holds
    m.reserved = m.allocated;
    m.max_reserved = m.max_allocated;
  } else {
    const runtime::AllocStats a = runtime::alloc_stats(d);
    m.reserved = static_cast<double>(a.bytes_reserved);
    m.max_reserved = static_cast<double>(a.max_bytes_reserved);
  }
  return m;
}

// ---- evaluation, checkpoints, the loop ---------------------------------------------------

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

// Megatron's evaluation block: "validation loss at iteration N |" during training, and
// "... at iteration N on validation set |" / "... on test set |" after it.
void Trainer::validate(BatchSource& data, const std::string& set) {
  drain();
  const auto losses = evaluate(data);
  std::string line = printf_string(" validation loss at iteration %lld", static_cast<long long>(iteration_)) +
                     (set.empty() ? std::string("") : " on " + set + " set") + " |";
  const std::string group = set == "test" ? "test/" : "validation/";
  if (metrics_) metrics_->append(group + "iteration", static_cast<double>(iteration_));
  for (const auto& [name, loss] : losses) {
    const double ppl = std::isnan(loss) ? loss : std::exp(std::min(20.0, loss));  // Megatron's cap; NaN stays NaN
    line += printf_string(" %s value: %.6E | %s PPL: %.6E |", name.c_str(), loss, name.c_str(), ppl);
    if (metrics_) {
      metrics_->append(group + io::series_name(name), loss);
      metrics_->append(group + io::series_name(name) + "_ppl", ppl);
    }
  }
  line += " ";
  const std::string rule(line.size() + 1, '-');
  console_ << rule << "\n" << line << "\n" << rule << std::endl;
  if (metrics_) metrics_->flush();
  // The forward pass overflowed on held-out data (or the weights did): the result a sweep reads
  // is gone, and the weights are no point to go on from (every rank computed the same losses).
  for (const auto& [name, loss] : losses)
    if (!std::isfinite(loss)) {
      recorder_.diverge(iteration_, (set.empty() ? std::string("validation") : set) + " " + name + " is " +
                                        printf_string("%g", loss));
      break;
    }
}

bool Trainer::weights_finite() {
  const std::string bad = nonfinite_weights(model_.parameters(), *world_);
  if (bad.empty()) return true;
  recorder_.diverge(iteration_, "the weights after iteration " + std::to_string(iteration_) + " are not finite (" +
                                    bad + "): its update made them so, and they are not checkpointed");
  return false;
}

void Trainer::final_evaluation() {
  if (!evaluating()) return;
  if (valid_) validate(*valid_, "validation");
  if (test_) validate(*test_, "test");
}

void Trainer::restore(const io::CheckpointState& state) {
  iteration_ = state.iteration;
  consumed_ = state.consumed_samples;
  const TrainerState t = read_trainer_state(state);
  if (t.noise_scale) recorder_.noise_scale().restore(*t.noise_scale);
  recorder_.set_skipped_total(t.skipped_iterations);
  optimizer_.restore(t.counts, t.loss_scaler ? &*t.loss_scaler : nullptr);
  last_saved_ = iteration_;
}

std::filesystem::path Trainer::save_checkpoint() {
  check(!opt_.save_dir.empty(), "save_checkpoint(): no --save directory");
  drain();  // the noise-scale averages and skip counts of every iteration so far
  optimizer_.settle();
  io::CheckpointState s = opt_.checkpoint;
  s.iteration = iteration_;
  s.consumed_samples = consumed_;
  s.seed = opt_.seed;
  s.loss_scale = fp16() ? optimizer_.loss_scaler_state().scale : 1.0;
  s.trainer = trainer_state_json(optimizer_, recorder_.noise_scale(), recorder_.skipped_total());
  const auto t0 = std::chrono::steady_clock::now();
  // Data-parallel replicas are identical: the first tensor-parallel group writes.
  // With the distributed optimizer the pieces of the state and of the fp32 masters are
  // gathered first (every DP rank).
  std::filesystem::path path = io::checkpoint_path(opt_.save_dir, iteration_);
  const optim::OptimizerState state = plugin_.whole_state();
  const optim::DpShards* shards = plugin_.shards();
  const std::vector<Tensor> masters = shards ? shards->whole_masters() : std::vector<Tensor>{};
  if (dp_->rank() == 0)
    path = io::save_checkpoint(opt_.save_dir, s, model_.parameters(), tp_, &state,
                               io::Kept{opt_.keep_checkpoints, opt_.save_retain_interval}, shards ? &masters : nullptr);
  dp_->barrier();
  last_saved_ = iteration_;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  console_ << printf_string(" saved checkpoint at iteration %8lld to %s (%.1f s)", static_cast<long long>(iteration_),
                     path.string().c_str(), dt)
           << std::endl;
  return path;
}

StopReason Trainer::loop() {
  const bool saving = !opt_.save_dir.empty();
  StepProfile profile(opt_.profile_steps, iteration_, device_, console_);
  const auto drained = [this] { drain(); };
  StopReason reason = StopReason::kFinished;
  const int64_t check_every = opt_.replica_check_interval;
  if (check_every > 0) check_replicas_agree(model_.parameters(), *dp_, iteration_, console_);
  while (iteration_ < opt_.train_iters) {
    if (opt_.iterations_to_skip.count(iteration_ + 1)) {
      skip_step();
    } else {
      profile.before_step(iteration_);
      train_step();
      profile.after_step(iteration_, drained);
    }
    const bool save_now = saving && opt_.save_interval > 0 && iteration_ % opt_.save_interval == 0;
    if (save_now) drain();  // a GPU run learns of a NaN here at the latest: never checkpoint one
    if (recorder_.diverged() || (save_now && !weights_finite())) {
      reason = StopReason::kDiverged;
      break;
    }
    if (check_every > 0 && iteration_ % check_every == 0)  // before its checkpoint: none of replicas that differ
      check_replicas_agree(model_.parameters(), *dp_, iteration_, console_);
    if (save_now) {
      if (metrics_) metrics_->flush();  // the metrics of every checkpointed iteration are on disk
      save_checkpoint();
    }
    if (stop_agreed()) {
      reason = stop_signal_ != 0 ? StopReason::kSignal : StopReason::kExitDuration;
      break;
    }
    if (opt_.exit_interval > 0 && iteration_ >= opt_.exit_interval && iteration_ < opt_.train_iters) {
      reason = StopReason::kExitInterval;
      break;
    }
    if (valid_ && opt_.eval_interval > 0 && evaluating() && iteration_ % opt_.eval_interval == 0 &&
        iteration_ < opt_.train_iters) {
      validate(*valid_, "");
      if (recorder_.diverged()) {
        reason = StopReason::kDiverged;
        break;
      }
    }
  }
  profile.finish(iteration_, drained);
  return reason;
}

void Trainer::finish(StopReason reason) {
  const bool saving = !opt_.save_dir.empty();
  // a resumable stop's last words
  const std::string resume = saving ? "; resume with --load " + opt_.save_dir : "; no --save directory, nothing was saved";
  if (reason == StopReason::kSignal)
    console_ << " stopped by signal " << stop_signal_ << " after iteration " << iteration_ << resume << std::endl;
  if (reason == StopReason::kExitInterval)
    console_ << " exiting after iteration " << iteration_ << " (--exit-interval)" << std::endl;
  if (reason == StopReason::kExitDuration)
    console_ << printf_string(" exiting after iteration %lld, %.2f minutes into training (--exit-duration-in-mins %g)",
                              static_cast<long long>(iteration_), minutes_training(), opt_.exit_duration_minutes)
             << resume << std::endl;
}

StopReason Trainer::run() {
  stop_signal_ = 0;
  started_ = std::chrono::steady_clock::now();
  const StopSignals handlers;  // (clears the signal received)
  recorder_.restart_interval_clock();
  try {
    StopReason reason = loop();
    drain();
    optimizer_.settle();
    if (!recorder_.diverged() && reason == StopReason::kFinished) final_evaluation();
    if (!recorder_.diverged() && !opt_.save_dir.empty() && last_saved_ != iteration_ && weights_finite())
      save_checkpoint();
    if (recorder_.diverged()) reason = StopReason::kDiverged;
    if (metrics_) metrics_->flush();
    if (reason == StopReason::kDiverged) {
      console_ << " diverged at iteration " << recorder_.diverged_at() << ": " << recorder_.divergence_reason()
               << (!opt_.save_dir.empty() && last_saved_ >= 0 ? "; the last checkpoint before it is kept" : "")
               << std::endl;
      return reason;
    }
    finish(reason);
    return reason;
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
}

}  // namespace megabatch::train
