#include "models/t5.h"

#include <cmath>
#include <sstream>

#include "core/ops/embedding.h"
#include "core/ops/relative_position.h"
#include "core/util/error.h"

namespace megabatch::models {
using nn::Role;
using nn::Sharding;

T5::T5(const ModelConfig& c, comm::Communicator& tp)
    : cfg_(c), head_(tp), heads_local_(c.num_attention_heads / tp.size()) {
  check_model_group(cfg_, tp);
  check(cfg_.decoder_layers() >= 1 && cfg_.decoder_seq() >= 1, "T5: decoder layers and decoder seq length must be >= 1");
  check(cfg_.max_positions() >= cfg_.decoder_seq(), "max_position_embeddings (", cfg_.max_positions(),
        ") must be >= decoder_seq_length (", cfg_.decoder_seq(), ")");
  const int64_t C = cfg_.hidden_size;
  const double std = cfg_.init_method_std;
  wte_ = std::make_unique<nn::VocabParallelEmbedding>(store_, tp, "embedding.word_embeddings.weight",
                                                      cfg_.padded_vocab_size(), C, embedding_init(cfg_));
  if (cfg_.relative_attention) {
    const std::vector<int64_t> shape = {cfg_.relative_attention_num_buckets, cfg_.num_attention_heads};
    const Sharding by_head = Sharding::split(1, tp.rank(), tp.size());
    enc_rel_ = store_.add({"encoder.relative_attention_bias.weight", Role::kEmbedding, -1, shape, by_head,
                           nn::Init::normal(std)});
    dec_rel_ = store_.add({"decoder.relative_attention_bias.weight", Role::kEmbedding, -1, shape, by_head,
                           nn::Init::normal(std)});
  } else {
    wpe_ = store_.add({"embedding.position_embeddings.weight",
                       Role::kEmbedding,
                       -1,
                       {cfg_.max_positions(), C},
                       Sharding::replicated(tp.rank(), tp.size()),
                       embedding_init(cfg_)});
  }
  StackConfig sc = stack_config(cfg_, "encoder.layers.", cfg_.num_layers, false);
  sc.stream_base = 1;
  encoder_ = std::make_unique<TransformerStack>(store_, tp, sc);
  enc_lnf_ =
      std::make_unique<nn::Norm>(store_, "encoder.final_layernorm", C, -1, sc.norm, cfg_.layernorm_epsilon, sc.norm_1p);
  // Dropout streams: encoder embedding 0, encoder layers 1 .. 3E, decoder embedding 3E + 1,
  // the decoder's layers (5 sites each) after that.
  StackConfig dc = stack_config(cfg_, "decoder.layers.", cfg_.decoder_layers(), true);
  dc.cross_attention = true;
  dc.stream_base = static_cast<uint64_t>(2 + 3 * cfg_.num_layers);
  decoder_ = std::make_unique<TransformerStack>(store_, tp, dc);
  dec_lnf_ =
      std::make_unique<nn::Norm>(store_, "decoder.final_layernorm", C, -1, sc.norm, cfg_.layernorm_epsilon, sc.norm_1p);
  lm_bias_ = store_.add({"lm_head.output_layer.bias", Role::kBias, -1, {cfg_.padded_vocab_size()},
                         Sharding::split(0, tp.rank(), tp.size()), nn::Init::zeros()});
}

std::string T5::summary() const {
  std::ostringstream os;
  os << "T5 " << (cfg_.preset.empty() ? "custom" : cfg_.preset) << ": " << cfg_.num_layers << " + "
     << cfg_.decoder_layers() << " layers" << cfg_.residual_text()
     << (cfg_.relative_attention ? " (relative positions)" : "") << ", hidden " << cfg_.hidden_size << ", "
     << cfg_.num_attention_heads << " heads, ffn " << cfg_.ffn()
     << (cfg_.swiglu         ? " (SwiGLU)"
         : cfg_.squared_relu ? " (squared ReLU)"
                             : "")
     << ", seq " << cfg_.seq_length << " / " << cfg_.decoder_seq() << ", vocab " << cfg_.vocab_size << " (padded "
     << cfg_.padded_vocab_size() << "), " << store_.num_full_parameters() << " parameters";
  return os.str();
}

void T5::allocate(int64_t B, int64_t Te, int64_t Td) {
  if (B == B_ && Te == Te_ && Td == Td_) return;
  B_ = B;
  Te_ = Te;
  Td_ = Td;
  const int64_t ne = B * Te, nd = B * Td, C = cfg_.hidden_size;
  for (Tensor* t : {&enc_emb_, &enc_x_, &enc_out_, &enc_h_, &d_enc_h_, &d_enc_out_, &d_enc_x_}) alloc(*t, {ne, C}, store_);
  for (Tensor* t : {&enc_mean_, &enc_rstd_}) alloc_acc(*t, {ne}, store_);
  for (Tensor* t : {&dec_emb_, &dec_x_, &dec_out_, &dec_h_, &d_dec_h_, &d_dec_out_, &d_dec_x_}) alloc(*t, {nd, C}, store_);
  for (Tensor* t : {&dec_mean_, &dec_rstd_}) alloc_acc(*t, {nd}, store_);
  alloc_acc(sums_, {1}, store_);
  position_ids(enc_positions_, B, Te, store_.device());
  position_ids(dec_positions_, B, Td, store_.device());
  if (cfg_.relative_attention) {  // the bucket of every (query, key) pair depends on the lengths only
    buckets(enc_buckets_, Te, true);
    buckets(dec_buckets_, Td, false);
    alloc(enc_bias_, {heads_local_, Te, Te}, store_);
    alloc(dec_bias_, {heads_local_, Td, Td}, store_);
    alloc_acc(d_enc_bias_, {heads_local_, Te, Te}, store_);
    alloc_acc(d_dec_bias_, {heads_local_, Td, Td}, store_);
  }
}

void T5::embed(const Tensor& out, const Tensor& tokens, const Tensor& positions) {
  wte_->forward(out, tokens);
  if (wpe_ >= 0) ops::embedding_forward(out, positions, store_.param(wpe_), 0, true);  // none with relative attention
}

void T5::embed_backward(const Tensor& d, const Tensor& tokens, const Tensor& positions) {
  wte_->backward(d, tokens);
  if (wpe_ >= 0) ops::embedding_backward(store_.grad(wpe_), d, positions, 0);
}

void T5::buckets(Tensor& out, int64_t T, bool bidirectional) const {
  std::vector<int32_t> b(static_cast<size_t>(T * T));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j)
      b[static_cast<size_t>(i * T + j)] =
          ops::relative_position_bucket(i, j, bidirectional, static_cast<int>(cfg_.relative_attention_num_buckets),
                                        static_cast<int>(cfg_.relative_attention_max_distance));
  upload(out, b, {T, T}, store_.device());
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
  have_grad_ = grad_scale != 0.0f;
  const int64_t ne = B * Te, nd = B * Td, vocab = cfg_.padded_vocab_size();
  for (const auto* tokens : {&batch.tokens, &batch.decoder_tokens})
    for (size_t i = 0; i < tokens->size(); ++i)
      check((*tokens)[i] >= 0 && (*tokens)[i] < vocab, "T5: token id ", (*tokens)[i], " at position ", i,
            " is outside the vocabulary (", vocab, ")");
  train::LossOutput out;
  for (int32_t y : batch.labels) out.count += y != train::kIgnoreLabel;
  const Device dev = store_.device();
  upload(enc_tokens_, batch.tokens, {ne}, dev);
  upload(dec_tokens_, batch.decoder_tokens, {nd}, dev);
  upload(labels_, batch.labels, {nd}, dev);
  if (!batch.padding_mask.empty())
    upload(enc_mask_, batch.padding_mask, {B, Te}, dev);
  else
    enc_mask_ = Tensor();
  if (!batch.decoder_padding_mask.empty())
    upload(dec_mask_, batch.decoder_padding_mask, {B, Td}, dev);
  else
    dec_mask_ = Tensor();

