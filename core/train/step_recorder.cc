#include "core/train/step_recorder.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <ostream>

#include "core/device/runtime.h"
#include "core/ops/reduce.h"
#include "core/util/strings.h"

namespace megabatch::train {

namespace {
constexpr int64_t kRingCapacity = 512;

std::string timestamp() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}
}  // namespace

StepRecorder::StepRecorder(const TrainOptions& options, bool fp16, io::MetricsFile* metrics, std::ostream& console)
    : opt_(options), fp16_(fp16), metrics_(metrics), console_(console),
      noise_scale_(options.noise_scale_ema, options.noise_scale_window) {
  restart_interval_clock();
}

void StepRecorder::allocate(const std::vector<std::string>& extra_names, Device device) {
  extra_names_ = extra_names;
  slots_ = loss_slots() + kSlotsAfterLosses;
  step_.resize({static_cast<int64_t>(slots_)}, DType::kF64, device);
  ring_.resize({std::min<int64_t>(kRingCapacity, std::max<int64_t>(opt_.log_interval, 1)), static_cast<int64_t>(slots_)},
               DType::kF64, device);
  step_.zero();
}

void StepRecorder::begin_step() {
  if (step_.defined()) step_.zero();
}

void StepRecorder::record(int64_t iteration, int64_t consumed, int64_t batch, double lr, double seconds,
                          double weight_decay, double decoupled_lr) {
  if (ring_rows_ == 0) ring_first_ = iteration;
  copy(ring_.rows(ring_rows_, ring_rows_ + 1).view({static_cast<int64_t>(slots_)}), step_);
  ring_seconds_.push_back(seconds);
  ring_lr_.push_back(lr);
  ring_wd_.push_back(weight_decay);
  ring_dlr_.push_back(decoupled_lr);
  ring_consumed_.push_back(consumed);
  ring_batch_.push_back(batch);
  ++ring_rows_;
  if (ring_rows_ == ring_.dim(0)) {  // full: read now, after this step's time was taken (its wait lands in it)
    drain();
    return;
  }
  if (!runtime::host_reads_directly(step_.device())) return;
  // The row is in host memory already: catch a diverged run at once.
  const double* row = step_.data<double>();
  const size_t L = loss_slots();
  double objective = 0;
  for (size_t k = 0; k < L; ++k) objective += row[k];
  const bool skipped = fp16_ && row[L + kFoundInf] != 0.0;
  if (!std::isfinite(objective) || (!skipped && !std::isfinite(row[L + kNorm]))) drain();
}

// ---- what the host learns at a drain ------------------------------------------------------

void StepRecorder::drain() {
  if (ring_rows_ == 0) return;
  // The one read of the interval. On a GPU the host runs ahead of the device, and this read
  // waits for the steps it has queued: that wait is the last row's, so that the rows' times
  // (train/iteration_time_ms) add up to the time the steps took, not the time to queue them.
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<double> rows = to_host_f64(ring_.rows(0, ring_rows_));
  ring_seconds_.back() += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (interval_extra_.size() != extra_names_.size()) interval_extra_.assign(extra_names_.size(), 0.0);
  for (int64_t r = 0; r < ring_rows_; ++r)
    drain_row(rows.data() + static_cast<size_t>(r) * slots_, ring_first_ + r, static_cast<size_t>(r));
  ring_rows_ = 0;
  ring_seconds_.clear();
  ring_lr_.clear();
  ring_wd_.clear();
  ring_dlr_.clear();
  ring_consumed_.clear();
  ring_batch_.clear();
}

