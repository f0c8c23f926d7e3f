#include "models/bert.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/ops/gelu.h"
#include "core/util/error.h"

namespace megabatch::models {
using nn::Role;
using nn::Sharding;

Bert::Bert(const ModelConfig& c, comm::Communicator& tp) : cfg_(c), tp_(&tp), head_(tp) {
  check_model_group(cfg_, tp);
  check(cfg_.num_tokentypes >= 1, "num_tokentypes must be >= 1");
  const int64_t C = cfg_.hidden_size;
  const double std = cfg_.init_method_std;
  const Sharding replicated = Sharding::replicated(tp.rank(), tp.size());
  wte_ = std::make_unique<nn::VocabParallelEmbedding>(store_, tp, "embedding.word_embeddings.weight",
                                                      cfg_.padded_vocab_size(), C, std);
  wpe_ = store_.add({"embedding.position_embeddings.weight", Role::kEmbedding, -1, {cfg_.max_positions(), C},
                     replicated, nn::Init::normal(std)});
  wtt_ = store_.add({"embedding.tokentype_embeddings.weight", Role::kEmbedding, -1, {cfg_.num_tokentypes, C},
                     replicated, nn::Init::normal(std)});
  if (cfg_.post_layernorm)
    emb_ln_ = std::make_unique<nn::LayerNorm>(store_, "embedding.layernorm", C, -1, cfg_.layernorm_epsilon);
  StackConfig sc = stack_config(cfg_, "encoder.layers.", cfg_.num_layers, false);
  sc.post_layernorm = cfg_.post_layernorm;
  stack_ = std::make_unique<TransformerStack>(store_, tp, sc);
  if (!cfg_.post_layernorm)
    lnf_ = std::make_unique<nn::LayerNorm>(store_, "encoder.final_layernorm", C, -1, cfg_.layernorm_epsilon);
  lm_dense_ = std::make_unique<nn::Linear>(store_, tp, "lm_head.dense", C, C, -1, std);
  lm_ln_ = std::make_unique<nn::LayerNorm>(store_, "lm_head.layer_norm", C, -1, cfg_.layernorm_epsilon);
  lm_bias_ = store_.add({"output_layer.bias", Role::kBias, -1, {cfg_.padded_vocab_size()},
                         Sharding::split(0, tp.rank(), tp.size()), nn::Init::zeros()});
  if (cfg_.binary_head) {
    pooler_ = std::make_unique<nn::Linear>(store_, tp, "pooler.dense", C, C, -1, std);
    binary_head_ = std::make_unique<nn::Linear>(store_, tp, "binary_head", C, 2, -1, std);
  }
}

std::string Bert::summary() const {
  std::ostringstream os;
  os << "BERT " << (cfg_.preset.empty() ? "custom" : cfg_.preset) << ": " << cfg_.num_layers << " layers"
     << (cfg_.post_layernorm ? " (post-LN)" : "") << ", hidden " << cfg_.hidden_size << ", "
     << cfg_.num_attention_heads << " heads, ffn " << cfg_.ffn() << ", seq " << cfg_.seq_length << ", vocab "
     << cfg_.vocab_size << " (padded " << cfg_.padded_vocab_size() << "), "
     << (cfg_.binary_head ? "sentence-order head, " : "") << store_.num_full_parameters() << " parameters";
  return os.str();
}

void Bert::allocate(int64_t B, int64_t T) {
  if (B == B_ && T == T_) return;
  B_ = B;
  T_ = T;
  const int64_t n = B * T, C = cfg_.hidden_size;
  for (Tensor* t : {&emb_, &emb_ln_out_, &x_in_, &x_final_, &h_, &dh_, &dx_, &demb_}) t->resize({n, C});
  for (Tensor* t : {&emb_mean_, &emb_rstd_, &h_mean_, &h_rstd_}) t->resize({n});
  for (Tensor* t : {&cls_, &pooled_, &dpooled_, &dcls_}) t->resize({B, C});
  for (Tensor* t : {&sop_logits_, &dsop_logits_}) t->resize({B, 2});
}

train::LossOutput Bert::forward(const train::Batch& batch, const train::StepContext& ctx, float grad_scale) {
  check(store_.finalized(), "BERT: parameters not allocated");
  check(batch.seq >= 1 && batch.seq <= cfg_.max_positions(), "BERT: sequence length ", batch.seq,
        " exceeds max_position_embeddings ", cfg_.max_positions());
  check(!cfg_.binary_head || static_cast<int64_t>(batch.sample_labels.size()) == batch.batch,
        "BERT: the batch has no sentence-order labels (binary_head is on)");
  allocate(batch.batch, batch.seq);
  ctx_ = ctx;
  batch_ = &batch;
  have_grad_ = grad_scale != 0.0f;
  grad_scale_ = grad_scale;
  const int64_t n = B_ * T_, C = cfg_.hidden_size, vocab = cfg_.padded_vocab_size();
  for (int64_t i = 0; i < n; ++i)
    check(batch.tokens[i] >= 0 && batch.tokens[i] < vocab, "BERT: token id ", batch.tokens[i], " at position ", i,
          " is outside the vocabulary (", vocab, ")");

  // embeddings: word + position + token type
  wte_->forward(emb_.data(), batch.tokens.data(), n);
  add_position_embeddings(emb_.data(), store_.param(wpe_), n, T_, C);
  {
    const float* wtt = store_.param(wtt_);
    const int32_t* types = batch.token_types.empty() ? nullptr : batch.token_types.data();
    float* e = emb_.data();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t type = types ? types[i] : 0;
      check(type >= 0 && type < cfg_.num_tokentypes, "BERT: token type ", type, " at position ", i,
            " is outside [0, ", cfg_.num_tokentypes, ")");
      for (int64_t c = 0; c < C; ++c) e[i * C + c] += wtt[type * C + c];
    }
  }
  const float* emb = emb_.data();
  if (emb_ln_) {
    emb_ln_->forward(emb_ln_out_.data(), emb_mean_.data(), emb_rstd_.data(), emb_.data(), n);
    emb = emb_ln_out_.data();
  }
  dropout_or_copy(x_in_.data(), emb, n * C, dropout_key(ctx_, cfg_.hidden_dropout, 0));
  const uint8_t* kmask = batch.padding_mask.empty() ? nullptr : batch.padding_mask.data();
  stack_->forward(x_final_.data(), x_in_.data(), B_, T_, kmask, ctx_);
  if (lnf_)
    lnf_->forward(h_.data(), h_mean_.data(), h_rstd_.data(), x_final_.data(), n);
  else
    std::memcpy(h_.data(), x_final_.data(), sizeof(float) * static_cast<size_t>(n * C));

