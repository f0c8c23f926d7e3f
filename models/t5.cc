#include "models/t5.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/ops/attention.h"
#include "core/util/error.h"

namespace megabatch::models {
using nn::Role;
using nn::Sharding;

T5::T5(const ModelConfig& c, comm::Communicator& tp)
    : cfg_(c), tp_(&tp), head_(tp), heads_local_(c.num_attention_heads / tp.size()) {
  check_model_group(cfg_, tp);
  check(cfg_.decoder_layers() >= 1 && cfg_.decoder_seq() >= 1, "T5: decoder layers and decoder seq length must be >= 1");
  check(cfg_.max_positions() >= cfg_.decoder_seq(), "max_position_embeddings (", cfg_.max_positions(),
        ") must be >= decoder_seq_length (", cfg_.decoder_seq(), ")");
  const int64_t C = cfg_.hidden_size;
  const double std = cfg_.init_method_std;
  wte_ = std::make_unique<nn::VocabParallelEmbedding>(store_, tp, "embedding.word_embeddings.weight",
                                                      cfg_.padded_vocab_size(), C, std);
  if (cfg_.relative_attention) {
    const std::vector<int64_t> shape = {cfg_.relative_attention_num_buckets, cfg_.num_attention_heads};
    const Sharding by_head = Sharding::split(1, tp.rank(), tp.size());
    enc_rel_ = store_.add({"encoder.relative_attention_bias.weight", Role::kEmbedding, -1, shape, by_head,
                           nn::Init::normal(std)});
    dec_rel_ = store_.add({"decoder.relative_attention_bias.weight", Role::kEmbedding, -1, shape, by_head,
                           nn::Init::normal(std)});
  } else {
    wpe_ = store_.add({"embedding.position_embeddings.weight", Role::kEmbedding, -1, {cfg_.max_positions(), C},
                       Sharding::replicated(tp.rank(), tp.size()), nn::Init::normal(std)});
  }
  StackConfig sc = stack_config(cfg_, "encoder.layers.", cfg_.num_layers, false);
  sc.stream_base = 1;
  encoder_ = std::make_unique<TransformerStack>(store_, tp, sc);
  enc_lnf_ = std::make_unique<nn::LayerNorm>(store_, "encoder.final_layernorm", C, -1, cfg_.layernorm_epsilon);
  // Dropout streams: encoder embedding 0, encoder layers 1 .. 3E, decoder embedding 3E + 1,
  // the decoder's layers (5 sites each) after that.
  StackConfig dc = stack_config(cfg_, "decoder.layers.", cfg_.decoder_layers(), true);
  dc.cross_attention = true;
  dc.stream_base = static_cast<uint64_t>(2 + 3 * cfg_.num_layers);
  decoder_ = std::make_unique<TransformerStack>(store_, tp, dc);
  dec_lnf_ = std::make_unique<nn::LayerNorm>(store_, "decoder.final_layernorm", C, -1, cfg_.layernorm_epsilon);
  lm_bias_ = store_.add({"lm_head.output_layer.bias", Role::kBias, -1, {cfg_.padded_vocab_size()},
                         Sharding::split(0, tp.rank(), tp.size()), nn::Init::zeros()});
}

std::string T5::summary() const {
  std::ostringstream os;
  os << "T5 " << (cfg_.preset.empty() ? "custom" : cfg_.preset) << ": " << cfg_.num_layers << " + "
     << cfg_.decoder_layers() << " layers" << (cfg_.relative_attention ? " (relative positions)" : "") << ", hidden " << cfg_.hidden_size << ", " << cfg_.num_attention_heads
     << " heads, ffn " << cfg_.ffn() << ", seq " << cfg_.seq_length << " / " << cfg_.decoder_seq() << ", vocab "
     << cfg_.vocab_size << " (padded " << cfg_.padded_vocab_size() << "), " << store_.num_full_parameters()
     << " parameters";
  return os.str();
}

void T5::allocate(int64_t B, int64_t Te, int64_t Td) {
  if (B == B_ && Te == Te_ && Td == Td_) return;
  B_ = B;
  Te_ = Te;
  Td_ = Td;
  const int64_t ne = B * Te, nd = B * Td, C = cfg_.hidden_size;
  for (Tensor* t : {&enc_emb_, &enc_x_, &enc_out_, &enc_h_, &d_enc_h_, &d_enc_out_, &d_enc_x_}) t->resize({ne, C});
  for (Tensor* t : {&enc_mean_, &enc_rstd_}) t->resize({ne});
  for (Tensor* t : {&dec_emb_, &dec_x_, &dec_out_, &dec_h_, &d_dec_h_, &d_dec_out_, &d_dec_x_}) t->resize({nd, C});
  for (Tensor* t : {&dec_mean_, &dec_rstd_}) t->resize({nd});
  if (cfg_.relative_attention) {  // the bucket of every (query, key) pair depends on the lengths only
    enc_buckets_ = buckets(Te, true);
    dec_buckets_ = buckets(Td, false);
  }
}

void T5::embed(float* out, const int32_t* tokens, int64_t B, int64_t T) {
  const int64_t n = B * T, C = cfg_.hidden_size, vocab = cfg_.padded_vocab_size();
  for (int64_t i = 0; i < n; ++i)
    check(tokens[i] >= 0 && tokens[i] < vocab, "T5: token id ", tokens[i], " at position ", i,
          " is outside the vocabulary (", vocab, ")");
  wte_->forward(out, tokens, n);
  if (wpe_ >= 0) add_position_embeddings(out, store_.param(wpe_), n, T, C);  // none with relative attention
}

void T5::embed_backward(const float* d, const int32_t* tokens, int64_t B, int64_t T) {
  const int64_t n = B * T, C = cfg_.hidden_size;
  wte_->backward(d, tokens, n);
  if (wpe_ >= 0) position_embeddings_backward(store_.grad(wpe_), d, n, T, C);
}

std::vector<int32_t> T5::buckets(int64_t T, bool bidirectional) const {
  std::vector<int32_t> out(static_cast<size_t>(T * T));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j)
      out[static_cast<size_t>(i * T + j)] =
          ops::relative_position_bucket(i, j, bidirectional, static_cast<int>(cfg_.relative_attention_num_buckets),
                                        static_cast<int>(cfg_.relative_attention_max_distance));
  return out;
}

