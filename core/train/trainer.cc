#include "core/train/trainer.h"

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <ostream>

#include "core/util/error.h"

namespace megabatch::train {

void NoiseScaleEstimator::add(double small_sq, double b, double big_sq, double B) {
  check(B > b && b > 0, "noise scale: the small batch (", b, ") must be smaller than the big batch (", B, ")");
  const double g2 = (B * big_sq - b * small_sq) / (B - b);
  const double tr = (small_sq - big_sq) / (1.0 / b - 1.0 / B);
  g2_ = ema_ * g2_ + (1 - ema_) * g2;
  tr_ = ema_ * tr_ + (1 - ema_) * tr;
  decay_pow_ *= ema_;
  ++n_;
}
nlohmann::json NoiseScaleEstimator::state() const {
  return {{"g2", g2_}, {"trace", tr_}, {"decay_pow", decay_pow_}, {"count", n_}};
}
void NoiseScaleEstimator::restore(const nlohmann::json& s) {
  g2_ = s.at("g2").get<double>();
  tr_ = s.at("trace").get<double>();
  decay_pow_ = s.at("decay_pow").get<double>();
  n_ = s.at("count").get<int64_t>();
}

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }
}  // namespace

int stop_signal() { return static_cast<int>(g_stop_signal); }

double NoiseScaleEstimator::grad_sq_norm() const { return n_ ? g2_ / (1 - decay_pow_) : std::nan(""); }
double NoiseScaleEstimator::trace_cov() const { return n_ ? tr_ / (1 - decay_pow_) : std::nan(""); }

Trainer::Trainer(TrainOptions options, Model& model, optim::PluginOptimizer& optimizer, comm::Communicator& tp,
                 BatchSource& train, BatchSource* validation, io::MetricsFile* metrics, std::ostream& console)
    : opt_(options), model_(model), optimizer_(optimizer), tp_(tp), train_(train), valid_(validation),
      metrics_(metrics), console_(console) {
  check(opt_.micro_batch_size >= 1, "micro_batch_size must be >= 1");
  check(opt_.global_batch_size % opt_.micro_batch_size == 0, "global_batch_size (", opt_.global_batch_size,
        ") must be a multiple of micro_batch_size (", opt_.micro_batch_size, ")");
  check(!opt_.noise_scale || opt_.global_batch_size >= 2 * opt_.micro_batch_size,
        "--log-noise-scale compares micro-batch and global-batch gradients, so a global batch needs at least 2 "
        "micro-batches (global batch ", opt_.global_batch_size, ", micro batch ", opt_.micro_batch_size,
        "); lower --micro-batch-size");
  check(opt_.noise_scale_ema >= 0 && opt_.noise_scale_ema < 1, "--noise-scale-ema must be in [0, 1) (got ",
        opt_.noise_scale_ema, ")");
  noise_scale_ = NoiseScaleEstimator(opt_.noise_scale_ema);
}

namespace {
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
}  // namespace

void Trainer::set_data_parallel(comm::Communicator& dp) {
  check(opt_.global_batch_size % (opt_.micro_batch_size * dp.size()) == 0, "global_batch_size (",
        opt_.global_batch_size, ") must be a multiple of micro_batch_size x data-parallel size (",
        opt_.micro_batch_size, " x ", dp.size(), ")");
  dp_ = &dp;
}

