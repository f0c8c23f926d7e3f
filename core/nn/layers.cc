#include "core/nn/layers.h"

#include <algorithm>

#include "core/ops/cross_entropy.h"
#include "core/ops/embedding.h"
#include "core/ops/layernorm.h"
#include "core/ops/matmul.h"

namespace megabatch::nn {
using comm::ReduceOp;

LayerNorm::LayerNorm(ParameterStore& store, const std::string& prefix, int64_t C, int layer, double eps)
    : store_(&store), C_(C), eps_(eps) {
  w_ = store.add({prefix + ".weight", Role::kNorm, layer, {C}, Sharding::replicated(), Init::ones()});
  b_ = store.add({prefix + ".bias", Role::kNorm, layer, {C}, Sharding::replicated(), Init::zeros()});
}

void LayerNorm::forward(float* out, float* mean, float* rstd, const float* in, int64_t n) const {
  ops::layernorm_forward(out, mean, rstd, in, store_->param(w_), store_->param(b_), n, C_, eps_);
}

void LayerNorm::backward(float* din, const float* dout, const float* in, const float* mean, const float* rstd,
                         int64_t n) {
  ops::layernorm_backward(din, store_->grad(w_), store_->grad(b_), dout, in, store_->param(w_), mean, rstd, n, C_);
}

Linear::Linear(ParameterStore& store, comm::Communicator& tp, const std::string& prefix, int64_t in, int64_t out,
               int layer, double init_std, bool bias)
    : store_(&store), in_(in), out_(out) {
  const Sharding s = Sharding::replicated(tp.rank(), tp.size());
  w_ = store.add({prefix + ".weight", Role::kWeight, layer, {out, in}, s, Init::normal(init_std)});
  if (bias) b_ = store.add({prefix + ".bias", Role::kBias, layer, {out}, s, Init::zeros()});
}

void Linear::forward(float* out, const float* in, int64_t n) const {
  ops::linear_forward(out, in, store_->param(w_), b_ >= 0 ? store_->param(b_) : nullptr, n, in_, out_);
}

void Linear::backward(float* din, const float* dout, const float* in, int64_t n) {
  ops::linear_backward(din, store_->grad(w_), b_ >= 0 ? store_->grad(b_) : nullptr, dout, in, store_->param(w_), n, in_,
                       out_);
}

ColumnParallelLinear::ColumnParallelLinear(ParameterStore& store, comm::Communicator& tp, const std::string& prefix,
                                           int64_t in, int64_t out, int layer, double init_std, bool bias)
    : store_(&store), tp_(&tp), in_(in), out_local_(out / tp.size()) {
  const Sharding s = Sharding::split(0, tp.rank(), tp.size());
  w_ = store.add({prefix + ".weight", Role::kWeight, layer, {out, in}, s, Init::normal(init_std)});
  if (bias) b_ = store.add({prefix + ".bias", Role::kBias, layer, {out}, s, Init::zeros()});
}

void ColumnParallelLinear::forward(float* out_local, const float* in, int64_t n) const {
  ops::linear_forward(out_local, in, store_->param(w_), b_ >= 0 ? store_->param(b_) : nullptr, n, in_, out_local_);
}

void ColumnParallelLinear::backward(float* din, const float* dout_local, const float* in, int64_t n) {
  float* db = b_ >= 0 ? store_->grad(b_) : nullptr;
  if (tp_->size() == 1 || !din) {
    ops::linear_backward(din, store_->grad(w_), db, dout_local, in, store_->param(w_), n, in_, out_local_);
    return;
  }
  // dX is a partial sum over the output shards: reduce it alone, then accumulate.
  scratch_.resize({n, in_});
  scratch_.zero();
  ops::linear_backward(scratch_.data(), store_->grad(w_), db, dout_local, in, store_->param(w_), n, in_, out_local_);
  tp_->all_reduce(scratch_.data(), scratch_.numel(), ReduceOp::kSum);
  for (size_t i = 0; i < scratch_.numel(); ++i) din[i] += scratch_[i];
}

RowParallelLinear::RowParallelLinear(ParameterStore& store, comm::Communicator& tp, const std::string& prefix,
                                     int64_t in, int64_t out, int layer, double init_std, bool bias)
    : store_(&store), tp_(&tp), in_local_(in / tp.size()), out_(out) {
  w_ = store.add({prefix + ".weight", Role::kWeight, layer, {out, in}, Sharding::split(1, tp.rank(), tp.size()),
                  Init::normal(init_std)});
  if (bias)
    b_ = store.add({prefix + ".bias", Role::kBias, layer, {out}, Sharding::replicated(tp.rank(), tp.size()),
                    Init::zeros()});
}

void RowParallelLinear::forward(float* out, const float* in_local, int64_t n) const {
  ops::linear_forward<float>(out, in_local, store_->param(w_), nullptr, n, in_local_, out_);
  tp_->all_reduce(out, static_cast<size_t>(n * out_), ReduceOp::kSum);
  if (b_ >= 0) {
    const float* b = store_->param(b_);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out_; ++j) out[i * out_ + j] += b[j];
  }
}

