// GPT-2 (Megatron's GPT): learned position embeddings, pre-LayerNorm blocks with a fused
// QKV projection and a 4h GELU MLP, final LayerNorm, LM head tied to the word embedding,
// vocabulary padded to a multiple of 128 x TP. Tensor-parallel through the nn layers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/nn/layers.h"
#include "core/ops/dropout.h"
#include "core/train/model.h"
#include "models/lm_head.h"
#include "models/presets.h"
#include "models/transformer.h"

namespace megabatch::models {

class Gpt final : public train::Model {
 public:
  // Declares the parameters (nothing is allocated); call parameters().finalize() and
  // initialize() before forward (make_model does both).
  Gpt(const ModelConfig& config, comm::Communicator& tp);
  nn::ParameterStore& parameters() override { return store_; }
  train::LossOutput forward(const train::Batch& batch, const train::StepContext& ctx, float grad_scale) override;
  void backward() override;
  std::string summary() const override;
  const ModelConfig& config() const { return cfg_; }
  // Rows of the LM head computed at once (bounds the logits buffer to rows x vocab).
  void set_head_chunk(int64_t rows) { head_.set_chunk(rows); }

 private:
  void allocate(int64_t B, int64_t T);

  ModelConfig cfg_;
  nn::ParameterStore store_;
  std::unique_ptr<nn::VocabParallelEmbedding> wte_;
  int wpe_ = -1;
  std::unique_ptr<TransformerStack> stack_;
  std::unique_ptr<nn::Norm> lnf_;
  std::unique_ptr<nn::VocabParallelEmbedding> output_;  // --untie-embeddings-and-output-weights: the head's own
  TiedLmHead head_;

  // state of the current micro-batch
  int64_t B_ = 0, T_ = 0;
  bool have_grad_ = false;
  train::StepContext ctx_;
  Tensor tokens_, labels_, mask_, positions_, sums_;  // the batch on the device, the loss sum
  Tensor documents_;                                  // (B, T) with --reset-attention-mask, else undefined
  bool batch_positions_ = false;                      // positions_ holds a batch's own (--reset-position-ids)
  Tensor emb_, x_in_, x_final_, lnf_out_, lnf_mean_, lnf_rstd_, dlnf_, dx_final_, dx_;
};

}  // namespace megabatch::models