void Trainer::train_step() {
  const auto t0 = std::chrono::steady_clock::now();
  const double lr = opt_.schedule.lr(consumed_);
  ++iteration_;
  // Data parallelism: rank r of D takes the r-th contiguous share of the global batch, in
  // micro-batches; micro-batch indices (which key dropout) are global, so D ranks compute
  // what one process with D times the accumulation steps computes.
  const int64_t D = dp_->size(), r = dp_->rank();
  const int64_t local = opt_.global_batch_size / (opt_.micro_batch_size * D);  // micro-batches on this rank
  const int64_t micro_batches = local * D;                                    // in the whole global batch
  model_.parameters().zero_grad();
  double loss = 0, small_sq = 0;
  std::vector<double> extra;  // the model's extra loss terms (BERT's sop loss), mean over micro-batches
  std::vector<std::string> extra_names;
  for (int64_t k = 0; k < local; ++k) {
    const int64_t m = r * local + k;
    train_.fill(static_cast<uint64_t>(consumed_ + m * opt_.micro_batch_size), opt_.micro_batch_size, batch_);
    const StepContext ctx{opt_.seed, iteration_, m, true};
    const LossValues out = model_.forward(batch_, ctx, 1.0f / static_cast<float>(micro_batches)).read();
    model_.backward();
    if (k == 0) {
      extra.assign(out.extra.size(), 0.0);
      for (const auto& t : out.extra) extra_names.push_back(t.name);
      if (opt_.noise_scale) {  // the first micro-batch's gradient alone (scaled by 1/micro_batches)
        const double n1 = optim::grad_norm(model_.parameters(), tp_) * static_cast<double>(micro_batches);
        small_sq = n1 * n1;
      }
    }
    loss += out.mean() / static_cast<double>(micro_batches);
    for (size_t e = 0; e < out.extra.size() && e < extra.size(); ++e)
      extra[e] += out.extra[e].mean() / static_cast<double>(micro_batches);
  }
  if (D > 1) {
    // the mean gradient of the global batch: sum the ranks' shares, in buckets
    float* g = model_.parameters().grads().data<float>();
    const size_t n = model_.parameters().flat_size(), bucket = size_t{1} << 22;
    for (size_t at = 0; at < n; at += bucket) dp_->all_reduce(g + at, std::min(bucket, n - at), comm::ReduceOp::kSum);
    std::vector<double> losses = {loss};
    losses.insert(losses.end(), extra.begin(), extra.end());
    dp_->all_reduce(losses.data(), losses.size(), comm::ReduceOp::kSum);
    loss = losses[0];
    for (size_t e = 0; e < extra.size(); ++e) extra[e] = losses[e + 1];
  }
  const double norm = optim::grad_norm(model_.parameters(), tp_);
  if (opt_.noise_scale && std::isfinite(norm) && std::isfinite(small_sq))
    noise_scale_.add(small_sq, static_cast<double>(opt_.micro_batch_size), norm * norm,
                     static_cast<double>(opt_.global_batch_size));
  double objective = loss;
  for (double e : extra) objective += e;
  if (!std::isfinite(objective) || !std::isfinite(norm))
    fail("iteration ", iteration_, ": ", !std::isfinite(objective) ? "loss" : "gradient norm", " is ",
         !std::isfinite(objective) ? objective : norm, " (diverged); lower --lr, raise warmup, or check the data");
  const double coeff = optim::clip_coefficient(norm, opt_.clip_grad);
  if (coeff < 1.0) {
    float* g = model_.parameters().grads().data<float>();
    const int64_t n = static_cast<int64_t>(model_.parameters().flat_size());
    const float c = static_cast<float>(coeff);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) g[i] *= c;
  }
  const bool diagnostics = opt_.diagnostics_interval > 0 && iteration_ % opt_.diagnostics_interval == 0;
  optimizer_.step(iteration_, lr, opt_.global_batch_size, norm * std::min(1.0, coeff), diagnostics);
  if (diagnostics && metrics_ && !optimizer_.diagnostics().empty()) {
    if (!names_written_) {
      std::vector<std::string> names;
      for (size_t i = 0; i < model_.parameters().count(); ++i)
        names.push_back(model_.parameters().info(static_cast<int>(i)).name);
      metrics_->set_strings("optimizer/tensor_names", names);
      names_written_ = true;
    }
    metrics_->append("optimizer/iteration", static_cast<double>(iteration_));
    for (const auto& [series, values] : optimizer_.diagnostics()) metrics_->append_row("optimizer/" + series, values);
  }
  consumed_ += opt_.global_batch_size;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  losses_.push_back(loss);

  const double tokens_per_s = static_cast<double>(opt_.global_batch_size * opt_.tokens_per_sample) / dt;
  if (metrics_) {
    metrics_->append("train/iteration", static_cast<double>(iteration_));
    metrics_->append("train/consumed_samples", static_cast<double>(consumed_));
    metrics_->append("train/lm_loss", loss);
    for (size_t k = 0; k < extra.size(); ++k) metrics_->append("train/" + series_name(extra_names[k]), extra[k]);
    metrics_->append("train/learning_rate", lr);
    metrics_->append("train/grad_norm", norm);
    metrics_->append("train/tokens_per_second", tokens_per_s);
    metrics_->append("train/iteration_time_ms", dt * 1e3);
  }
  interval_loss_ += loss;
  if (interval_extra_.size() != extra.size()) {
    interval_extra_.clear();
    for (const auto& nm : extra_names) interval_extra_.emplace_back(nm, 0.0);
  }
  for (size_t k = 0; k < extra.size(); ++k) interval_extra_[k].second += extra[k];
  interval_time_ += dt;
  ++interval_iters_;
  if (iteration_ % opt_.log_interval == 0 || iteration_ == opt_.train_iters) {
    const double k = static_cast<double>(interval_iters_);
    std::string line = " [" + timestamp() + "]";
    line += format(" iteration %8lld/%8lld |", static_cast<long long>(iteration_),
                   static_cast<long long>(opt_.train_iters));
    line += format(" consumed samples: %12lld |", static_cast<long long>(consumed_));
    line += format(" elapsed time per iteration (ms): %.1f |", interval_time_ / k * 1e3);
    line += format(" throughput (tokens/s): %.0f |",
                   static_cast<double>(opt_.global_batch_size * opt_.tokens_per_sample) * k / interval_time_);
    line += format(" learning rate: %.6E |", lr);
    line += format(" global batch size: %5lld |", static_cast<long long>(opt_.global_batch_size));
    line += format(" lm loss: %.6E |", interval_loss_ / k);
    for (auto& [nm, sum] : interval_extra_) {
      line += format(" %s: %.6E |", nm.c_str(), sum / k);
      sum = 0;
    }
    line += format(" loss scale: %.1f |", 1.0);
    line += format(" grad norm: %.3f |", norm);
    if (opt_.noise_scale) line += format(" noise scale: %.4g |", noise_scale_.b_simple());
    line += format(" number of skipped iterations: %3d |", 0);
    line += format(" number of nan iterations: %3d |", 0);
    console_ << line << std::endl;
    if (metrics_ && opt_.noise_scale) {
      metrics_->append("noise_scale/iteration", static_cast<double>(iteration_));
      metrics_->append("noise_scale/b_simple", noise_scale_.b_simple());
      metrics_->append("noise_scale/grad_sq_norm", noise_scale_.grad_sq_norm());
      metrics_->append("noise_scale/trace_cov", noise_scale_.trace_cov());
    }
    interval_loss_ = interval_time_ = 0;
    interval_iters_ = 0;
    if (metrics_) metrics_->flush();
  }
}

