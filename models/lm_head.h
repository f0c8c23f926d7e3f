// The language-model head tied to the word embedding, fused with the cross entropy and
// computed in row chunks: logits = X W^T (+ bias) over this rank's vocabulary shard,
// per-row losses (vocab-parallel cross entropy), and, when training, dX (written, summed
// over the tensor-parallel group), dW and dbias (accumulated). Only chunk x vocab logits
// ever exist, however many rows there are. Used by GPT, BERT (on the masked rows) and T5.
#pragma once

#include <cstdint>

#include "core/comm/communicator.h"
#include "core/nn/layers.h"
#include "core/tensor/tensor.h"
#include "core/train/model.h"

namespace megabatch::models {

class TiedLmHead {
 public:
  explicit TiedLmHead(comm::Communicator& tp) : tp_(&tp), ce_(tp, train::kIgnoreLabel) {}
  void set_chunk(int64_t rows) { chunk_ = rows; }

  struct Weights {
    const float* W;       // (Vl, C) word-embedding shard
    float* dW;            // its gradient (accumulated)
    const float* bias;    // (Vl) or null
    float* dbias;         // (Vl) or null
    int64_t Vl, v0;       // shard rows and the first vocabulary id they hold
  };
  // Losses of the n rows of X (n, C) against labels (kIgnoreLabel: no loss). With
  // grad_scale != 0 the gradients of grad_scale x (mean loss over labelled rows) are
  // written to dX (n, C) and accumulated into dW and dbias.
  train::LossOutput run(const float* X, const int32_t* labels, int64_t n, int64_t C, const Weights& w,
                        float grad_scale, float* dX);

 private:
  comm::Communicator* tp_;
  nn::VocabParallelCrossEntropy ce_;
  int64_t chunk_ = 256;
  Tensor logits_, dlogits_, losses_, dloss_;
};

}  // namespace megabatch::models
