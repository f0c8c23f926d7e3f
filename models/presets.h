// Model architectures by name, and the figures `train --print-params` shows for them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megabatch::models {

struct ModelConfig {
  std::string family = "gpt";  // gpt, bert, t5
  std::string preset;          // name it came from, if any
  int64_t num_layers = 4, hidden_size = 256, num_attention_heads = 4, ffn_hidden_size = 0;  // ffn 0 = 4 h
  int64_t seq_length = 128, max_position_embeddings = 0;  // 0 = seq_length
  int64_t vocab_size = 50257;                              // tokenizer vocabulary (unpadded)
  int64_t make_vocab_size_divisible_by = 128;
  int64_t tensor_model_parallel_size = 1;
  double hidden_dropout = 0.1, attention_dropout = 0.1;
  double init_method_std = 0.02, layernorm_epsilon = 1e-5;
  // the word, position and token-type embeddings' (Megatron's --embedding-init-method-std; 0:
  // init_method_std's, and its method)
  double embedding_init_method_std = 0;
  bool init_method_xavier_uniform = false;  // weights from U(-a, a), a = sqrt(6 / (fan in + fan out)) (Megatron's)
  std::string normalization = "LayerNorm";  // Megatron's --normalization: LayerNorm or RMSNorm
  std::string attention_backend = "auto";   // Megatron's --attention-backend: auto, flash, unfused or local
  bool disable_bias_linear = false;  // Megatron's --disable-bias-linear: the transformer's linear layers without biases
  bool add_qkv_bias = false;         // Megatron's --add-qkv-bias: with it, the QKV projections keep theirs
  bool swiglu = false;               // Megatron's --swiglu: the MLP's fc1 gives (gate, up) pairs, silu(gate) up
  bool squared_relu = false;         // Megatron's --squared-relu: the MLP's activation is max(x, 0)^2
  bool apply_layernorm_1p = false;   // every norm's weight stored as w and applied as 1 + w (Megatron's)
  // Megatron's --apply-residual-connection-post-layernorm: each pre-LN sub-layer adds its output to
  // its norm's output, not to its input
  bool residual_post_norm = false;
  const char* residual_text() const { return residual_post_norm ? " (residual after the norm)" : ""; }
  bool qk_layernorm = false;         // GPT and BERT: a norm over each head's query and key (Megatron's --qk-layernorm)
  // GPT and BERT: grouped-query attention (Megatron's --group-query-attention): the heads share
  // num_query_groups key/value heads
  bool group_query_attention = false;
  int64_t num_query_groups = 1;
  int64_t query_groups() const { return group_query_attention ? num_query_groups : num_attention_heads; }
  // "12 heads", or "12 heads in 4 key/value groups" (for summaries)
  std::string heads_text() const;
  // GPT: rotary position embeddings instead of learned ones (Megatron's --position-embedding-type rope)
  bool rope = false;
  double rotary_percent = 1.0, rotary_base = 10000;  // the share of each head's channels turned; the base
  bool rotary_interleaved = false;                   // channel pairs (2i, 2i + 1), not (i, i + d/2)
  int64_t rotary_interpolation = 1;                  // positions divided by it (--rotary-seq-len-interpolation-factor)
  // GPT and BERT: no position embeddings at all (Megatron's --no-position-embedding: NoPE, the causal
  // mask alone telling a GPT's positions)
  bool no_position_embedding = false;
  bool learned_positions() const { return !rope && !no_position_embedding; }
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(hidden_size / num_attention_heads) * rotary_percent);
  }
  // GPT
  // GPT: each document of a sample takes learned positions from 0 (Megatron's --reset-position-ids)
  bool reset_position_ids = false;
  // GPT: each document of a sample attends within itself only (Megatron's --reset-attention-mask)
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;  // no loss where the input token is the end of a document (Megatron's --eod-mask-loss)
  bool untie_embeddings_and_output_weights = false;  // an output layer of its own (Megatron's output_layer.weight)
  // BERT
  int64_t num_tokentypes = 2;
  bool post_layernorm = false;  // the original BERT's post-LN blocks (Megatron: pre-LN)
  bool binary_head = true;      // sentence-order prediction on the [CLS] pooler
  // BERT and T5: the samples (Megatron's --mask-prob, --short-seq-prob)
  double mask_prob = 0.15;      // BERT: the share of tokens masked and predicted; T5: corrupted into spans
  double short_seq_prob = 0.1;  // the probability of a sample filled to a shorter length
  // BERT: "token" (each token alone, BERT's original) or "whole-word" (Megatron's: whole words in
  // n-grams of 1 to 3 words)
  std::string bert_masking = "token";
  // T5: "span" (T5's span corruption, Raffel et al.) or "whole-word" (Megatron's: each span an
  // n-gram of whole words, of a geometric number of words up to 10)
  std::string t5_masking = "span";
  // T5: num_layers and seq_length are the encoder's
  int64_t decoder_num_layers = 0;   // 0 = num_layers
  int64_t decoder_seq_length = 0;   // 0 = seq_length
  int64_t vocab_extra_ids = 0;      // sentinels appended to the vocabulary (counted in vocab_size)
  bool relative_attention = false;  // T5's relative position buckets instead of learned absolute positions
  int64_t relative_attention_num_buckets = 32, relative_attention_max_distance = 128;
  int64_t decoder_layers() const { return decoder_num_layers ? decoder_num_layers : num_layers; }
  int64_t decoder_seq() const { return decoder_seq_length ? decoder_seq_length : seq_length; }

  int64_t ffn() const { return ffn_hidden_size ? ffn_hidden_size : 4 * hidden_size; }
  int64_t max_positions() const {
    return max_position_embeddings ? max_position_embeddings
                                   : (family == "t5" && decoder_seq() > seq_length ? decoder_seq() : seq_length);
  }
  // Vocabulary padded to a multiple of make_vocab_size_divisible_by x TP (Megatron).
  int64_t padded_vocab_size() const;
  // Checks divisibility (heads by TP, hidden by heads, ...); Error naming the option.
  void validate() const;
};

struct Preset {
  std::string name, description;
  ModelConfig config;
};

const std::vector<Preset>& presets();
// The preset's configuration; Error listing the presets (and the nearest) when unknown.
ModelConfig preset(const std::string& name);

// Parameter count and memory estimate per tensor-parallel rank, as printed by
// `train --print-params`.
struct SizeReport {
  int64_t parameters = 0;            // unsharded
  int64_t parameters_per_rank = 0;
  double fp32_adam_bytes = 0;        // fp32 weights + grads + two Adam moments: 16 B / param
  double mixed_adam_bytes = 0;       // bf16 weights + fp32 grads, master, moments: 18 B / param
  double activation_bytes = 0;       // per micro-batch sample, 16-bit, no recompute
  double attention_score_bytes = 0;  // of which the saved attention probabilities (none with flash attention)
};
SizeReport size_report(const ModelConfig& c);

// Model FLOPs of one training iteration (forward and backward) of a global batch, by
// Megatron-LM's formula, extended to T5's two stacks (see presets.cc): the numerator of
// "throughput per GPU (TFLOP/s/GPU)".
double megatron_flops(const ModelConfig& c, int64_t global_batch);

}  // namespace megabatch::models
