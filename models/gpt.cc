#include "models/gpt.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/ops/matmul.h"
#include "core/util/error.h"
#include "core/util/philox.h"

namespace megabatch::models {
using nn::Role;
using nn::Sharding;

Gpt::Gpt(const ModelConfig& c, comm::Communicator& tp) : cfg_(c), tp_(&tp), head_(tp) {
  check_model_group(cfg_, tp);
  const int64_t C = cfg_.hidden_size, L = cfg_.num_layers;
  const double std = cfg_.init_method_std;
  wte_ = std::make_unique<nn::VocabParallelEmbedding>(store_, tp, "embedding.word_embeddings.weight",
                                                      cfg_.padded_vocab_size(), C, std);
  wpe_ = store_.add({"embedding.position_embeddings.weight", Role::kEmbedding, -1, {cfg_.max_positions(), C},
                     Sharding::replicated(tp.rank(), tp.size()), nn::Init::normal(std)});
  StackConfig sc = stack_config(cfg_, "decoder.layers.", L, true);
  stack_ = std::make_unique<TransformerStack>(store_, tp, sc);
  lnf_ = std::make_unique<nn::LayerNorm>(store_, "decoder.final_layernorm", C, -1, cfg_.layernorm_epsilon);
}

std::string Gpt::summary() const {
  std::ostringstream os;
  os << "GPT " << (cfg_.preset.empty() ? "custom" : cfg_.preset) << ": " << cfg_.num_layers << " layers, hidden "
     << cfg_.hidden_size << ", " << cfg_.num_attention_heads << " heads, ffn " << cfg_.ffn() << ", seq "
     << cfg_.seq_length << ", vocab " << cfg_.vocab_size << " (padded " << cfg_.padded_vocab_size() << "), "
     << store_.num_full_parameters() << " parameters";
  return os.str();
}

void Gpt::allocate(int64_t B, int64_t T) {
  if (B == B_ && T == T_) return;
  B_ = B;
  T_ = T;
  const int64_t n = B * T, C = cfg_.hidden_size;
  for (Tensor* t : {&emb_, &x_in_, &x_final_, &lnf_out_, &dlnf_, &dx_final_, &dx_}) t->resize({n, C});
  for (Tensor* t : {&lnf_mean_, &lnf_rstd_}) t->resize({n});
}

train::LossOutput Gpt::forward(const train::Batch& batch, const train::StepContext& ctx, float grad_scale) {
  check(store_.finalized(), "GPT: parameters not allocated");
  check(batch.seq >= 1 && batch.seq <= cfg_.max_positions(), "GPT: sequence length ", batch.seq,
        " exceeds max_position_embeddings ", cfg_.max_positions());
  allocate(batch.batch, batch.seq);
  ctx_ = ctx;
  batch_ = &batch;
  have_grad_ = grad_scale != 0.0f;
  const int64_t n = B_ * T_, C = cfg_.hidden_size;
  const int64_t vocab = cfg_.padded_vocab_size();
  for (int64_t i = 0; i < n; ++i)
    check(batch.tokens[i] >= 0 && batch.tokens[i] < vocab, "GPT: token id ", batch.tokens[i], " at position ", i,
          " is outside the vocabulary (", vocab, ")");

  // embeddings: word + position, then dropout
  wte_->forward(emb_.data(), batch.tokens.data(), n);
  add_position_embeddings(emb_.data(), store_.param(wpe_), n, T_, C);
  const uint8_t* kmask = batch.padding_mask.empty() ? nullptr : batch.padding_mask.data();
  dropout_or_copy(x_in_.data(), emb_.data(), n * C, dropout_key(ctx_, cfg_.hidden_dropout, 0));
  stack_->forward(x_final_.data(), x_in_.data(), B_, T_, kmask, ctx_);
  lnf_->forward(lnf_out_.data(), lnf_mean_.data(), lnf_rstd_.data(), x_final_.data(), n);

  // LM head tied to the word embedding, fused with the loss and its gradients
  const TiedLmHead::Weights w{store_.param(wte_->param_id()), store_.grad(wte_->param_id()), nullptr, nullptr,
                              wte_->vocab_local(), wte_->vocab_begin()};
  return head_.run(lnf_out_.data(), batch.labels.data(), n, C, w, grad_scale, have_grad_ ? dlnf_.data() : nullptr);
}

void Gpt::backward() {
  check(have_grad_, "GPT: backward() without a forward() that asked for gradients");
  have_grad_ = false;
  const int64_t n = B_ * T_, C = cfg_.hidden_size;
  dx_final_.zero();
  lnf_->backward(dx_final_.data(), dlnf_.data(), x_final_.data(), lnf_mean_.data(), lnf_rstd_.data(), n);
  stack_->backward(dx_.data(), dx_final_.data());
  // embeddings
  emb_.zero();  // reused for the gradient of the embedding sum
  dropout_or_copy_backward(emb_.data(), dx_.data(), n * C, dropout_key(ctx_, cfg_.hidden_dropout, 0));
  wte_->backward(emb_.data(), batch_->tokens.data(), n);
  position_embeddings_backward(store_.grad(wpe_), emb_.data(), n, T_, C);
}

}  // namespace megabatch::models
