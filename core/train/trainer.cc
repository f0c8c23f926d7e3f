#include "core/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <ostream>

#include "core/util/error.h"

namespace megabatch::train {

double grad_norm(nn::ParameterStore& store, comm::Communicator& tp) {
  double sharded = 0, replicated = 0;
  for (size_t i = 0; i < store.count(); ++i) {
    const auto& info = store.info(static_cast<int>(i));
    const float* g = store.grad(static_cast<int>(i));
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static) if (info.numel > 65536)
    for (int64_t j = 0; j < static_cast<int64_t>(info.numel); ++j) s += static_cast<double>(g[j]) * g[j];
    (info.sharding.sharded ? sharded : replicated) += s;
  }
  tp.all_reduce(&sharded, 1, comm::ReduceOp::kSum);
  return std::sqrt(sharded + replicated);
}

Trainer::Trainer(TrainOptions options, Model& model, optim::PluginOptimizer& optimizer, comm::Communicator& tp,
                 BatchSource& train, BatchSource* validation, io::MetricsFile* metrics, std::ostream& console)
    : opt_(options), model_(model), optimizer_(optimizer), tp_(tp), train_(train), valid_(validation),
      metrics_(metrics), console_(console) {
  check(opt_.micro_batch_size >= 1, "micro_batch_size must be >= 1");
  check(opt_.global_batch_size % opt_.micro_batch_size == 0, "global_batch_size (", opt_.global_batch_size,
        ") must be a multiple of micro_batch_size (", opt_.micro_batch_size, ")");
}

namespace {
std::string timestamp() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}
std::string format(const char* fmt, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}
}  // namespace

void Trainer::train_step() {
  const auto t0 = std::chrono::steady_clock::now();
  const double lr = opt_.schedule.lr(consumed_);
  ++iteration_;
  const int64_t micro_batches = opt_.global_batch_size / opt_.micro_batch_size;
  model_.parameters().zero_grad();
  double loss = 0;
  for (int64_t m = 0; m < micro_batches; ++m) {
    train_.fill(static_cast<uint64_t>(consumed_ + m * opt_.micro_batch_size), opt_.micro_batch_size, batch_);
    const StepContext ctx{opt_.seed, iteration_, m, true};
    const LossOutput out = model_.forward(batch_, ctx, 1.0f / static_cast<float>(micro_batches));
    model_.backward();
    loss += out.mean() / static_cast<double>(micro_batches);
  }
  const double norm = grad_norm(model_.parameters(), tp_);
  if (!std::isfinite(loss) || !std::isfinite(norm))
    fail("iteration ", iteration_, ": ", !std::isfinite(loss) ? "loss" : "gradient norm", " is ",
         !std::isfinite(loss) ? loss : norm, " (diverged); lower --lr, raise warmup, or check the data");
  const double coeff = optim::clip_coefficient(norm, opt_.clip_grad);
  if (coeff < 1.0) {
    float* g = model_.parameters().grads();
    const int64_t n = static_cast<int64_t>(model_.parameters().flat_size());
    const float c = static_cast<float>(coeff);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) g[i] *= c;
  }
  optimizer_.step(iteration_, lr, opt_.global_batch_size);
  consumed_ += opt_.global_batch_size;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  losses_.push_back(loss);

  const double tokens_per_s = static_cast<double>(opt_.global_batch_size * opt_.tokens_per_sample) / dt;
  if (metrics_) {
    metrics_->append("train/iteration", static_cast<double>(iteration_));
    metrics_->append("train/consumed_samples", static_cast<double>(consumed_));
    metrics_->append("train/lm_loss", loss);
    metrics_->append("train/learning_rate", lr);
    metrics_->append("train/grad_norm", norm);
    metrics_->append("train/tokens_per_second", tokens_per_s);
    metrics_->append("train/iteration_time_ms", dt * 1e3);
  }
  interval_loss_ += loss;
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
    line += format(" loss scale: %.1f |", 1.0);
    line += format(" grad norm: %.3f |", norm);
    line += format(" number of skipped iterations: %3d |", 0);
    line += format(" number of nan iterations: %3d |", 0);
    console_ << line << std::endl;
    interval_loss_ = interval_time_ = 0;
    interval_iters_ = 0;
    if (metrics_) metrics_->flush();
  }
}

double Trainer::evaluate() {
  check(valid_ != nullptr, "evaluate(): no validation data (check --split)");
  double sum = 0;
  int64_t count = 0;
  uint64_t next = 0;
  for (int64_t it = 0; it < opt_.eval_iters; ++it) {
    for (int64_t m = 0; m < opt_.global_batch_size / opt_.micro_batch_size; ++m) {
      valid_->fill(next, opt_.micro_batch_size, batch_);
      next += static_cast<uint64_t>(opt_.micro_batch_size);
      const LossOutput out = model_.forward(batch_, StepContext{opt_.seed, iteration_, m, false}, 0.0f);
      sum += out.loss_sum;
      count += out.count;
    }
  }
  return count ? sum / static_cast<double>(count) : 0.0;
}

void Trainer::run() {
  auto validate = [&]() {
    const double loss = evaluate();
    const double ppl = std::exp(std::min(20.0, loss));
    const std::string line = format(" validation loss at iteration %lld | lm loss value: %.6E | lm loss PPL: %.6E | ",
                                    static_cast<long long>(iteration_), loss, ppl);
    const std::string rule(line.size() + 1, '-');
    console_ << rule << "\n" << line << "\n" << rule << std::endl;
    if (metrics_) {
      metrics_->append("validation/iteration", static_cast<double>(iteration_));
      metrics_->append("validation/lm_loss", loss);
      metrics_->append("validation/lm_loss_ppl", ppl);
      metrics_->flush();
    }
  };
  try {
    while (iteration_ < opt_.train_iters) {
      train_step();
      if (valid_ && opt_.eval_interval > 0 && opt_.eval_iters > 0 && iteration_ % opt_.eval_interval == 0 &&
          iteration_ < opt_.train_iters)
        validate();
    }
    if (valid_ && opt_.eval_iters > 0) validate();
    if (metrics_) metrics_->flush();
  } catch (...) {
    if (metrics_) {
      try {
        metrics_->flush();
      } catch (const std::exception&) {
      }
    }
    throw;
  }
}

}  // namespace megabatch::train
