// Tensor-parallel layers with explicit forward and backward (Megatron's TP scheme).
// Each is a local computation plus one communication with a known adjoint:
//   ColumnParallelLinear   forward: identity on X, local GEMM -> Y shard;  backward: all-reduce dX
//   RowParallelLinear      forward: local GEMM on the X shard, all-reduce Y; backward: identity
//   VocabParallelEmbedding forward: local rows, all-reduce;                  backward: local rows
//   VocabParallelCrossEntropy: max / sum-exp / target logit all-reduced over the vocab shards
// With a one-rank communicator these are the plain layers. Activations saved for backward
// are arguments (outputs of forward), so nothing is hidden; backward accumulates (+=).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/nn/parameters.h"
#include "core/tensor/tensor.h"

namespace megabatch::nn {

class LayerNorm {
 public:
  LayerNorm(ParameterStore& store, const std::string& prefix, int64_t C, int layer, double eps = 1e-5);
  void forward(float* out, float* mean, float* rstd, const float* in, int64_t n) const;  // (n, C)
  void backward(float* din, const float* dout, const float* in, const float* mean, const float* rstd, int64_t n);
  int64_t width() const { return C_; }

 private:
  ParameterStore* store_;
  int64_t C_;
  double eps_;
  int w_, b_;
};

// A plain linear layer whose weight (out, in) and bias are replicated on every
// tensor-parallel rank (Megatron's get_linear_layer: poolers and the BERT LM-head dense).
class Linear {
 public:
  Linear(ParameterStore& store, comm::Communicator& tp, const std::string& prefix, int64_t in, int64_t out, int layer,
         double init_std, bool bias = true);
  void forward(float* out, const float* in, int64_t n) const;  // (n, in) -> (n, out)
  void backward(float* din, const float* dout, const float* in, int64_t n);  // din may be null
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
  void forward(float* out_local, const float* in, int64_t n) const;  // (n, in) -> (n, out / tp)
  // din (n, in) += the sum over ranks of dout_local * W_local.
  void backward(float* din, const float* dout_local, const float* in, int64_t n);
  int64_t out_local() const { return out_local_; }

 private:
  ParameterStore* store_;
  comm::Communicator* tp_;
  int64_t in_, out_local_;
  int w_, b_ = -1;
  Tensor scratch_;
};

class RowParallelLinear {
 public:
  // weight (out, in) split along in (dim 1); bias replicated, added after the all-reduce.
  RowParallelLinear(ParameterStore& store, comm::Communicator& tp, const std::string& prefix, int64_t in,
                    int64_t out, int layer, double init_std, bool bias = true);
  void forward(float* out, const float* in_local, int64_t n) const;  // (n, in / tp) -> (n, out)
  void backward(float* din_local, const float* dout, const float* in_local, int64_t n);
  int64_t in_local() const { return in_local_; }

 private:
  ParameterStore* store_;
  comm::Communicator* tp_;
  int64_t in_local_, out_;
  int w_, b_ = -1;
};

class VocabParallelEmbedding {
 public:
  // table (vocab, C) split along the vocabulary (dim 0).
  VocabParallelEmbedding(ParameterStore& store, comm::Communicator& tp, const std::string& name, int64_t vocab,
                         int64_t C, double init_std, Role role = Role::kEmbedding);
  void forward(float* out, const int32_t* ids, int64_t n) const;  // (n, C), full rows
  void backward(const float* dout, const int32_t* ids, int64_t n);
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
  // losses (n) per row (0 where the target is ignored); keeps max and sum-exp for backward.
  void forward(float* losses, const float* logits_local, const int32_t* targets, int64_t n, int64_t V_local,
               int64_t v_begin);
  // dlogits_local += dloss_i * (softmax - onehot), using the pieces of the last forward.
  void backward(float* dlogits_local, const float* logits_local, const int32_t* targets, const float* dloss,
                int64_t n, int64_t V_local, int64_t v_begin) const;

 private:
  comm::Communicator* tp_;
  int32_t ignore_;
  std::vector<float> rowmax_, sumexp_, target_;
};

}  // namespace megabatch::nn
