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
#include "models/presets.h"

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
  void set_head_chunk(int64_t rows) { head_chunk_ = rows; }

 private:
  struct Block {
    nn::LayerNorm ln1, ln2;
    nn::ColumnParallelLinear qkv, fc1;
    nn::RowParallelLinear proj, fc2;
  };
  struct Saved {  // activations of one block, (n, ...) with n = B * T
    Tensor x_in, ln1, ln1_mean, ln1_rstd, qkv, probs, attn, proj, x_mid, ln2, ln2_mean, ln2_rstd, fc1, gelu, fc2;
  };
  void allocate(int64_t B, int64_t T);
  ops::DropoutKey dropout_key(double p, uint64_t stream) const;

  ModelConfig cfg_;
  comm::Communicator* tp_;
  nn::ParameterStore store_;
  std::unique_ptr<nn::VocabParallelEmbedding> wte_;
  int wpe_ = -1;
  std::vector<Block> blocks_;
  std::unique_ptr<nn::LayerNorm> lnf_;
  nn::VocabParallelCrossEntropy ce_;
  int64_t heads_local_, head_chunk_ = 256;

  // state of the current micro-batch
  int64_t B_ = 0, T_ = 0;
  bool have_grad_ = false;
  train::StepContext ctx_;
  const train::Batch* batch_ = nullptr;
  std::vector<int32_t> positions_;
  Tensor emb_, x_final_, lnf_out_, lnf_mean_, lnf_rstd_, dlnf_, logits_, dlogits_, losses_, dloss_;
  std::vector<Saved> saved_;
  Tensor g_res_a_, g_res_b_, g_c_, g_qkv_, g_attn_, g_ff_a_, g_ff_b_;
};

}  // namespace megabatch::models