  // masked-LM head on the masked positions only
  train::LossOutput out;
  rows_.clear();
  targets_.clear();
  for (int64_t i = 0; i < n; ++i)
    if (batch.labels[i] != train::kIgnoreLabel) {
      rows_.push_back(i);
      targets_.push_back(batch.labels[i]);
    }
  m_ = static_cast<int64_t>(rows_.size());
  if (m_ > 0) {
    for (Tensor* t : {&hm_, &d1_, &g1_, &l1_, &dl1_}) t->resize({m_, C});
    for (Tensor* t : {&l1_mean_, &l1_rstd_}) t->resize({m_});
    for (int64_t r = 0; r < m_; ++r)
      std::memcpy(hm_.data() + r * C, h_.data() + rows_[static_cast<size_t>(r)] * C, sizeof(float) * static_cast<size_t>(C));
    lm_dense_->forward(d1_.data(), hm_.data(), m_);
    ops::gelu_forward(g1_.data(), d1_.data(), m_ * C);
    lm_ln_->forward(l1_.data(), l1_mean_.data(), l1_rstd_.data(), g1_.data(), m_);
    // decoder tied to the word embedding, with its own bias; dl1_ gets d loss / d l1
    const TiedLmHead::Weights w{store_.param(wte_->param_id()), store_.grad(wte_->param_id()), store_.param(lm_bias_),
                                store_.grad(lm_bias_), wte_->vocab_local(), wte_->vocab_begin()};
    out = head_.run(l1_.data(), targets_.data(), m_, C, w, grad_scale, have_grad_ ? dl1_.data() : nullptr);
  }

  // sentence-order head on the [CLS] position
  if (binary_head_) {
    for (int64_t b = 0; b < B_; ++b)
      std::memcpy(cls_.data() + b * C, h_.data() + b * T_ * C, sizeof(float) * static_cast<size_t>(C));
    pooler_->forward(pooled_.data(), cls_.data(), B_);
    for (size_t i = 0; i < pooled_.numel(); ++i) pooled_[i] = std::tanh(pooled_[i]);
    binary_head_->forward(sop_logits_.data(), pooled_.data(), B_);
    train::LossTerm sop{"sop loss", 0.0, B_};
    sop_losses_.assign(static_cast<size_t>(B_), 0.0);
    for (int64_t b = 0; b < B_; ++b) {
      const int32_t y = batch.sample_labels[static_cast<size_t>(b)];
      check(y == 0 || y == 1, "BERT: sentence-order label ", y, " of sample ", b, " is not 0 or 1");
      const double z0 = sop_logits_[static_cast<size_t>(2 * b)], z1 = sop_logits_[static_cast<size_t>(2 * b + 1)];
      const double mx = std::max(z0, z1), lse = mx + std::log(std::exp(z0 - mx) + std::exp(z1 - mx));
      sop_losses_[static_cast<size_t>(b)] = lse - (y ? z1 : z0);
      sop.sum += sop_losses_[static_cast<size_t>(b)];
    }
    out.extra.push_back(sop);
  }
  return out;
}

