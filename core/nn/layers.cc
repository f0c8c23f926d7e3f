#include "core/nn/layers.h"

#include "core/comm/collectives.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/embedding.h"
#include "core/ops/layernorm.h"
#include "core/ops/matmul.h"
#include "core/ops/residual.h"
#include "core/util/error.h"

namespace megabatch::nn {
using comm::ReduceOp;

NormKind parse_norm_kind(const std::string& text, const std::string& where) {
  if (text == "LayerNorm") return NormKind::kLayerNorm;
  if (text == "RMSNorm") return NormKind::kRMSNorm;
  fail(where, ": '", text, "' is not a normalization; use LayerNorm or RMSNorm");
}

Norm::Norm(ParameterStore& store, const std::string& prefix, int64_t C, int layer, NormKind kind, double eps,
           bool one_plus)
    : store_(&store), C_(C), kind_(kind), eps_(eps), one_plus_(one_plus) {
  w_ = store.add(
      {prefix + ".weight", Role::kNorm, layer, {C}, Sharding::replicated(), one_plus ? Init::zeros() : Init::ones()});
  if (kind == NormKind::kLayerNorm)
    b_ = store.add({prefix + ".bias", Role::kNorm, layer, {C}, Sharding::replicated(), Init::zeros()});
}

Tensor Norm::scale() const {
  const Tensor w = store_->param(w_);
  if (!one_plus_) return w;
  if (!ones_.defined() || ones_.dtype() != w.dtype() || ones_.device() != w.device()) {
    ones_ = from_host(std::vector<float>(static_cast<size_t>(C_), 1.0f), {C_}, w.dtype(), w.device());
    scale_.resize({C_}, w.dtype(), w.device());
  }
  ops::residual_forward(scale_, ones_, w);
  return scale_;
}

void Norm::forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in) const {
  if (kind_ == NormKind::kRMSNorm)
    ops::rmsnorm_forward(out, rstd, in, scale(), eps_);
  else
    ops::layernorm_forward(out, mean, rstd, in, scale(), store_->param(b_), eps_);
}

void Norm::forward_residual(const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                            const Tensor& a, const Tensor& b) const {
  if (kind_ == NormKind::kRMSNorm)
    ops::rmsnorm_residual_forward(sum, out, rstd, a, b, scale(), eps_);
  else
    ops::layernorm_residual_forward(sum, out, mean, rstd, a, b, scale(), store_->param(b_), eps_);
}

void Norm::backward(const Tensor& din, const Tensor& dout, const Tensor& in, const Tensor& mean, const Tensor& rstd) {
  if (kind_ == NormKind::kRMSNorm)
    ops::rmsnorm_backward(din, store_->grad(w_), dout, in, scale(), rstd);
  else
    ops::layernorm_backward(din, store_->grad(w_), store_->grad(b_), dout, in, scale(), mean, rstd);
}

Linear::Linear(ParameterStore& store, comm::Communicator& tp, const std::string& prefix, int64_t in, int64_t out,
               int layer, double init_std, bool bias)
    : store_(&store), in_(in), out_(out) {
  const Sharding s = Sharding::replicated(tp.rank(), tp.size());
  w_ = store.add({prefix + ".weight", Role::kWeight, layer, {out, in}, s, Init::normal(init_std)});
  if (bias) b_ = store.add({prefix + ".bias", Role::kBias, layer, {out}, s, Init::zeros()});
}

void Linear::forward(const Tensor& out, const Tensor& in) const {
  ops::linear_forward(out, in, store_->param(w_), b_ >= 0 ? store_->param(b_) : Tensor());
}

void Linear::backward(const Tensor& din, const Tensor& dout, const Tensor& in, ops::Write din_write) {
  ops::linear_backward(din, store_->grad(w_), b_ >= 0 ? store_->grad(b_) : Tensor(), dout, in, store_->param(w_),
                       din_write);
}

ColumnParallelLinear::ColumnParallelLinear(ParameterStore& store, comm::Communicator& tp, const std::string& prefix,
                                           int64_t in, int64_t out, int layer, double init_std, bool bias)
    : store_(&store), tp_(&tp), out_local_(out / tp.size()) {
  const Sharding s = Sharding::split(0, tp.rank(), tp.size());
  w_ = store.add({prefix + ".weight", Role::kWeight, layer, {out, in}, s, Init::normal(init_std)});
  if (bias) b_ = store.add({prefix + ".bias", Role::kBias, layer, {out}, s, Init::zeros()});
}

void ColumnParallelLinear::forward(const Tensor& out_local, const Tensor& in) const {
  ops::linear_forward(out_local, in, store_->param(w_), b_ >= 0 ? store_->param(b_) : Tensor());
}

void ColumnParallelLinear::forward_gelu(const Tensor& out_local, const Tensor& pre_local, const Tensor& in) const {
  ops::linear_gelu_forward(out_local, pre_local, in, store_->param(w_), b_ >= 0 ? store_->param(b_) : Tensor());
}

