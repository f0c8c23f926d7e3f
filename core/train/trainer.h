// The one training loop: gradient accumulation over micro-batches, global-norm clipping,
// the optimizer plugin's step, LR schedule, Megatron console lines, metrics, evaluation.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>

#include "core/comm/communicator.h"
#include "core/io/metrics.h"
#include "core/optim/optimizer.h"
#include "core/optim/schedule.h"
#include "core/train/model.h"

namespace megabatch::train {

// Fills a micro-batch with samples [first, first + count) of a deterministic sample order.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual void fill(uint64_t first, int64_t count, Batch& out) = 0;
};

struct TrainOptions {
  int64_t micro_batch_size = 8, global_batch_size = 8, train_iters = 0;
  optim::LrSchedule schedule;
  double clip_grad = 1.0;
  int64_t log_interval = 100, eval_interval = 1000, eval_iters = 100;
  uint64_t seed = 1234;
  int64_t tokens_per_sample = 0;  // for tokens/s
};

// Global L2 norm of all gradients: squared norms of sharded tensors are summed over the
// tensor-parallel group, replicated tensors are counted once.
double grad_norm(nn::ParameterStore& store, comm::Communicator& tp);

class Trainer {
 public:
  Trainer(TrainOptions options, Model& model, optim::PluginOptimizer& optimizer, comm::Communicator& tp,
          BatchSource& train, BatchSource* validation, io::MetricsFile* metrics, std::ostream& console);
  // Runs to train_iters. On an error (a plugin failure, a NaN loss) the metrics are
  // flushed first, then the Error propagates.
  void run();
  // Mean validation loss over eval_iters global batches (no dropout, no gradients).
  double evaluate();
  int64_t iteration() const { return iteration_; }
  int64_t consumed_samples() const { return consumed_; }
  const std::vector<double>& losses() const { return losses_; }  // per iteration

 private:
  void train_step();
  TrainOptions opt_;
  Model& model_;
  optim::PluginOptimizer& optimizer_;
  comm::Communicator& tp_;
  BatchSource& train_;
  BatchSource* valid_;
  io::MetricsFile* metrics_;
  std::ostream& console_;
  int64_t iteration_ = 0, consumed_ = 0;
  std::vector<double> losses_;
  Batch batch_;
  // interval accumulators
  double interval_loss_ = 0, interval_time_ = 0;
  int64_t interval_iters_ = 0;
};

}  // namespace megabatch::train