void T5::relative_bias(float* out, int id, const std::vector<int32_t>& bucket, int64_t T) const {
  const float* table = store_.param(id);  // (buckets, local heads)
  const int64_t H = heads_local_;
  for (int64_t e = 0; e < T * T; ++e)
    for (int64_t h = 0; h < H; ++h) out[h * T * T + e] = table[bucket[static_cast<size_t>(e)] * H + h];
}

void T5::relative_bias_backward(const float* d, int id, const std::vector<int32_t>& bucket, int64_t T) {
  float* table = store_.grad(id);
  const int64_t H = heads_local_;
  for (int64_t e = 0; e < T * T; ++e)
    for (int64_t h = 0; h < H; ++h) table[bucket[static_cast<size_t>(e)] * H + h] += d[h * T * T + e];
}

train::LossOutput T5::forward(const train::Batch& batch, const train::StepContext& ctx, float grad_scale) {
  check(store_.finalized(), "T5: parameters not allocated");
  const int64_t B = batch.batch, Te = batch.seq, Td = batch.decoder_seq;
  check(Td >= 1 && static_cast<int64_t>(batch.decoder_tokens.size()) == B * Td &&
            static_cast<int64_t>(batch.labels.size()) == B * Td,
        "T5: the batch has no decoder tokens and labels of (", B, ", ", Td, ")");
  check(Te <= cfg_.max_positions() && Td <= cfg_.max_positions(), "T5: sequence lengths ", Te, " / ", Td,
        " exceed max_position_embeddings ", cfg_.max_positions());
  allocate(B, Te, Td);
  ctx_ = ctx;
  batch_ = &batch;
  have_grad_ = grad_scale != 0.0f;
  const int64_t ne = B * Te, nd = B * Td, C = cfg_.hidden_size;
  const uint8_t* emask = batch.padding_mask.empty() ? nullptr : batch.padding_mask.data();
  const uint8_t* dmask = batch.decoder_padding_mask.empty() ? nullptr : batch.decoder_padding_mask.data();

  // encoder
  embed(enc_emb_.data(), batch.tokens.data(), B, Te);
  dropout_or_copy(enc_x_.data(), enc_emb_.data(), ne * C, dropout_key(ctx, cfg_.hidden_dropout, 0));
  const float* ebias = nullptr;
  const float* dbias = nullptr;
  if (cfg_.relative_attention) {
    enc_bias_.resize({heads_local_, Te, Te});
    dec_bias_.resize({heads_local_, Td, Td});
    relative_bias(enc_bias_.data(), enc_rel_, enc_buckets_, Te);
    relative_bias(dec_bias_.data(), dec_rel_, dec_buckets_, Td);
    ebias = enc_bias_.data();
    dbias = dec_bias_.data();
  }
  encoder_->forward(enc_out_.data(), enc_x_.data(), B, Te, emask, ctx, ebias);
  enc_lnf_->forward(enc_h_.data(), enc_mean_.data(), enc_rstd_.data(), enc_out_.data(), ne);

  // decoder: causal self-attention, cross-attention to the encoder output, MLP
  embed(dec_emb_.data(), batch.decoder_tokens.data(), B, Td);
  dropout_or_copy(dec_x_.data(), dec_emb_.data(), nd * C,
                  dropout_key(ctx, cfg_.hidden_dropout, static_cast<uint64_t>(1 + 3 * cfg_.num_layers)));
  decoder_->forward(dec_out_.data(), dec_x_.data(), B, Td, dmask, ctx, dbias, StackMemory{enc_h_.data(), Te, emask});
  dec_lnf_->forward(dec_h_.data(), dec_mean_.data(), dec_rstd_.data(), dec_out_.data(), nd);

  const TiedLmHead::Weights w{store_.param(wte_->param_id()), store_.grad(wte_->param_id()), store_.param(lm_bias_),
                              store_.grad(lm_bias_), wte_->vocab_local(), wte_->vocab_begin()};
  return head_.run(dec_h_.data(), batch.labels.data(), nd, C, w, grad_scale, have_grad_ ? d_dec_h_.data() : nullptr);
}