std::vector<std::pair<std::string, double>> Trainer::evaluate() {
  check(valid_ != nullptr, "evaluate(): no validation data (check --split)");
  double sum = 0;
  int64_t count = 0;
  std::vector<LossTerm> extra;
  uint64_t next = 0;
  for (int64_t it = 0; it < opt_.eval_iters; ++it) {
    for (int64_t m = 0; m < opt_.global_batch_size / opt_.micro_batch_size; ++m) {
      valid_->fill(next, opt_.micro_batch_size, batch_);
      next += static_cast<uint64_t>(opt_.micro_batch_size);
      const LossValues out = model_.forward(batch_, StepContext{opt_.seed, iteration_, m, false}, 0.0f).read();
      sum += out.loss_sum;
      count += out.count;
      if (extra.empty()) extra = out.extra;
      else
        for (size_t k = 0; k < extra.size() && k < out.extra.size(); ++k) {
          extra[k].sum += out.extra[k].sum;
          extra[k].count += out.extra[k].count;
        }
    }
  }
  std::vector<std::pair<std::string, double>> result{{"lm loss", count ? sum / static_cast<double>(count) : 0.0}};
  for (const auto& t : extra) result.emplace_back(t.name, t.mean());
  return result;
}

void Trainer::restore(const io::CheckpointState& state) {
  iteration_ = state.iteration;
  consumed_ = state.consumed_samples;
  if (state.trainer.contains("noise_scale")) noise_scale_.restore(state.trainer["noise_scale"]);
  last_saved_ = iteration_;
}