void StepRecorder::drain_row(const double* v, int64_t it, size_t r) {
  const size_t L = loss_slots();
  const bool skipped = fp16_ && v[L + kFoundInf] != 0.0;
  const double loss = v[0], norm = v[L + kNorm];
  double objective = 0;
  for (size_t k = 0; k < L; ++k) objective += v[k];
  const double scale = fp16_ ? v[L + kLossScale] : 1.0;
  if (skipped && !std::isfinite(objective)) ++interval_nan_;  // fp16: counted, as Megatron's line does
  // A NaN or infinite loss stops the run, an fp16 one too: the forward pass overflowed, which no
  // loss scale mends (Megatron's --check-for-nan-in-loss-and-grad, its default, stops there too).
  // An fp16 step whose gradients alone overflowed is the loss scaler's to skip.
  // (recorded in the metrics below; the loop stops after this step)
  if (!std::isfinite(objective) || (!skipped && !std::isfinite(norm)))
    diverge(it, std::string(!std::isfinite(objective) ? "lm loss" : "gradient norm") + " is " +
                    printf_string("%g", !std::isfinite(objective) ? objective : norm));
  const int64_t batch = ring_batch_[r];
  NoiseScaleEstimator::Step noise{std::nan(""), std::nan("")};  // NaN: not estimated at this step
  if (opt_.noise_scale && !skipped) {
    const double mb = static_cast<double>(batch / opt_.micro_batch_size);
    const double small_sq = (v[L + kSmallSharded] + v[L + kSmallReplicated]) * mb * mb / (scale * scale);
    if (std::isfinite(small_sq))
      noise = noise_scale_.add(small_sq, static_cast<double>(opt_.micro_batch_size), norm * norm,
                               static_cast<double>(batch));
  }
  if (skipped) ++skipped_total_, ++interval_skipped_;
  const double dt = ring_seconds_[r];
  losses_.push_back(loss);
  interval_loss_ += loss;
  for (size_t k = 0; k < extra_names_.size(); ++k) interval_extra_[k] += v[1 + k];
  interval_grad_norm_ = norm;
  interval_loss_scale_ = scale;
  ++interval_iters_;
  interval_samples_ += batch;
  last_batch_ = batch;
  if (!metrics_) return;
  metrics_->append("train/iteration", static_cast<double>(it));
  metrics_->append("train/consumed_samples", static_cast<double>(ring_consumed_[r]));
  metrics_->append("train/lm_loss", loss);
  for (size_t k = 0; k < extra_names_.size(); ++k) metrics_->append("train/" + io::series_name(extra_names_[k]), v[1 + k]);
  metrics_->append("train/learning_rate", ring_lr_[r]);
  if (opt_.schedule.decoupled) metrics_->append("train/decoupled_learning_rate", ring_dlr_[r]);
  if (opt_.schedule.wd.scheduled()) metrics_->append("train/weight_decay", ring_wd_[r]);
  metrics_->append("train/grad_norm", norm);
  if (opt_.noise_scale) {  // each step's own estimates, for averages centred anywhere (sweep analyze)
    metrics_->append("train/noise_grad_sq_norm", noise.grad_sq_norm);
    metrics_->append("train/noise_trace_cov", noise.trace_cov);
  }
  if (fp16_) {
    metrics_->append("train/loss_scale", scale);
    metrics_->append("train/skipped", skipped ? 1.0 : 0.0);
  }
  if (opt_.rampup.on()) metrics_->append("train/global_batch_size", static_cast<double>(batch));
  metrics_->append("train/tokens_per_second", static_cast<double>(batch * opt_.tokens_per_sample) / dt);
  metrics_->append("train/iteration_time_ms", dt * 1e3);
}

