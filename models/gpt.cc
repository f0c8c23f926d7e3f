#include "models/gpt.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/ops/embedding.h"
#include "core/util/error.h"
#include "core/util/philox.h"

namespace megabatch::models {
using nn::Role;
using nn::Sharding;

Gpt::Gpt(const ModelConfig& c, comm::Communicator& tp) : cfg_(c), head_(tp) {
  check_model_group(cfg_, tp);
  const int64_t C = cfg_.hidden_size, L = cfg_.num_layers;
  const double std = cfg_.init_method_std;
  const nn::Init embedding = embedding_init(cfg_);
  wte_ = std::make_unique<nn::VocabParallelEmbedding>(store_, tp, "embedding.word_embeddings.weight",
                                                      cfg_.padded_vocab_size(), C, embedding);
  if (cfg_.learned_positions())  // (rotary ones turn the queries and keys instead; NoPE has none)
    wpe_ = store_.add({"embedding.position_embeddings.weight",
                       Role::kEmbedding,
                       -1,
                       {cfg_.max_positions(), C},
                       Sharding::replicated(tp.rank(), tp.size()),
                       embedding});
  StackConfig sc = stack_config(cfg_, "decoder.layers.", L, true);
  stack_ = std::make_unique<TransformerStack>(store_, tp, sc);
  lnf_ =
      std::make_unique<nn::Norm>(store_, "decoder.final_layernorm", C, -1, sc.norm, cfg_.layernorm_epsilon, sc.norm_1p);
  // Megatron's untied output layer: (vocab, C) split along the vocabulary as the embedding,
  // initialized as it is, a weight (not an embedding) to the optimizer
  if (cfg_.untie_embeddings_and_output_weights)
    output_ = std::make_unique<nn::VocabParallelEmbedding>(store_, tp, "output_layer.weight", cfg_.padded_vocab_size(),
                                                           C, nn::Init::normal(std), Role::kWeight);
}

std::string Gpt::summary() const {
  std::ostringstream os;
  os << "GPT " << (cfg_.preset.empty() ? "custom" : cfg_.preset) << ": " << cfg_.num_layers << " layers"
     << cfg_.residual_text() << ", hidden " << cfg_.hidden_size << ", " << cfg_.heads_text() << ", ffn " << cfg_.ffn()
     << (cfg_.swiglu         ? " (SwiGLU)"
         : cfg_.squared_relu ? " (squared ReLU)"
                             : "")
     << ", seq " << cfg_.seq_length << ", vocab " << cfg_.vocab_size << " (padded " << cfg_.padded_vocab_size() << "), "
     << store_.num_full_parameters() << " parameters"
     << (cfg_.eod_mask_loss ? "; no loss where the input is the end-of-document token (--eod-mask-loss)" : "")
     << (cfg_.reset_position_ids ? "; each document's positions from 0 (--reset-position-ids)" : "")
     << (cfg_.reset_attention_mask ? "; each document attends within itself (--reset-attention-mask)" : "")
     << (output_ ? "; an output layer of its own (--untie-embeddings-and-output-weights)" : "")
     << (cfg_.rope ? "; rotary positions turning " + std::to_string(cfg_.rotary_dim()) + " channels of each head" : "")
     << (!cfg_.rope && cfg_.no_position_embedding ? "; no position embeddings (--no-position-embedding)" : "");
  return os.str();
}

void Gpt::allocate(int64_t B, int64_t T) {
  if (B == B_ && T == T_) return;
  B_ = B;
  T_ = T;
  const int64_t n = B * T, C = cfg_.hidden_size;
  for (Tensor* t : {&emb_, &x_in_, &x_final_, &lnf_out_, &dlnf_, &dx_final_, &dx_}) alloc(*t, {n, C}, store_);
  alloc_acc(lnf_rstd_, {n}, store_);
  if (lnf_->kind() == nn::NormKind::kLayerNorm) alloc_acc(lnf_mean_, {n}, store_);
  alloc_acc(sums_, {1}, store_);
}

train::LossOutput Gpt::forward(const train::Batch& batch, const train::StepContext& ctx, float grad_scale) {
  check(store_.finalized(), "GPT: parameters not allocated");
  check(batch.seq >= 1 && batch.seq <= cfg_.max_positions(), "GPT: sequence length ", batch.seq,
        " exceeds max_position_embeddings ", cfg_.max_positions());
  allocate(batch.batch, batch.seq);
  ctx_ = ctx;
  have_grad_ = grad_scale != 0.0f;
  const int64_t n = B_ * T_;
  const int64_t vocab = cfg_.padded_vocab_size();
  train::LossOutput out;
  for (int64_t i = 0; i < n; ++i) {
    check(batch.tokens[i] >= 0 && batch.tokens[i] < vocab, "GPT: token id ", batch.tokens[i], " at position ", i,
          " is outside the vocabulary (", vocab, ")");
    out.count += batch.labels[i] != train::kIgnoreLabel;
  }
  const Device dev = store_.device();
  upload(tokens_, batch.tokens, {n}, dev);
  upload(labels_, batch.labels, {n}, dev);
  if (!batch.padding_mask.empty())
    upload(mask_, batch.padding_mask, {B_, T_}, dev);
  else
    mask_ = Tensor();
  if (!batch.documents.empty()) {  // --reset-attention-mask
    check(batch.documents.size() == static_cast<size_t>(n), "GPT: ", batch.documents.size(), " document ids for ", n,
          " tokens");
    for (int64_t i = 1; i < n; ++i)  // (the GPU's attention takes them as runs, unchecked)
      check(i % T_ == 0 || batch.documents[i] >= batch.documents[i - 1], "GPT: the documents of row ", i / T_,
            " go down at position ", i % T_, "; a document is a run of positions, its ids nondecreasing along a row");
    upload(documents_, batch.documents, {B_, T_}, dev);
  } else {
    documents_ = Tensor();
  }
  if (wpe_ >= 0 && !batch.position_ids.empty()) {  // --reset-position-ids: each document's own
    check(batch.position_ids.size() == static_cast<size_t>(n), "GPT: ", batch.position_ids.size(), " position ids for ",
          n, " tokens");
    upload(positions_, batch.position_ids, {B_, T_}, dev);
    batch_positions_ = true;
  } else if (wpe_ >= 0) {
    if (batch_positions_) positions_ = Tensor();  // (position_ids keeps ids of the same shape)
    batch_positions_ = false;
    position_ids(positions_, B_, T_, dev);
  }

  // embeddings: word + position, then dropout
  wte_->forward(emb_, tokens_);
  if (wpe_ >= 0) ops::embedding_forward(emb_, positions_, store_.param(wpe_), 0, true);
  dropout_or_copy(x_in_, emb_, dropout_key(ctx_, cfg_.hidden_dropout, 0));
  stack_->forward(x_final_, x_in_, B_, T_, mask_, ctx_, {}, {}, documents_);
  lnf_->forward(lnf_out_, lnf_mean_, lnf_rstd_, x_final_);

  // LM head tied to the word embedding (or the output layer's own), fused with the loss and its gradients
  const nn::VocabParallelEmbedding& head = output_ ? *output_ : *wte_;
  const TiedLmHead::Weights w{store_.param(head.param_id()), store_.grad(head.param_id()), {}, {}, head.vocab_begin()};
  head_.run(lnf_out_, labels_, ctx.lm_divisor_for(out.count), w, grad_scale, ctx.loss_scale,
            have_grad_ ? dlnf_ : Tensor(), sums_);
  out.sums = sums_;
  return out;
}

void Gpt::backward() {
  check(have_grad_, "GPT: backward() without a forward() that asked for gradients");
  have_grad_ = false;
  dx_final_.zero();
  lnf_->backward(dx_final_, dlnf_, x_final_, lnf_mean_, lnf_rstd_);
  lnf_->grads_final();
  stack_->backward(dx_, dx_final_);
  // embeddings
  emb_.zero();  // reused for the gradient of the embedding sum
  dropout_or_copy_backward(emb_, dx_, dropout_key(ctx_, cfg_.hidden_dropout, 0));
  wte_->backward(emb_, tokens_);
  if (wpe_ >= 0) ops::embedding_backward(store_.grad(wpe_), emb_, positions_, 0);
}

}  // namespace megabatch::models