std::filesystem::path Trainer::save_checkpoint() {
  check(!opt_.save_dir.empty(), "save_checkpoint(): no --save directory");
  io::CheckpointState s = opt_.checkpoint;
  s.iteration = iteration_;
  s.consumed_samples = consumed_;
  s.seed = opt_.seed;
  s.loss_scale = 1.0;
  // The LR schedule is a pure function of consumed samples and these settings; they are
  // stored so that a checkpoint says which schedule produced it.
  const auto& sc = opt_.schedule;
  s.trainer = {{"noise_scale", noise_scale_.state()},
               {"lr_schedule",
                {{"max_lr", sc.max_lr}, {"min_lr", sc.min_lr}, {"warmup_samples", sc.warmup_samples},
                 {"decay_samples", sc.decay_samples}, {"style", optim::decay_style_name(sc.style)}, {"power", sc.power},
                 {"lr", sc.lr(consumed_)}}}};
  const auto t0 = std::chrono::steady_clock::now();
  // Data-parallel replicas are identical: the first tensor-parallel group writes.
  std::filesystem::path path = io::checkpoint_path(opt_.save_dir, iteration_);
  if (dp_->rank() == 0)
    path = io::save_checkpoint(opt_.save_dir, s, model_.parameters(), tp_, &optimizer_.state(), opt_.keep_checkpoints);
  dp_->barrier();
  last_saved_ = iteration_;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  console_ << format(" saved checkpoint at iteration %8lld to %s (%.1f s)", static_cast<long long>(iteration_),
                     path.string().c_str(), dt)
           << std::endl;
  return path;
}

StopReason Trainer::run() {
  auto validate = [&]() {
    const auto losses = evaluate();
    std::string line = format(" validation loss at iteration %lld |", static_cast<long long>(iteration_));
    if (metrics_) metrics_->append("validation/iteration", static_cast<double>(iteration_));
    for (const auto& [name, loss] : losses) {
      const double ppl = std::exp(std::min(20.0, loss));
      line += format(" %s value: %.6E | %s PPL: %.6E |", name.c_str(), loss, name.c_str(), ppl);
      if (metrics_) {
        metrics_->append("validation/" + series_name(name), loss);
        metrics_->append("validation/" + series_name(name) + "_ppl", ppl);
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
  g_stop_signal = 0;
  auto old_term = std::signal(SIGTERM, on_stop_signal);
  auto old_usr1 = std::signal(SIGUSR1, on_stop_signal);
  auto restore_handlers = [&]() {
    std::signal(SIGTERM, old_term);
    std::signal(SIGUSR1, old_usr1);
  };
  StopReason reason = StopReason::kFinished;
  try {
    while (iteration_ < opt_.train_iters) {
      train_step();
      if (saving && opt_.save_interval > 0 && iteration_ % opt_.save_interval == 0) {
        if (metrics_) metrics_->flush();  // the metrics of every checkpointed iteration are on disk
        save_checkpoint();
      }
      if (g_stop_signal != 0) {
        reason = StopReason::kSignal;
        break;
      }
      if (opt_.exit_interval > 0 && iteration_ >= opt_.exit_interval && iteration_ < opt_.train_iters) {
        reason = StopReason::kExitInterval;
        break;
      }
      if (valid_ && opt_.eval_interval > 0 && opt_.eval_iters > 0 && iteration_ % opt_.eval_interval == 0 &&
          iteration_ < opt_.train_iters)
        validate();
    }
    if (metrics_) metrics_->flush();
    if (reason == StopReason::kFinished && valid_ && opt_.eval_iters > 0) validate();
    save_once();
    if (reason == StopReason::kSignal)
      console_ << " stopped by signal " << static_cast<int>(g_stop_signal) << " after iteration " << iteration_
               << (saving ? "; resume with --load " + opt_.save_dir : "; no --save directory, nothing was saved")
               << std::endl;
    if (reason == StopReason::kExitInterval)
      console_ << " exiting after iteration " << iteration_ << " (--exit-interval)" << std::endl;
  } catch (...) {
    restore_handlers();
    if (metrics_) {
      try {
        metrics_->flush();
      } catch (const std::exception&) {
      }
    }
    throw;
  }
  restore_handlers();
  return reason;
}

}  // namespace megabatch::train
