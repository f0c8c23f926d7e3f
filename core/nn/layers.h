// Tensor-parallel layers with explicit forward and backward (Megatron's TP scheme).
// Each is a local computation plus one communication with a known adjoint:
//   ColumnParallelLinear   forward: identity on X, local GEMM -> Y shard;  backward: all-reduce dX
//   RowParallelLinear      forward: local GEMM on the X shard, all-reduce Y; backward: identity
//   VocabParallelEmbedding forward: local rows, all-reduce;                  backward: local rows
//   VocabParallelCrossEntropy: max / sum-exp / target logit all-reduced over the vocab shards
// With a one-rank communicator these are the plain layers. Activations saved for backward
// are arguments (outputs of forward), so nothing is hidden; backward accumulates (+=) into
// the fp32 parameter gradients and into din. Tensors are (rows, features) on the
// parameters' device, in the parameters' dtype; sizes come from the tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/nn/parameters.h"
#include "core/ops/write.h"
#include "core/tensor/tensor.h"

namespace megabatch::nn {

// Megatron's --normalization: LayerNorm (weight and bias) or RMSNorm (weight only, T5).
enum class NormKind { kLayerNorm, kRMSNorm };
NormKind parse_norm_kind(const std::string& text, const std::string& where);

class Norm {
 public:
  // one_plus (Megatron's --apply-layernorm-1p): the weight is stored as w and scales by 1 + w,
  // initialized 0 (zero-centred), so that weight decay pulls the scale to 1, not to 0.
  Norm(ParameterStore& store, const std::string& prefix, int64_t C, int layer, NormKind kind = NormKind::kLayerNorm,
       double eps = 1e-5, bool one_plus = false);
  // out (n, C) from in (n, C); mean (n, LayerNorm only: undefined for RMSNorm) and rstd (n)
  // in the accumulator dtype, saved for backward.
  void forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in) const;
  // The residual add before it fused in: sum = a + b, then forward(out, mean, rstd, sum).
  void forward_residual(const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& a,
                        const Tensor& b) const;
  // din += ...; the parameters' gradients += ...
  void backward(const Tensor& din, const Tensor& dout, const Tensor& in, const Tensor& mean, const Tensor& rstd);
  int64_t width() const { return C_; }
  NormKind kind() const { return kind_; }
  // Its parameters' ids [first, end) (weight, then bias), e.g. for ParameterStore::grads_final.
  int first_param() const { return w_; }
  int end_param() const { return (b_ >= 0 ? b_ : w_) + 1; }
  // Says its gradients are final for this backward pass (see ParameterStore::grads_final).
  void grads_final() const { store_->grads_final(first_param(), end_param()); }

 private:
  ParameterStore* store_;
  // The scale the norm applies: the weight, or 1 + it (one_plus: computed into scale_ at each call,
  // in the weight's dtype; its gradient is the weight's)
  Tensor scale() const;

  int64_t C_;
  NormKind kind_;
  double eps_;
  bool one_plus_ = false;
  int w_, b_ = -1;
  mutable Tensor scale_, ones_;
};

// A plain linear layer whose weight (out, in) and bias are replicated on every
// tensor-parallel rank (Megatron's get_linear_layer: poolers and the BERT LM-head dense).
class Linear {
 public:
  Linear(ParameterStore& store, comm::Communicator& tp, const std::string& prefix, int64_t in, int64_t out, int layer,
         double init_std, bool bias = true);
  void forward(const Tensor& out, const Tensor& in) const;  // (n, in) -> (n, out)
  // din (may be undefined) += dout * W (= with din_write kSet)
  void backward(const Tensor& din, const Tensor& dout, const Tensor& in, ops::Write din_write = ops::Write::kAdd);
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  ParameterStore* store_;
  int64_t in_, out_;
  int w_, b_ = -1;
};