void T5::backward() {
  check(have_grad_, "T5: backward() without a forward() that asked for gradients");
  have_grad_ = false;
  const int64_t B = B_, Te = Te_, Td = Td_, ne = B * Te, nd = B * Td, C = cfg_.hidden_size;
  d_dec_out_.zero();
  dec_lnf_->backward(d_dec_out_.data(), d_dec_h_.data(), dec_out_.data(), dec_mean_.data(), dec_rstd_.data(), nd);
  d_enc_h_.zero();
  const bool rel = cfg_.relative_attention;
  if (rel) {
    d_enc_bias_.resize({heads_local_, Te, Te});
    d_dec_bias_.resize({heads_local_, Td, Td});
    d_enc_bias_.zero();
    d_dec_bias_.zero();
  }
  decoder_->backward(d_dec_x_.data(), d_dec_out_.data(), rel ? d_dec_bias_.data() : nullptr, d_enc_h_.data());
  // decoder embedding
  dec_emb_.zero();  // reused for the gradient of the embedding sum
  dropout_or_copy_backward(dec_emb_.data(), d_dec_x_.data(), nd * C,
                           dropout_key(ctx_, cfg_.hidden_dropout, static_cast<uint64_t>(1 + 3 * cfg_.num_layers)));
  embed_backward(dec_emb_.data(), batch_->decoder_tokens.data(), B, Td);
  // encoder: final LayerNorm, the stack, the embedding
  d_enc_out_.zero();
  enc_lnf_->backward(d_enc_out_.data(), d_enc_h_.data(), enc_out_.data(), enc_mean_.data(), enc_rstd_.data(), ne);
  encoder_->backward(d_enc_x_.data(), d_enc_out_.data(), rel ? d_enc_bias_.data() : nullptr);
  if (rel) {
    relative_bias_backward(d_enc_bias_.data(), enc_rel_, enc_buckets_, Te);
    relative_bias_backward(d_dec_bias_.data(), dec_rel_, dec_buckets_, Td);
  }
  enc_emb_.zero();  // reused for the gradient of the embedding sum
  dropout_or_copy_backward(enc_emb_.data(), d_enc_x_.data(), ne * C, dropout_key(ctx_, cfg_.hidden_dropout, 0));
  embed_backward(enc_emb_.data(), batch_->tokens.data(), B, Te);
}

}  // namespace megabatch::models