void ColumnParallelLinear::backward(const Tensor& din, const Tensor& dout_local, const Tensor& in,
                                    ops::Write din_write) {
  const Tensor db = b_ >= 0 ? store_->grad(b_) : Tensor();
  if (tp_->size() == 1 || !din.defined()) {
    ops::linear_backward(din, store_->grad(w_), db, dout_local, in, store_->param(w_), din_write);
    return;
  }
  // dX is a partial sum over the output shards: reduce it alone, then accumulate (or set).
  const bool add = din_write == ops::Write::kAdd;
  const Tensor& partial = add ? scratch_ : din;
  if (add) scratch_.resize(din.shape(), din.dtype(), din.device());
  ops::linear_backward(partial, store_->grad(w_), db, dout_local, in, store_->param(w_), ops::Write::kSet);
  comm::all_reduce(*tp_, partial, ReduceOp::kSum);
  if (add) ops::residual_backward(din, Tensor(), scratch_);
}

RowParallelLinear::RowParallelLinear(ParameterStore& store, comm::Communicator& tp, const std::string& prefix,
                                     int64_t in, int64_t out, int layer, double init_std, bool bias)
    : store_(&store), tp_(&tp), in_local_(in / tp.size()) {
  w_ = store.add({prefix + ".weight", Role::kWeight, layer, {out, in}, Sharding::split(1, tp.rank(), tp.size()),
                  Init::normal(init_std)});
  if (bias)
    b_ = store.add({prefix + ".bias", Role::kBias, layer, {out}, Sharding::replicated(tp.rank(), tp.size()),
                    Init::zeros()});
}

void RowParallelLinear::forward(const Tensor& out, const Tensor& in_local) const {
  ops::linear_forward(out, in_local, store_->param(w_), Tensor());
  comm::all_reduce(*tp_, out, ReduceOp::kSum);
  if (b_ >= 0) ops::bias_add(out, store_->param(b_));
}

void RowParallelLinear::backward(const Tensor& din_local, const Tensor& dout, const Tensor& in_local,
                                 ops::Write din_write) {
  ops::linear_backward(din_local, store_->grad(w_), b_ >= 0 ? store_->grad(b_) : Tensor(), dout, in_local,
                       store_->param(w_), din_write);
}

void RowParallelLinear::backward_gelu(const Tensor& dpre_local, const Tensor& dout, const Tensor& in_local,
                                      const Tensor& pre_local) {
  ops::linear_backward_gelu(dpre_local, store_->grad(w_), b_ >= 0 ? store_->grad(b_) : Tensor(), dout, in_local,
                            store_->param(w_), pre_local);
}

VocabParallelEmbedding::VocabParallelEmbedding(ParameterStore& store, comm::Communicator& tp, const std::string& name,
                                               int64_t vocab, int64_t C, Init init, Role role)
    : store_(&store), tp_(&tp), rows_(vocab / tp.size()), C_(C) {
  w_ = store.add({name, role, -1, {vocab, C}, Sharding::split(0, tp.rank(), tp.size()), init});
}

int64_t VocabParallelEmbedding::vocab_begin() const { return rows_ * tp_->rank(); }

void VocabParallelEmbedding::forward(const Tensor& out, const Tensor& ids) const {
  ops::embedding_forward(out, ids, store_->param(w_), vocab_begin());
  comm::all_reduce(*tp_, out, ReduceOp::kSum);
}

void VocabParallelEmbedding::backward(const Tensor& dout, const Tensor& ids) {
  ops::embedding_backward(store_->grad(w_), dout, ids, vocab_begin());
}

void VocabParallelCrossEntropy::forward(const Tensor& losses, const Tensor& logits_local, const Tensor& targets,
                                        int64_t v_begin) {
  const int64_t n = logits_local.dim(0);
  for (Tensor* t : {&rowmax_, &sumexp_, &target_}) t->resize({n}, losses.dtype(), losses.device());
  ops::ce_row_max(rowmax_, logits_local);
  comm::all_reduce(*tp_, rowmax_, ReduceOp::kMax);
  ops::ce_target_logit(target_, logits_local, targets, v_begin);  // before the logits become exps
  comm::all_reduce(*tp_, target_, ReduceOp::kSum);
  ops::ce_exps(sumexp_, logits_local, rowmax_);
  comm::all_reduce(*tp_, sumexp_, ReduceOp::kSum);
  ops::ce_loss(losses, rowmax_, sumexp_, target_, targets, ignore_);
}

void VocabParallelCrossEntropy::backward(const Tensor& dlogits_local, const Tensor& exps_local,
                                         const Tensor& targets, int64_t v_begin, float scale,
                                         const Tensor& loss_scale) const {
  ops::ce_backward_exps(dlogits_local, exps_local, sumexp_, targets, v_begin, ignore_, scale, loss_scale);
}

void VocabParallelCrossEntropy::forward_backward(const Tensor& losses, const Tensor& logits_local,
                                                 const Tensor& targets, int64_t v_begin, bool grad, float scale,
                                                 const Tensor& loss_scale) {
  if (tp_->size() == 1 && v_begin == 0)
    return ops::ce_whole_rows(losses, logits_local, targets, ignore_, grad, scale, loss_scale);
  forward(losses, logits_local, targets, v_begin);
  if (grad) backward(logits_local, logits_local, targets, v_begin, scale, loss_scale);
}

}  // namespace megabatch::nn