void StepRecorder::write_log_line(int64_t iteration, int64_t consumed, double lr, const LineExtras& extras) {
  if (interval_iters_ == 0) return;
  const double k = static_cast<double>(interval_iters_);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - interval_start_).count();
  std::string line = " [" + timestamp() + "]";
  line += printf_string(" iteration %8lld/%8lld |", static_cast<long long>(iteration), static_cast<long long>(opt_.train_iters));
  line += printf_string(" consumed samples: %12lld |", static_cast<long long>(consumed));
  line += printf_string(" elapsed time per iteration (ms): %.1f |", seconds / k * 1e3);
  const auto samples = static_cast<double>(interval_samples_);
  if (opt_.log_throughput)
    line += printf_string(" throughput per GPU (TFLOP/s/GPU): %.1f |",
                          opt_.flops_per_sample * samples / (seconds * 1e12 * static_cast<double>(opt_.world_size)));
  line +=
      printf_string(" throughput (tokens/s): %.0f |", samples * static_cast<double>(opt_.tokens_per_sample) / seconds);
  line += printf_string(" learning rate: %.6E |", lr);
  if (extras.decoupled_lr) line += printf_string(" decoupled learning rate: %.6E |", *extras.decoupled_lr);
  line += printf_string(" global batch size: %5lld |", static_cast<long long>(last_batch_));
  line += printf_string(" lm loss: %.6E |", interval_loss_ / k);
  for (size_t e = 0; e < extra_names_.size(); ++e) line += printf_string(" %s: %.6E |", extra_names_[e].c_str(), interval_extra_[e] / k);
  line += printf_string(" loss scale: %.1f |", interval_loss_scale_);
  line += printf_string(" grad norm: %.3f |", interval_grad_norm_);
  if (extras.num_zeros) line += printf_string(" num zeros: %lld |", static_cast<long long>(*extras.num_zeros));
  if (extras.params_norm) line += printf_string(" params norm: %.3f |", *extras.params_norm);
  if (opt_.noise_scale) line += printf_string(" noise scale: %.4g |", noise_scale_.b_simple());
  line += printf_string(" number of skipped iterations: %3lld |", static_cast<long long>(interval_skipped_));
  line += printf_string(" number of nan iterations: %3lld |", static_cast<long long>(interval_nan_));
  const double mean_loss = interval_loss_ / k;
  intervals_above_ = opt_.divergence_loss > 0 && mean_loss > opt_.divergence_loss ? intervals_above_ + 1 : 0;
  if (opt_.divergence_intervals > 0 && intervals_above_ >= opt_.divergence_intervals)
    diverge(iteration, printf_string("lm loss above %g (divergence_loss) for %lld log intervals, last %g",
                                     opt_.divergence_loss, static_cast<long long>(intervals_above_), mean_loss));
  // fp16: every step overflowing at a loss scale that cannot go lower (a static --loss-scale,
  // or --min-loss-scale) takes no step any more, however long the run goes on
  const bool lowest = fp16_ && (!opt_.loss_scaler.dynamic || interval_loss_scale_ <= opt_.loss_scaler.min_scale);
  intervals_stuck_ = lowest && interval_skipped_ == interval_iters_ ? intervals_stuck_ + 1 : 0;
  if (opt_.divergence_intervals > 0 && intervals_stuck_ >= opt_.divergence_intervals)
    diverge(
        iteration,
        printf_string("every step of %lld log intervals overflowed fp16 at the loss scale %g, %s, so no step was taken",
                      static_cast<long long>(intervals_stuck_), interval_loss_scale_,
                      opt_.loss_scaler.dynamic ? "the lowest (--min-loss-scale)" : "a static one (--loss-scale)"));
  if (metrics_ && extras.memory) {
    metrics_->append("memory/iteration", static_cast<double>(iteration));
    metrics_->append("memory/allocated_bytes", extras.memory->allocated);
    metrics_->append("memory/max_allocated_bytes", extras.memory->max_allocated);
    metrics_->append("memory/reserved_bytes", extras.memory->reserved);
    metrics_->append("memory/max_reserved_bytes", extras.memory->max_reserved);
  }
  if (metrics_ && opt_.noise_scale) {
    metrics_->append("noise_scale/iteration", static_cast<double>(iteration));
    metrics_->append("noise_scale/b_simple", noise_scale_.b_simple());
    metrics_->append("noise_scale/grad_sq_norm", noise_scale_.grad_sq_norm());
    metrics_->append("noise_scale/trace_cov", noise_scale_.trace_cov());
  }
  interval_loss_ = 0;
  std::fill(interval_extra_.begin(), interval_extra_.end(), 0.0);
  interval_iters_ = interval_skipped_ = interval_nan_ = interval_samples_ = 0;
  restart_interval_clock();
  // the metrics first: a logged line means its interval is on disk (a kill right after the
  // line appears loses nothing of it)
  if (metrics_) metrics_->flush();
  console_ << line << std::endl;
  if (extras.memory && !memory_said_) {  // Megatron's report_memory, after the first line (MB: MiB)
    memory_said_ = true;
    const double mb = 1024.0 * 1024.0;
    console_ << printf_string(
                    "[Rank 0] (after %lld iterations) memory (MB) | allocated: %.1f | max allocated: %.1f | reserved: "
                    "%.1f | max reserved: %.1f",
                    static_cast<long long>(iteration), extras.memory->allocated / mb, extras.memory->max_allocated / mb,
                    extras.memory->reserved / mb, extras.memory->max_reserved / mb)
             << std::endl;
  }
}

}  // namespace megabatch::train
