#include "models/bert.h"

#include <cmath>
#include <sstream>

#include "core/ops/activation.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/embedding.h"
#include "core/ops/gather.h"
#include "core/ops/reduce.h"
#include "core/util/error.h"

namespace megabatch::models {
using nn::Role;
using nn::Sharding;

Bert::Bert(const ModelConfig& c, comm::Communicator& tp) : cfg_(c), head_(tp) {
  check_model_group(cfg_, tp);
  check(cfg_.num_tokentypes >= 1, "num_tokentypes must be >= 1");
  const int64_t C = cfg_.hidden_size;
  const double std = cfg_.init_method_std;
  const Sharding replicated = Sharding::replicated(tp.rank(), tp.size());
  const nn::Init embedding = embedding_init(cfg_);
  wte_ = std::make_unique<nn::VocabParallelEmbedding>(store_, tp, "embedding.word_embeddings.weight",
                                                      cfg_.padded_vocab_size(), C, embedding);
  if (cfg_.learned_positions())  // (none with --no-position-embedding)
    wpe_ = store_.add({"embedding.position_embeddings.weight",
                       Role::kEmbedding,
                       -1,
                       {cfg_.max_positions(), C},
                       replicated,
                       embedding});
  wtt_ = store_.add(
      {"embedding.tokentype_embeddings.weight", Role::kEmbedding, -1, {cfg_.num_tokentypes, C}, replicated, embedding});
  StackConfig sc = stack_config(cfg_, "encoder.layers.", cfg_.num_layers, false);
  sc.post_layernorm = cfg_.post_layernorm;
  if (cfg_.post_layernorm)
    emb_ln_ =
        std::make_unique<nn::Norm>(store_, "embedding.layernorm", C, -1, sc.norm, cfg_.layernorm_epsilon, sc.norm_1p);
  stack_ = std::make_unique<TransformerStack>(store_, tp, sc);
  if (!cfg_.post_layernorm)
    lnf_ = std::make_unique<nn::Norm>(store_, "encoder.final_layernorm", C, -1, sc.norm, cfg_.layernorm_epsilon,
                                      sc.norm_1p);
  lm_dense_ = std::make_unique<nn::Linear>(store_, tp, "lm_head.dense", C, C, -1, std);
  lm_ln_ = std::make_unique<nn::Norm>(store_, "lm_head.layer_norm", C, -1, sc.norm, cfg_.layernorm_epsilon, sc.norm_1p);
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
     << (cfg_.post_layernorm ? " (post-LN)" : "") << cfg_.residual_text() << ", hidden " << cfg_.hidden_size << ", "
     << cfg_.heads_text() << ", ffn " << cfg_.ffn()
     << (cfg_.swiglu         ? " (SwiGLU)"
         : cfg_.squared_relu ? " (squared ReLU)"
                             : "")
     << ", seq " << cfg_.seq_length << ", vocab " << cfg_.vocab_size << " (padded " << cfg_.padded_vocab_size() << "), "
     << (cfg_.binary_head ? "sentence-order head, " : "") << store_.num_full_parameters() << " parameters";
  return os.str();
}

void Bert::allocate(int64_t B, int64_t T) {
  if (B == B_ && T == T_) return;
  B_ = B;
  T_ = T;
  const int64_t n = B * T, C = cfg_.hidden_size;
  for (Tensor* t : {&emb_, &emb_ln_out_, &x_in_, &x_final_, &h_, &dh_, &dx_, &demb_}) alloc(*t, {n, C}, store_);
  for (Tensor* t : {&emb_mean_, &emb_rstd_, &h_mean_, &h_rstd_}) alloc_acc(*t, {n}, store_);
  for (Tensor* t : {&cls_, &pooled_, &pooled_act_, &dpooled_, &dpooled_act_, &dcls_}) alloc(*t, {B, C}, store_);
  for (Tensor* t : {&sop_logits_, &dsop_logits_}) alloc(*t, {B, 2}, store_);
  for (Tensor* t : {&sop_max_, &sop_sumexp_, &sop_target_, &sop_losses_}) alloc_acc(*t, {B}, store_);
  alloc_acc(sums_, {binary_head_ ? 2 : 1}, store_);  // the lm loss, and the sentence-order loss
  if (wpe_ >= 0) position_ids(positions_, B, T, store_.device());
  std::vector<int32_t> cls(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) cls[static_cast<size_t>(b)] = static_cast<int32_t>(b * T);
  upload(cls_rows_, cls, {B}, store_.device());
}

train::LossOutput Bert::forward(const train::Batch& batch, const train::StepContext& ctx, float grad_scale) {
  check(store_.finalized(), "BERT: parameters not allocated");
  check(batch.seq >= 1 && batch.seq <= cfg_.max_positions(), "BERT: sequence length ", batch.seq,
        " exceeds max_position_embeddings ", cfg_.max_positions());
  check(!cfg_.binary_head || static_cast<int64_t>(batch.sample_labels.size()) == batch.batch,
        "BERT: the batch has no sentence-order labels (binary_head is on)");
  allocate(batch.batch, batch.seq);
  ctx_ = ctx;
  have_grad_ = grad_scale != 0.0f;
  grad_scale_ = grad_scale;
  std::vector<int32_t> rows, targets;
  upload_batch(batch, rows, targets);
  encode();
  train::LossOutput out;
  sums_.zero();
  out.sums = sums_;
  masked_lm_head(rows, targets, out);
  if (binary_head_) sentence_order_head(batch, out);
  return out;
}

void Bert::upload_batch(const train::Batch& batch, std::vector<int32_t>& rows, std::vector<int32_t>& targets) {
  const int64_t n = B_ * T_, vocab = cfg_.padded_vocab_size();
  const Device dev = store_.device();
  std::vector<int32_t> types(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i) {
    check(batch.tokens[i] >= 0 && batch.tokens[i] < vocab, "BERT: token id ", batch.tokens[i], " at position ", i,
          " is outside the vocabulary (", vocab, ")");
    if (!batch.token_types.empty()) {
      types[static_cast<size_t>(i)] = batch.token_types[static_cast<size_t>(i)];
      check(types[static_cast<size_t>(i)] >= 0 && types[static_cast<size_t>(i)] < cfg_.num_tokentypes, "BERT: token type ",
            types[static_cast<size_t>(i)], " at position ", i, " is outside [0, ", cfg_.num_tokentypes, ")");
    }
    if (batch.labels[i] != train::kIgnoreLabel) {  // the masked positions
      rows.push_back(static_cast<int32_t>(i));
      targets.push_back(batch.labels[i]);
    }
  }
  upload(tokens_, batch.tokens, {n}, dev);
  upload(types_, types, {n}, dev);
  if (!batch.padding_mask.empty())
    upload(mask_, batch.padding_mask, {B_, T_}, dev);
  else
    mask_ = Tensor();
}

void Bert::encode() {
  // embeddings: word + position + token type
  wte_->forward(emb_, tokens_);
  if (wpe_ >= 0) ops::embedding_forward(emb_, positions_, store_.param(wpe_), 0, true);
  ops::embedding_forward(emb_, types_, store_.param(wtt_), 0, true);
  const Tensor* emb = &emb_;
  if (emb_ln_) {
    emb_ln_->forward(emb_ln_out_, emb_mean_, emb_rstd_, emb_);
    emb = &emb_ln_out_;
  }
  dropout_or_copy(x_in_, *emb, dropout_key(ctx_, cfg_.hidden_dropout, 0));
  stack_->forward(x_final_, x_in_, B_, T_, mask_, ctx_);
  if (lnf_)
    lnf_->forward(h_, h_mean_, h_rstd_, x_final_);
  else
    copy(h_, x_final_);
}

// The masked-LM head on the masked positions only.
void Bert::masked_lm_head(const std::vector<int32_t>& rows, const std::vector<int32_t>& targets, train::LossOutput& out) {
  m_ = static_cast<int64_t>(rows.size());
  out.count = m_;
  if (m_ == 0) return;
  const int64_t C = cfg_.hidden_size;
  const Device dev = store_.device();
  upload(rows_, rows, {m_}, dev);
  upload(targets_, targets, {m_}, dev);
  for (Tensor* t : {&hm_, &d1_, &g1_, &l1_, &dl1_}) alloc(*t, {m_, C}, store_);
  for (Tensor* t : {&l1_mean_, &l1_rstd_}) alloc_acc(*t, {m_}, store_);
  ops::gather_rows(hm_, h_, rows_);
  lm_dense_->forward(d1_, hm_);
  ops::gelu_forward(g1_, d1_);
  lm_ln_->forward(l1_, l1_mean_, l1_rstd_, g1_);
  // decoder tied to the word embedding, with its own bias; dl1_ gets d loss / d l1
  const TiedLmHead::Weights w{store_.param(wte_->param_id()), store_.grad(wte_->param_id()), store_.param(lm_bias_),
                              store_.grad(lm_bias_), wte_->vocab_begin()};
  head_.run(l1_, targets_, ctx_.lm_divisor_for(m_), w, grad_scale_, ctx_.loss_scale, have_grad_ ? dl1_ : Tensor(),
            sums_.flat(0, 1));
}

// The sentence-order head on the [CLS] position: a two-class cross entropy.
void Bert::sentence_order_head(const train::Batch& batch, train::LossOutput& out) {
  for (int32_t y : batch.sample_labels) check(y == 0 || y == 1, "BERT: sentence-order label ", y, " is not 0 or 1");
  upload(sop_labels_, batch.sample_labels, {B_}, store_.device());
  ops::gather_rows(cls_, h_, cls_rows_);
  pooler_->forward(pooled_, cls_);
  ops::tanh_forward(pooled_act_, pooled_);
  binary_head_->forward(sop_logits_, pooled_act_);
  ops::ce_row_max(sop_max_, sop_logits_);
  ops::ce_sum_exp(sop_sumexp_, sop_logits_, sop_max_);
  ops::ce_target_logit(sop_target_, sop_logits_, sop_labels_, 0);
  ops::ce_loss(sop_losses_, sop_max_, sop_sumexp_, sop_target_, sop_labels_, train::kIgnoreLabel);
  ops::sum(sums_.flat(1, 1), sop_losses_);
  out.extra.emplace_back("sop loss", B_);
}

void Bert::backward() {
  check(have_grad_, "BERT: backward() without a forward() that asked for gradients");
  have_grad_ = false;
  const int64_t C = cfg_.hidden_size;
  dh_.zero();
  if (m_ > 0) {  // the head's part ran in forward: dl1_ holds d loss / d l1
    alloc(dtmp_m_, {m_, C}, store_);
    dtmp_m_.zero();
    lm_ln_->backward(dtmp_m_, dl1_, g1_, l1_mean_, l1_rstd_);
    dl1_.zero();
    ops::gelu_backward(dl1_, dtmp_m_, d1_);
    dtmp_m_.zero();
    lm_dense_->backward(dtmp_m_, dl1_, hm_);
    ops::scatter_add_rows(dh_, dtmp_m_, rows_);
  }
  if (binary_head_) {
    dsop_logits_.zero();
    ops::ce_backward(dsop_logits_, sop_logits_, sop_max_, sop_sumexp_, sop_labels_, 0, train::kIgnoreLabel,
                     grad_scale_ / static_cast<float>(B_), ctx_.loss_scale);
    dpooled_act_.zero();
    binary_head_->backward(dpooled_act_, dsop_logits_, pooled_act_);
    dpooled_.zero();
    ops::tanh_backward(dpooled_, dpooled_act_, pooled_act_);
    dcls_.zero();
    pooler_->backward(dcls_, dpooled_, cls_);
    ops::scatter_add_rows(dh_, dcls_, cls_rows_);
  }
  // encoder
  if (lnf_) {
    dx_.zero();
    lnf_->backward(dx_, dh_, x_final_, h_mean_, h_rstd_);
    lnf_->grads_final();
    stack_->backward(dh_, dx_);  // dh_ now holds d x_in
  } else {
    stack_->backward(dx_, dh_);
    copy(dh_, dx_);
  }
  // embeddings
  demb_.zero();
  dropout_or_copy_backward(demb_, dh_, dropout_key(ctx_, cfg_.hidden_dropout, 0));
  if (emb_ln_) {
    dx_.zero();
    emb_ln_->backward(dx_, demb_, emb_, emb_mean_, emb_rstd_);
    copy(demb_, dx_);
  }
  wte_->backward(demb_, tokens_);
  if (wpe_ >= 0) ops::embedding_backward(store_.grad(wpe_), demb_, positions_, 0);
  ops::embedding_backward(store_.grad(wtt_), demb_, types_, 0);
}

}  // namespace megabatch::models