  // encoder
  embed(enc_emb_, enc_tokens_, enc_positions_);
  dropout_or_copy(enc_x_, enc_emb_, dropout_key(ctx, cfg_.hidden_dropout, 0));
  Tensor ebias, dbias;
  if (cfg_.relative_attention) {
    ops::relative_bias_forward(enc_bias_, store_.param(enc_rel_), enc_buckets_);
    ops::relative_bias_forward(dec_bias_, store_.param(dec_rel_), dec_buckets_);
    ebias = enc_bias_;
    dbias = dec_bias_;
  }
  encoder_->forward(enc_out_, enc_x_, B, Te, enc_mask_, ctx, ebias);
  enc_lnf_->forward(enc_h_, enc_mean_, enc_rstd_, enc_out_);

  // decoder: causal self-attention, cross-attention to the encoder output, MLP
  embed(dec_emb_, dec_tokens_, dec_positions_);
  dropout_or_copy(dec_x_, dec_emb_, dropout_key(ctx, cfg_.hidden_dropout, static_cast<uint64_t>(1 + 3 * cfg_.num_layers)));
  decoder_->forward(dec_out_, dec_x_, B, Td, dec_mask_, ctx, dbias, StackMemory{enc_h_, Te, enc_mask_});
  dec_lnf_->forward(dec_h_, dec_mean_, dec_rstd_, dec_out_);

