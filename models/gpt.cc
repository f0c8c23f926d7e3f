#include "models/gpt.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/ops/attention.h"
#include "core/ops/gelu.h"
#include "core/ops/matmul.h"
#include "core/ops/residual.h"
#include "core/util/error.h"
#include "core/util/philox.h"

namespace megabatch::models {
using nn::Role;
using nn::Sharding;

Gpt::Gpt(const ModelConfig& c, comm::Communicator& tp) : cfg_(c), tp_(&tp), ce_(tp, train::kIgnoreLabel) {
  cfg_.validate();
  check(cfg_.tensor_model_parallel_size == tp.size(), "tensor_model_parallel_size (", cfg_.tensor_model_parallel_size,
        ") differs from the tensor-parallel group size (", tp.size(), ")");
  const int64_t C = cfg_.hidden_size, L = cfg_.num_layers;
  const double std = cfg_.init_method_std, out_std = std / std::sqrt(2.0 * static_cast<double>(L));
  heads_local_ = cfg_.num_attention_heads / tp.size();
  wte_ = std::make_unique<nn::VocabParallelEmbedding>(store_, tp, "embedding.word_embeddings.weight",
                                                      cfg_.padded_vocab_size(), C, std);
  wpe_ = store_.add({"embedding.position_embeddings.weight", Role::kEmbedding, -1, {cfg_.max_positions(), C},
                     Sharding::replicated(tp.rank(), tp.size()), nn::Init::normal(std)});
  blocks_.reserve(L);
  for (int l = 0; l < L; ++l) {
    const std::string p = "decoder.layers." + std::to_string(l) + ".";
    blocks_.push_back(Block{
        nn::LayerNorm(store_, p + "input_layernorm", C, l, cfg_.layernorm_epsilon),
        nn::LayerNorm(store_, p + "pre_mlp_layernorm", C, l, cfg_.layernorm_epsilon),
        nn::ColumnParallelLinear(store_, tp, p + "self_attention.linear_qkv", C, 3 * C, l, std),
        nn::ColumnParallelLinear(store_, tp, p + "mlp.linear_fc1", C, cfg_.ffn(), l, std),
        nn::RowParallelLinear(store_, tp, p + "self_attention.linear_proj", C, C, l, out_std),
        nn::RowParallelLinear(store_, tp, p + "mlp.linear_fc2", cfg_.ffn(), C, l, out_std)});
  }
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
  const int64_t n = B * T, C = cfg_.hidden_size, Cl = C / tp_->size(), Fl = cfg_.ffn() / tp_->size();
  saved_.resize(blocks_.size());
  for (auto& s : saved_) {
    for (Tensor* t : {&s.x_in, &s.ln1, &s.proj, &s.x_mid, &s.ln2, &s.fc2}) t->resize({n, C});
    for (Tensor* t : {&s.ln1_mean, &s.ln1_rstd, &s.ln2_mean, &s.ln2_rstd}) t->resize({n});
    s.qkv.resize({n, 3 * Cl});
    s.probs.resize({B, heads_local_, T, T});
    s.attn.resize({n, Cl});
    s.fc1.resize({n, Fl});
    s.gelu.resize({n, Fl});
  }
  for (Tensor* t : {&emb_, &x_final_, &lnf_out_, &dlnf_, &g_res_a_, &g_res_b_, &g_c_}) t->resize({n, C});
  for (Tensor* t : {&lnf_mean_, &lnf_rstd_, &losses_, &dloss_}) t->resize({n});
  g_qkv_.resize({n, 3 * Cl});
  g_attn_.resize({n, Cl});
  g_ff_a_.resize({n, Fl});
  g_ff_b_.resize({n, Fl});
  positions_.resize(n);
  for (int64_t i = 0; i < n; ++i) positions_[i] = static_cast<int32_t>(i % T);
}

ops::DropoutKey Gpt::dropout_key(double p, uint64_t stream) const {
  ops::DropoutKey k;
  k.p = ctx_.training ? p : 0.0;
  k.key = mix_key(mix_key(ctx_.seed, static_cast<uint64_t>(ctx_.iteration)), static_cast<uint64_t>(ctx_.micro_batch));
  k.stream = stream;
  return k;
}

namespace {
// out = in, with dropout when k.p > 0
void maybe_dropout(float* out, const float* in, int64_t n, const ops::DropoutKey& k) {
  if (k.p > 0)
    ops::dropout_forward(out, in, n, 0, k);
  else
    std::memcpy(out, in, sizeof(float) * n);
}
void maybe_dropout_backward(float* din, const float* dout, int64_t n, const ops::DropoutKey& k) {
  if (k.p > 0)
    ops::dropout_backward(din, dout, n, 0, k);
  else
    ops::residual_backward<float>(din, nullptr, dout, n);
}
uint64_t stream_of(int layer, int site) { return 1 + static_cast<uint64_t>(layer) * 3 + site; }
}  // namespace

train::LossOutput Gpt::forward(const train::Batch& batch, const train::StepContext& ctx, float grad_scale) {
  check(store_.finalized(), "GPT: parameters not allocated");
  check(batch.seq >= 1 && batch.seq <= cfg_.max_positions(), "GPT: sequence length ", batch.seq,
        " exceeds max_position_embeddings ", cfg_.max_positions());
  allocate(batch.batch, batch.seq);
  ctx_ = ctx;
  batch_ = &batch;
  have_grad_ = grad_scale != 0.0f;
  const int64_t n = B_ * T_, C = cfg_.hidden_size, Fl = cfg_.ffn() / tp_->size();
  const int64_t vocab = cfg_.padded_vocab_size();
  for (int64_t i = 0; i < n; ++i)
    check(batch.tokens[i] >= 0 && batch.tokens[i] < vocab, "GPT: token id ", batch.tokens[i], " at position ", i,
          " is outside the vocabulary (", vocab, ")");

  // embeddings: word + position, then dropout
  wte_->forward(emb_.data(), batch.tokens.data(), n);
  {
    const float* wpe = store_.param(wpe_);
    float* e = emb_.data();
#pragma omp parallel for schedule(static) if (n * C > 65536)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < C; ++c) e[i * C + c] += wpe[positions_[i] * C + c];
  }
  const uint8_t* kmask = batch.padding_mask.empty() ? nullptr : batch.padding_mask.data();
  ops::AttentionShape as{B_, T_, heads_local_, C / cfg_.num_attention_heads, true,
                         heads_local_ * tp_->rank(), cfg_.num_attention_heads};
  maybe_dropout(saved_[0].x_in.data(), emb_.data(), n * C,
                dropout_key(cfg_.hidden_dropout, 0));

  for (size_t l = 0; l < blocks_.size(); ++l) {
    Block& b = blocks_[l];
    Saved& s = saved_[l];
    const int li = static_cast<int>(l);
    b.ln1.forward(s.ln1.data(), s.ln1_mean.data(), s.ln1_rstd.data(), s.x_in.data(), n);
    b.qkv.forward(s.qkv.data(), s.ln1.data(), n);
    const ops::DropoutKey attn_drop = dropout_key(cfg_.attention_dropout, stream_of(li, 0));
    ops::attention_forward(s.attn.data(), s.probs.data(), s.qkv.data(), kmask, as, &attn_drop);
    b.proj.forward(s.proj.data(), s.attn.data(), n);
    maybe_dropout(g_c_.data(), s.proj.data(), n * C, dropout_key(cfg_.hidden_dropout, stream_of(li, 1)));
    ops::residual_forward(s.x_mid.data(), s.x_in.data(), g_c_.data(), n * C);
    b.ln2.forward(s.ln2.data(), s.ln2_mean.data(), s.ln2_rstd.data(), s.x_mid.data(), n);
    b.fc1.forward(s.fc1.data(), s.ln2.data(), n);
    ops::gelu_forward(s.gelu.data(), s.fc1.data(), n * Fl);
    b.fc2.forward(s.fc2.data(), s.gelu.data(), n);
    maybe_dropout(g_c_.data(), s.fc2.data(), n * C, dropout_key(cfg_.hidden_dropout, stream_of(li, 2)));
    float* next = l + 1 < blocks_.size() ? saved_[l + 1].x_in.data() : x_final_.data();
    ops::residual_forward(next, s.x_mid.data(), g_c_.data(), n * C);
  }
  lnf_->forward(lnf_out_.data(), lnf_mean_.data(), lnf_rstd_.data(), x_final_.data(), n);

  // LM head tied to the word embedding, in row chunks: logits, loss and (when training)
  // the head's gradients, so only chunk x vocab logits ever exist.
  train::LossOutput out;
  for (int64_t i = 0; i < n; ++i) out.count += batch.labels[i] != train::kIgnoreLabel;
  const int64_t Vl = wte_->vocab_local(), v0 = wte_->vocab_begin();
  const float* W = store_.param(wte_->param_id());
  float* dW = store_.grad(wte_->param_id());
  if (have_grad_) dlnf_.zero();
  const float dl = out.count ? grad_scale / static_cast<float>(out.count) : 0.0f;
  for (int64_t r0 = 0; r0 < n; r0 += head_chunk_) {
    const int64_t R = std::min(head_chunk_, n - r0);
    logits_.resize({R, Vl});
    ops::gemm<float>(ops::Trans::N, ops::Trans::T, R, Vl, C, 1.0f, lnf_out_.data() + r0 * C, C, W, C, 0.0f,
                     logits_.data(), Vl);
    ce_.forward(losses_.data() + r0, logits_.data(), batch.labels.data() + r0, R, Vl, v0);
    if (!have_grad_) continue;
    for (int64_t i = 0; i < R; ++i) dloss_[r0 + i] = dl;
    dlogits_.resize({R, Vl});
    dlogits_.zero();
    ce_.backward(dlogits_.data(), logits_.data(), batch.labels.data() + r0, dloss_.data() + r0, R, Vl, v0);
    ops::gemm<float>(ops::Trans::N, ops::Trans::N, R, C, Vl, 1.0f, dlogits_.data(), Vl, W, C, 0.0f,
                     dlnf_.data() + r0 * C, C);
    tp_->all_reduce(dlnf_.data() + r0 * C, static_cast<size_t>(R * C), comm::ReduceOp::kSum);
    ops::gemm<float>(ops::Trans::T, ops::Trans::N, Vl, C, R, 1.0f, dlogits_.data(), Vl, lnf_out_.data() + r0 * C, C,
                     1.0f, dW, C);
  }
  for (int64_t i = 0; i < n; ++i) out.loss_sum += losses_[i];
  return out;
}

void Gpt::backward() {
  check(have_grad_, "GPT: backward() without a forward() that asked for gradients");
  have_grad_ = false;
  const int64_t n = B_ * T_, C = cfg_.hidden_size, Fl = cfg_.ffn() / tp_->size();
  const uint8_t* kmask = batch_->padding_mask.empty() ? nullptr : batch_->padding_mask.data();
  ops::AttentionShape as{B_, T_, heads_local_, C / cfg_.num_attention_heads, true,
                         heads_local_ * tp_->rank(), cfg_.num_attention_heads};
  Tensor* dres = &g_res_a_;  // gradient of the residual stream entering the current block
  Tensor* dnext = &g_res_b_;
  dres->zero();
  lnf_->backward(dres->data(), dlnf_.data(), x_final_.data(), lnf_mean_.data(), lnf_rstd_.data(), n);

  for (size_t l = blocks_.size(); l-- > 0;) {
    Block& b = blocks_[l];
    Saved& s = saved_[l];
    const int li = static_cast<int>(l);
    // x_out = x_mid + dropout(fc2(gelu(fc1(ln2(x_mid)))))
    std::memcpy(dnext->data(), dres->data(), sizeof(float) * n * C);  // d x_mid (residual path)
    g_c_.zero();
    maybe_dropout_backward(g_c_.data(), dres->data(), n * C, dropout_key(cfg_.hidden_dropout, stream_of(li, 2)));
    g_ff_a_.zero();
    b.fc2.backward(g_ff_a_.data(), g_c_.data(), s.gelu.data(), n);
    g_ff_b_.zero();
    ops::gelu_backward(g_ff_b_.data(), g_ff_a_.data(), s.fc1.data(), n * Fl);
    g_c_.zero();
    b.fc1.backward(g_c_.data(), g_ff_b_.data(), s.ln2.data(), n);
    b.ln2.backward(dnext->data(), g_c_.data(), s.x_mid.data(), s.ln2_mean.data(), s.ln2_rstd.data(), n);
    std::swap(dres, dnext);
    // x_mid = x_in + dropout(proj(attention(qkv(ln1(x_in)))))
    std::memcpy(dnext->data(), dres->data(), sizeof(float) * n * C);  // d x_in (residual path)
    g_c_.zero();
    maybe_dropout_backward(g_c_.data(), dres->data(), n * C, dropout_key(cfg_.hidden_dropout, stream_of(li, 1)));
    g_attn_.zero();
    b.proj.backward(g_attn_.data(), g_c_.data(), s.attn.data(), n);
    g_qkv_.zero();
    const ops::DropoutKey attn_drop = dropout_key(cfg_.attention_dropout, stream_of(li, 0));
    ops::attention_backward(g_qkv_.data(), g_attn_.data(), s.qkv.data(), s.probs.data(), kmask, as, &attn_drop);
    g_c_.zero();
    b.qkv.backward(g_c_.data(), g_qkv_.data(), s.ln1.data(), n);
    b.ln1.backward(dnext->data(), g_c_.data(), s.x_in.data(), s.ln1_mean.data(), s.ln1_rstd.data(), n);
    std::swap(dres, dnext);
  }
  // embeddings
  g_c_.zero();
  maybe_dropout_backward(g_c_.data(), dres->data(), n * C, dropout_key(cfg_.hidden_dropout, 0));
  wte_->backward(g_c_.data(), batch_->tokens.data(), n);
  float* dwpe = store_.grad(wpe_);
  const float* g = g_c_.data();
  // positions repeat every T rows: sum the B rows of each position in batch order
#pragma omp parallel for schedule(static) if (T_ * C > 16384)
  for (int64_t t = 0; t < T_; ++t)
    for (int64_t bb = 0; bb < B_; ++bb)
      for (int64_t c = 0; c < C; ++c) dwpe[t * C + c] += g[(bb * T_ + t) * C + c];
}

}  // namespace megabatch::models
