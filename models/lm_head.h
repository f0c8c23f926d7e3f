// The language-model head tied to the word embedding, fused with the cross entropy and
// computed in row chunks: logits = X W^T (+ bias) over this rank's vocabulary shard,
// per-row losses (vocab-parallel cross entropy), and, when training, dX (written, summed
// over the tensor-parallel group), dW and dbias (accumulated into the fp32 gradients).
// Only chunk x vocab logits ever exist, however many rows there are. Used by GPT, BERT
// (on the masked rows) and T5.
//
// Chunk size (head_chunk_rows): on the CPU 256 rows, so that a chunk's logits stay in the
// caches between the GEMM and the loss; on a GPU as few chunks as keep the logits within
// kGpuLogitsBudget, evenly sized. Each chunk reads and rewrites the whole fp32 dW, so on a
// GPU small chunks cost more than they save (GPT-2 124M, 8192 rows: 32 chunks of 256 moved
// about 10 GB of dW a step).
#pragma once

#include <cstdint>

#include "core/comm/communicator.h"
#include "core/nn/layers.h"
#include "core/tensor/tensor.h"
#include "core/train/model.h"

namespace megabatch::models {

constexpr int64_t kGpuLogitsBudget = int64_t{1} << 30;  // bytes of one chunk's logits on a GPU

// The most rows one chunk holds for a vocabulary shard of `vocab` logits of `dtype` on
// `device`, and the rows of one chunk for n rows (see above).
int64_t head_chunk_limit(int64_t vocab, DType dtype, Device device);
int64_t head_chunk_rows(int64_t n, int64_t vocab, DType dtype, Device device);

class TiedLmHead {
 public:
  explicit TiedLmHead(comm::Communicator& tp) : tp_(&tp), ce_(tp, train::kIgnoreLabel) {}
  void set_chunk(int64_t rows) { chunk_ = rows; }  // 0: head_chunk_rows

  struct Weights {
    Tensor W;      // (Vl, C) word-embedding shard
    Tensor dW;     // its fp32 gradient (accumulated)
    Tensor bias;   // (Vl) or undefined
    Tensor dbias;  // (Vl) fp32 or undefined
    int64_t v0;    // the first vocabulary id the shard holds
  };
  // The losses of the rows of X (n, C) against labels (i32 (n) on X's device;
  // kIgnoreLabel: no loss), summed into loss_sum (a one-element fp32 tensor, overwritten).
  // With grad_scale != 0 the gradients of grad_scale x (loss_sum / divisor) x loss_scale
  // (see ops::ce_backward) are written to dX (n, C) and accumulated into dW and dbias; divisor
  // is the counted rows, or what StepContext::lm_divisor_for says.
  void run(const Tensor& X, const Tensor& labels, double divisor, const Weights& w, float grad_scale,
           const Tensor& loss_scale, const Tensor& dX, const Tensor& loss_sum);

 private:
  comm::Communicator* tp_;
  nn::VocabParallelCrossEntropy ce_;
  int64_t chunk_ = 0;
  Tensor logits_, losses_;  // logits_: a chunk's logits, then their exps, then their gradient
};

}  // namespace megabatch::models