  const TiedLmHead::Weights w{store_.param(wte_->param_id()), store_.grad(wte_->param_id()), store_.param(lm_bias_),
                              store_.grad(lm_bias_), wte_->vocab_begin()};
  head_.run(dec_h_, labels_, ctx.lm_divisor_for(out.count), w, grad_scale, ctx.loss_scale,
            have_grad_ ? d_dec_h_ : Tensor(), sums_);
  out.sums = sums_;
  return out;
}

void T5::backward() {
  check(have_grad_, "T5: backward() without a forward() that asked for gradients");
  have_grad_ = false;
  d_dec_out_.zero();
  dec_lnf_->backward(d_dec_out_, d_dec_h_, dec_out_, dec_mean_, dec_rstd_);
  dec_lnf_->grads_final();
  d_enc_h_.zero();
  const bool rel = cfg_.relative_attention;
  if (rel) {
    d_enc_bias_.zero();
    d_dec_bias_.zero();
  }
  decoder_->backward(d_dec_x_, d_dec_out_, rel ? d_dec_bias_ : Tensor(), d_enc_h_);
  // decoder embedding
  dec_emb_.zero();  // reused for the gradient of the embedding sum
  dropout_or_copy_backward(dec_emb_, d_dec_x_,
                           dropout_key(ctx_, cfg_.hidden_dropout, static_cast<uint64_t>(1 + 3 * cfg_.num_layers)));
  embed_backward(dec_emb_, dec_tokens_, dec_positions_);
  // encoder: final LayerNorm, the stack, the embedding
  d_enc_out_.zero();
  enc_lnf_->backward(d_enc_out_, d_enc_h_, enc_out_, enc_mean_, enc_rstd_);
  enc_lnf_->grads_final();
  encoder_->backward(d_enc_x_, d_enc_out_, rel ? d_enc_bias_ : Tensor());
  if (rel) {
    ops::relative_bias_backward(store_.grad(enc_rel_), d_enc_bias_, enc_buckets_);
    ops::relative_bias_backward(store_.grad(dec_rel_), d_dec_bias_, dec_buckets_);
  }
  enc_emb_.zero();  // reused for the gradient of the embedding sum
  dropout_or_copy_backward(enc_emb_, d_enc_x_, dropout_key(ctx_, cfg_.hidden_dropout, 0));
  embed_backward(enc_emb_, enc_tokens_, enc_positions_);
}

}  // namespace megabatch::models