void RowParallelLinear::backward(float* din_local, const float* dout, const float* in_local, int64_t n) {
  ops::linear_backward(din_local, store_->grad(w_), b_ >= 0 ? store_->grad(b_) : nullptr, dout, in_local,
                       store_->param(w_), n, in_local_, out_);
}

VocabParallelEmbedding::VocabParallelEmbedding(ParameterStore& store, comm::Communicator& tp, const std::string& name,
                                               int64_t vocab, int64_t C, double init_std, Role role)
    : store_(&store), tp_(&tp), rows_(vocab / tp.size()), C_(C) {
  w_ = store.add({name, role, -1, {vocab, C}, Sharding::split(0, tp.rank(), tp.size()), Init::normal(init_std)});
}

int64_t VocabParallelEmbedding::vocab_begin() const { return rows_ * tp_->rank(); }

void VocabParallelEmbedding::forward(float* out, const int32_t* ids, int64_t n) const {
  ops::embedding_forward(out, ids, store_->param(w_), n, C_, vocab_begin(), rows_);
  tp_->all_reduce(out, static_cast<size_t>(n * C_), ReduceOp::kSum);
}

void VocabParallelEmbedding::backward(const float* dout, const int32_t* ids, int64_t n) {
  ops::embedding_backward(store_->grad(w_), dout, ids, n, C_, vocab_begin(), rows_);
}

void VocabParallelCrossEntropy::forward(float* losses, const float* logits_local, const int32_t* targets, int64_t n,
                                        int64_t V_local, int64_t v_begin) {
  rowmax_.resize(n);
  sumexp_.resize(n);
  target_.resize(n);
  ops::ce_row_max(rowmax_.data(), logits_local, n, V_local);
  tp_->all_reduce(rowmax_.data(), n, ReduceOp::kMax);
  ops::ce_sum_exp(sumexp_.data(), logits_local, rowmax_.data(), n, V_local);
  tp_->all_reduce(sumexp_.data(), n, ReduceOp::kSum);
  ops::ce_target_logit(target_.data(), logits_local, targets, n, V_local, v_begin);
  tp_->all_reduce(target_.data(), n, ReduceOp::kSum);
  ops::ce_loss(losses, rowmax_.data(), sumexp_.data(), target_.data(), targets, n, ignore_);
}

void VocabParallelCrossEntropy::backward(float* dlogits_local, const float* logits_local, const int32_t* targets,
                                         const float* dloss, int64_t n, int64_t V_local, int64_t v_begin) const {
  ops::ce_backward(dlogits_local, logits_local, rowmax_.data(), sumexp_.data(), targets, dloss, n, V_local, v_begin,
                   ignore_);
}

}  // namespace megabatch::nn