void Bert::backward() {
  check(have_grad_, "BERT: backward() without a forward() that asked for gradients");
  have_grad_ = false;
  const int64_t n = B_ * T_, C = cfg_.hidden_size;
  dh_.zero();
  if (m_ > 0) {  // the head's part ran in forward: dl1_ holds d loss / d l1
    dtmp_m_.resize({m_, C});
    dtmp_m_.zero();
    lm_ln_->backward(dtmp_m_.data(), dl1_.data(), g1_.data(), l1_mean_.data(), l1_rstd_.data(), m_);
    dl1_.zero();
    ops::gelu_backward(dl1_.data(), dtmp_m_.data(), d1_.data(), m_ * C);
    dtmp_m_.zero();
    lm_dense_->backward(dtmp_m_.data(), dl1_.data(), hm_.data(), m_);
    for (int64_t r = 0; r < m_; ++r) {
      float* d = dh_.data() + rows_[static_cast<size_t>(r)] * C;
      const float* s = dtmp_m_.data() + r * C;
      for (int64_t c = 0; c < C; ++c) d[c] += s[c];
    }
  }
  if (binary_head_) {
    const float scale = grad_scale_ / static_cast<float>(B_);
    for (int64_t b = 0; b < B_; ++b) {
      const double z0 = sop_logits_[static_cast<size_t>(2 * b)], z1 = sop_logits_[static_cast<size_t>(2 * b + 1)];
      const double p1 = 1.0 / (1.0 + std::exp(z0 - z1));  // softmax probability of class 1
      const int32_t y = batch_->sample_labels[static_cast<size_t>(b)];
      dsop_logits_[static_cast<size_t>(2 * b)] = static_cast<float>(scale * ((1.0 - p1) - (y == 0)));
      dsop_logits_[static_cast<size_t>(2 * b + 1)] = static_cast<float>(scale * (p1 - (y == 1)));
    }
    dpooled_.zero();
    binary_head_->backward(dpooled_.data(), dsop_logits_.data(), pooled_.data(), B_);
    for (size_t i = 0; i < dpooled_.numel(); ++i) dpooled_[i] *= 1.0f - pooled_[i] * pooled_[i];  // tanh'
    dcls_.zero();
    pooler_->backward(dcls_.data(), dpooled_.data(), cls_.data(), B_);
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t c = 0; c < C; ++c) dh_[static_cast<size_t>(b * T_ * C + c)] += dcls_[static_cast<size_t>(b * C + c)];
  }
  // encoder
  if (lnf_) {
    dx_.zero();
    lnf_->backward(dx_.data(), dh_.data(), x_final_.data(), h_mean_.data(), h_rstd_.data(), n);
    stack_->backward(dh_.data(), dx_.data());  // dh_ now holds d x_in
  } else {
    stack_->backward(dx_.data(), dh_.data());
    std::memcpy(dh_.data(), dx_.data(), sizeof(float) * static_cast<size_t>(n * C));
  }
  // embeddings
  demb_.zero();
  dropout_or_copy_backward(demb_.data(), dh_.data(), n * C, dropout_key(ctx_, cfg_.hidden_dropout, 0));
  if (emb_ln_) {
    dx_.zero();
    emb_ln_->backward(dx_.data(), demb_.data(), emb_.data(), emb_mean_.data(), emb_rstd_.data(), n);
    std::memcpy(demb_.data(), dx_.data(), sizeof(float) * static_cast<size_t>(n * C));
  }
  wte_->backward(demb_.data(), batch_->tokens.data(), n);
  position_embeddings_backward(store_.grad(wpe_), demb_.data(), n, T_, C);
  float* dwtt = store_.grad(wtt_);
  const int32_t* types = batch_->token_types.empty() ? nullptr : batch_->token_types.data();
  const float* g = demb_.data();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < C; ++c) dwtt[(types ? types[i] : 0) * C + c] += g[i * C + c];
}

}  // namespace megabatch::models