class ColumnParallelLinear {
 public:
  // weight (out, in) split along out (dim 0); bias split likewise.
  ColumnParallelLinear(ParameterStore& store, comm::Communicator& tp, const std::string& prefix, int64_t in,
                       int64_t out, int layer, double init_std, bool bias = true);
  void forward(const Tensor& out_local, const Tensor& in) const;  // (n, in) -> (n, out / tp)
  // forward, then GELU: pre_local = the layer's output, out_local = gelu(pre_local) (one
  // fused GEMM on a GPU: ops::linear_gelu_forward)
  void forward_gelu(const Tensor& out_local, const Tensor& pre_local, const Tensor& in) const;
  // din (n, in) += the sum over ranks of dout_local * W_local (= with din_write kSet).
  void backward(const Tensor& din, const Tensor& dout_local, const Tensor& in,
                ops::Write din_write = ops::Write::kAdd);
  int64_t out_local() const { return out_local_; }

 private:
  ParameterStore* store_;
  comm::Communicator* tp_;
  int64_t out_local_;
  int w_, b_ = -1;
  Tensor scratch_;
};

class RowParallelLinear {
 public:
  // weight (out, in) split along in (dim 1); bias replicated, added after the all-reduce.
  RowParallelLinear(ParameterStore& store, comm::Communicator& tp, const std::string& prefix, int64_t in,
                    int64_t out, int layer, double init_std, bool bias = true);
  void forward(const Tensor& out, const Tensor& in_local) const;  // (n, in / tp) -> (n, out)
  // din_local += dout * W_local (= with din_write kSet)
  void backward(const Tensor& din_local, const Tensor& dout, const Tensor& in_local,
                ops::Write din_write = ops::Write::kAdd);
  // backward for in_local = gelu(pre_local), through the GELU: dpre_local = (dout * W_local) *
  // gelu'(pre_local), set (ops::linear_backward_gelu)
  void backward_gelu(const Tensor& dpre_local, const Tensor& dout, const Tensor& in_local, const Tensor& pre_local);
  int64_t in_local() const { return in_local_; }

 private:
  ParameterStore* store_;
  comm::Communicator* tp_;
  int64_t in_local_;
  int w_, b_ = -1;
};

class VocabParallelEmbedding {
 public:
  // table (vocab, C) split along the vocabulary (dim 0).
  VocabParallelEmbedding(ParameterStore& store, comm::Communicator& tp, const std::string& name, int64_t vocab,
                         int64_t C, Init init, Role role = Role::kEmbedding);
  void forward(const Tensor& out, const Tensor& ids) const;  // out (n, C) full rows; ids i32 (n)
  void backward(const Tensor& dout, const Tensor& ids);
  int64_t vocab_begin() const;
  int64_t vocab_local() const { return rows_; }
  int64_t width() const { return C_; }
  int param_id() const { return w_; }

 private:
  ParameterStore* store_;
  comm::Communicator* tp_;
  int64_t rows_, C_;
  int w_;
};

// Cross entropy over logits split by vocabulary: logits_local (n, V / tp) holds columns
// [v_begin, v_begin + V / tp).
class VocabParallelCrossEntropy {
 public:
  explicit VocabParallelCrossEntropy(comm::Communicator& tp, int32_t ignore = -1) : tp_(&tp), ignore_(ignore) {}
  // losses (n, accumulator dtype) per row (0 where the target is ignored). As Megatron's,
  // it keeps the exponentials for backward: logits_local is overwritten with
  // exp(logit - global max), and the global sums are kept. targets: i32 (n) on its device.
  void forward(const Tensor& losses, const Tensor& logits_local, const Tensor& targets, int64_t v_begin);
  // dlogits_local = d (softmax - onehot) on counted rows, 0 on ignored ones, d = scale x
  // loss_scale[0] (see ops::ce_backward), from the exps the last forward left in
  // exps_local; dlogits_local may be exps_local itself.
  void backward(const Tensor& dlogits_local, const Tensor& exps_local, const Tensor& targets, int64_t v_begin,
                float scale, const Tensor& loss_scale) const;
  // forward, then (with `grad`) backward into the logits themselves: without tensor
  // parallelism in one pass over each row (ops::ce_whole_rows), else as the two calls.
  void forward_backward(const Tensor& losses, const Tensor& logits_local, const Tensor& targets, int64_t v_begin,
                        bool grad, float scale, const Tensor& loss_scale);

 private:
  comm::Communicator* tp_;
  int32_t ignore_;
  Tensor rowmax_, sumexp_, target_;
};

}  // namespace megabatch::nn
