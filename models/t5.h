// T5 as Megatron-LM builds it: one shared embedding (word + learned absolute position, or
// with relative_attention T5's relative position buckets: a learned bias per bucket and
// head added to the self-attention scores, one table for the encoder and one for the
// decoder, shared by their layers) for
// encoder and decoder inputs, a bidirectional pre-LN encoder with padding masks and a final
// LayerNorm, a pre-LN decoder whose layers add cross-attention to the encoder output
// between causal self-attention and the MLP, a final LayerNorm, and the LM head tied to the
// word embedding with its own bias. Loss: "lm loss", the mean over the target tokens.
//
// Decoder layer (names under decoder.layers.<l>.):
//   x = x + drop(self_attention.linear_proj(attn_causal(self_attention.linear_qkv(input_layernorm(x)))))
//   x = x + drop(cross_attention.linear_proj(attn(cross_attention.linear_q(pre_cross_attn_layernorm(x)),
//                                                 cross_attention.linear_kv(encoder_output))))
//   x = x + drop(mlp.linear_fc2(gelu(mlp.linear_fc1(pre_mlp_layernorm(x)))))
// linear_kv's output is (head, [k, v], head_dim) per position, as Megatron's.
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

class T5 final : public train::Model {
 public:
  T5(const ModelConfig& config, comm::Communicator& tp);
  nn::ParameterStore& parameters() override { return store_; }
  train::LossOutput forward(const train::Batch& batch, const train::StepContext& ctx, float grad_scale) override;
  void backward() override;
  std::string summary() const override;

 private:
  void allocate(int64_t B, int64_t Te, int64_t Td);
  // out (B*T, C) = word embeddings of tokens (+ learned positions without relative attention)
  void embed(const Tensor& out, const Tensor& tokens, const Tensor& positions);
  void embed_backward(const Tensor& d, const Tensor& tokens, const Tensor& positions);
  // The relative position bucket of every (query, key) pair of a length-T sequence (T, T).
  void buckets(Tensor& out, int64_t T, bool bidirectional) const;

  ModelConfig cfg_;
  nn::ParameterStore store_;
  std::unique_ptr<nn::VocabParallelEmbedding> wte_;
  int wpe_ = -1, lm_bias_ = -1;
  int enc_rel_ = -1, dec_rel_ = -1;  // relative position bias tables (buckets, heads), relative_attention only
  std::unique_ptr<TransformerStack> encoder_, decoder_;  // the decoder's blocks cross-attend to the encoder
  std::unique_ptr<nn::Norm> enc_lnf_, dec_lnf_;
  TiedLmHead head_;
  int64_t heads_local_;

  // state of the current micro-batch
  int64_t B_ = 0, Te_ = 0, Td_ = 0;
  bool have_grad_ = false;
  train::StepContext ctx_;
  // the batch on the device
  Tensor enc_tokens_, dec_tokens_, labels_, enc_mask_, dec_mask_, enc_positions_, dec_positions_, sums_;
  Tensor enc_emb_, enc_x_, enc_out_, enc_h_, enc_mean_, enc_rstd_, d_enc_h_, d_enc_out_, d_enc_x_;
  Tensor dec_emb_, dec_x_, dec_out_, dec_h_, dec_mean_, dec_rstd_, d_dec_h_, d_dec_out_, d_dec_x_;
  Tensor enc_bias_, dec_bias_, d_enc_bias_, d_dec_bias_;
  Tensor enc_buckets_, dec_buckets_;  // relative_attention: i32 (T, T) per (query, key), for the current lengths
};

}  // namespace megabatch::models
