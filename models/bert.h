// BERT as Megatron-LM builds it: word + position + token-type embeddings, a bidirectional
// pre-LN encoder with padding masks and a final LayerNorm (or, with post_layernorm, the
// original BERT: an embedding LayerNorm and post-LN blocks), the masked-LM head (dense,
// GELU, LayerNorm, decoder tied to the word embedding with its own bias) computed on the
// masked positions only, and the sentence-order head (binary_head) on a tanh pooler of the
// [CLS] position. Losses: "lm loss" (mean over masked tokens) and "sop loss" (mean over
// samples); the objective is their sum.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/nn/layers.h"
#include "core/train/model.h"
#include "models/lm_head.h"
#include "models/presets.h"
#include "models/transformer.h"

namespace megabatch::models {

class Bert final : public train::Model {
 public:
  Bert(const ModelConfig& config, comm::Communicator& tp);
  nn::ParameterStore& parameters() override { return store_; }
  train::LossOutput forward(const train::Batch& batch, const train::StepContext& ctx, float grad_scale) override;
  void backward() override;
  std::string summary() const override;

 private:
  void allocate(int64_t B, int64_t T);
  // forward's parts, in order: the batch checked and on the device (the masked positions
  // and their targets returned), the encoder (into h_), the two heads.
  void upload_batch(const train::Batch& batch, std::vector<int32_t>& rows, std::vector<int32_t>& targets);
  void encode();
  void masked_lm_head(const std::vector<int32_t>& rows, const std::vector<int32_t>& targets, train::LossOutput& out);
  void sentence_order_head(const train::Batch& batch, train::LossOutput& out);

  ModelConfig cfg_;
  nn::ParameterStore store_;
  std::unique_ptr<nn::VocabParallelEmbedding> wte_;
  int wpe_ = -1, wtt_ = -1, lm_bias_ = -1;
  std::unique_ptr<nn::Norm> emb_ln_;  // post-LN only
  std::unique_ptr<TransformerStack> stack_;
  std::unique_ptr<nn::Norm> lnf_;     // pre-LN only
  std::unique_ptr<nn::Linear> lm_dense_, pooler_, binary_head_;
  std::unique_ptr<nn::Norm> lm_ln_;
  TiedLmHead head_;

  // state of the current micro-batch
  int64_t B_ = 0, T_ = 0, m_ = 0;  // m_: masked positions
  bool have_grad_ = false;
  float grad_scale_ = 0;
  train::StepContext ctx_;
  // the batch on the device: tokens, token types, positions, padding mask, the masked
  // positions and their labels, the [CLS] rows and the sentence-order labels
  Tensor tokens_, types_, positions_, mask_, rows_, targets_, cls_rows_, sop_labels_;
  Tensor sums_;  // lm loss sum, sop loss sum
  Tensor emb_, emb_ln_out_, emb_mean_, emb_rstd_, x_in_, x_final_, h_, h_mean_, h_rstd_, dh_, dx_, demb_;
  Tensor hm_, d1_, g1_, l1_, l1_mean_, l1_rstd_, dl1_, dtmp_m_;
  Tensor cls_, pooled_, pooled_act_, sop_logits_, dsop_logits_, dpooled_, dpooled_act_, dcls_;
  Tensor sop_max_, sop_sumexp_, sop_target_, sop_losses_;
};

}  // namespace megabatch::models
