#include "models/transformer.h"

#include <cstring>

#include "core/ops/attention.h"
#include "core/ops/gelu.h"
#include "core/ops/residual.h"
#include "core/util/error.h"
#include "core/util/philox.h"

namespace megabatch::models {

StackConfig stack_config(const ModelConfig& c, const std::string& prefix, int64_t layers, bool causal) {
  StackConfig sc;
  sc.prefix = prefix;
  sc.layers = layers;
  sc.hidden = c.hidden_size;
  sc.heads = c.num_attention_heads;
  sc.ffn = c.ffn();
  sc.hidden_dropout = c.hidden_dropout;
  sc.attention_dropout = c.attention_dropout;
  sc.init_std = c.init_method_std;
  sc.eps = c.layernorm_epsilon;
  sc.causal = causal;
  return sc;
}

void check_model_group(const ModelConfig& c, const comm::Communicator& tp) {
  c.validate();
  check(c.tensor_model_parallel_size == tp.size(), "tensor_model_parallel_size (", c.tensor_model_parallel_size,
        ") differs from the tensor-parallel group size (", tp.size(), ")");
}

void add_position_embeddings(float* x, const float* table, int64_t n, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static) if (n * C > 65536)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < C; ++c) x[i * C + c] += table[(i % T) * C + c];
}

void position_embeddings_backward(float* dtable, const float* d, int64_t n, int64_t T, int64_t C) {
  const int64_t B = n / T;
#pragma omp parallel for schedule(static) if (T * C > 16384)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c) dtable[t * C + c] += d[(b * T + t) * C + c];
}

ops::DropoutKey dropout_key(const train::StepContext& ctx, double p, uint64_t stream) {
  ops::DropoutKey k;
  k.p = ctx.training ? p : 0.0;
  k.key = mix_key(mix_key(ctx.seed, static_cast<uint64_t>(ctx.iteration)), static_cast<uint64_t>(ctx.micro_batch));
  k.stream = stream;
  return k;
}

void dropout_or_copy(float* out, const float* in, int64_t n, const ops::DropoutKey& k) {
  if (k.p > 0)
    ops::dropout_forward(out, in, n, 0, k);
  else
    std::memcpy(out, in, sizeof(float) * static_cast<size_t>(n));
}

void dropout_or_copy_backward(float* din, const float* dout, int64_t n, const ops::DropoutKey& k) {
  if (k.p > 0)
    ops::dropout_backward(din, dout, n, 0, k);
  else
    ops::residual_backward<float>(din, nullptr, dout, n);
}

TransformerStack::TransformerStack(nn::ParameterStore& store, comm::Communicator& tp, const StackConfig& c)
    : cfg_(c), tp_(&tp), heads_local_(c.heads / tp.size()) {
  check(!c.cross_attention || !c.post_layernorm, "transformer stack: cross-attention blocks are pre-LN only");
  const int64_t C = c.hidden;
  const double out_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.layers));
  const bool x = c.cross_attention;
  blocks_.reserve(static_cast<size_t>(c.layers));
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = c.prefix + std::to_string(l) + ".";
    // braced initialization runs in order: parameters are declared in member order
    blocks_.push_back(Block{
        nn::LayerNorm(store, p + "input_layernorm", C, l, c.eps),
        x ? std::make_optional<nn::LayerNorm>(store, p + "pre_cross_attn_layernorm", C, l, c.eps) : std::nullopt,
        nn::LayerNorm(store, p + "pre_mlp_layernorm", C, l, c.eps),
        nn::ColumnParallelLinear(store, tp, p + "self_attention.linear_qkv", C, 3 * C, l, c.init_std),
        x ? std::make_optional<nn::ColumnParallelLinear>(store, tp, p + "cross_attention.linear_q", C, C, l, c.init_std)
          : std::nullopt,
        x ? std::make_optional<nn::ColumnParallelLinear>(store, tp, p + "cross_attention.linear_kv", C, 2 * C, l,
                                                         c.init_std)
          : std::nullopt,
        nn::ColumnParallelLinear(store, tp, p + "mlp.linear_fc1", C, c.ffn, l, c.init_std),
        nn::RowParallelLinear(store, tp, p + "self_attention.linear_proj", C, C, l, out_std),
        x ? std::make_optional<nn::RowParallelLinear>(store, tp, p + "cross_attention.linear_proj", C, C, l, out_std)
          : std::nullopt,
        nn::RowParallelLinear(store, tp, p + "mlp.linear_fc2", c.ffn, C, l, out_std)});
  }
}

void TransformerStack::allocate(int64_t B, int64_t T, int64_t Tm) {
  if (B == B_ && T == T_ && Tm == Tm_) return;
  B_ = B;
  T_ = T;
  Tm_ = Tm;
  const int64_t n = B * T, C = cfg_.hidden, Cl = C / tp_->size(), Fl = cfg_.ffn / tp_->size();
  saved_.resize(blocks_.size());
  for (auto& s : saved_) {
    for (Tensor* t : {&s.x_in, &s.ln1, &s.proj, &s.x_mid, &s.ln2, &s.fc2}) t->resize({n, C});
    if (cfg_.post_layernorm)
      for (Tensor* t : {&s.r1, &s.r2}) t->resize({n, C});
    for (Tensor* t : {&s.ln1_mean, &s.ln1_rstd, &s.ln2_mean, &s.ln2_rstd}) t->resize({n});
    s.qkv.resize({n, 3 * Cl});
    s.probs.resize({B, heads_local_, T, T});
    s.attn.resize({n, Cl});
    s.fc1.resize({n, Fl});
    s.gelu.resize({n, Fl});
    if (cfg_.cross_attention) {
      for (Tensor* t : {&s.lnx, &s.xproj, &s.x2}) t->resize({n, C});
      for (Tensor* t : {&s.lnx_mean, &s.lnx_rstd}) t->resize({n});
      for (Tensor* t : {&s.q, &s.xattn}) t->resize({n, Cl});
      s.kv.resize({B * Tm, 2 * Cl});
      s.xprobs.resize({B, heads_local_, T, Tm});
    }
  }
  for (Tensor* t : {&g_a_, &g_b_, &g_c_, &out_copy_}) t->resize({n, C});
  g_qkv_.resize({n, 3 * Cl});
  g_attn_.resize({n, Cl});
  g_ff_a_.resize({n, Fl});
  g_ff_b_.resize({n, Fl});
  if (cfg_.cross_attention) {
    g_q_.resize({n, Cl});
    g_kv_.resize({B * Tm, 2 * Cl});
  }
}

void TransformerStack::forward(float* out, const float* x, int64_t B, int64_t T, const uint8_t* key_mask,
                               const train::StepContext& ctx, const float* attn_bias, const StackMemory& memory) {
  check(cfg_.cross_attention == (memory.values != nullptr), "transformer stack: a cross-attention stack needs a memory ",
        "and only it takes one");
  allocate(B, T, memory.T);
  ctx_ = ctx;
  mask_ = key_mask;
  bias_ = attn_bias;
  memory_ = memory;
  const int64_t n = B * T, C = cfg_.hidden, Fl = cfg_.ffn / tp_->size();
  const ops::AttentionShape as{B, T, heads_local_, C / cfg_.heads, cfg_.causal, heads_local_ * tp_->rank(), cfg_.heads};
  std::memcpy(saved_[0].x_in.data(), x, sizeof(float) * static_cast<size_t>(n * C));
  for (size_t l = 0; l < blocks_.size(); ++l) {
    Block& b = blocks_[l];
    Saved& s = saved_[l];
    const int li = static_cast<int>(l);
    float* next = l + 1 < blocks_.size() ? saved_[l + 1].x_in.data() : out;
    const ops::DropoutKey attn_drop = dropout_key(ctx, cfg_.attention_dropout, stream(li, kAttn));
    if (!cfg_.post_layernorm) {
      b.ln1.forward(s.ln1.data(), s.ln1_mean.data(), s.ln1_rstd.data(), s.x_in.data(), n);
      b.qkv.forward(s.qkv.data(), s.ln1.data(), n);
    } else {
      b.qkv.forward(s.qkv.data(), s.x_in.data(), n);
    }
    ops::attention_forward(s.attn.data(), s.probs.data(), s.qkv.data(), mask_, as, &attn_drop, bias_);
    b.proj.forward(s.proj.data(), s.attn.data(), n);
    dropout_or_copy(g_c_.data(), s.proj.data(), n * C, dropout_key(ctx, cfg_.hidden_dropout, stream(li, kProj)));
    if (!cfg_.post_layernorm) {
      ops::residual_forward(s.x_mid.data(), s.x_in.data(), g_c_.data(), n * C);
      const float* mlp_in = s.x_mid.data();
      if (cfg_.cross_attention) {
        const ops::CrossAttentionShape cs{B, T, memory.T, heads_local_, C / cfg_.heads, heads_local_ * tp_->rank(),
                                          cfg_.heads};
        const ops::DropoutKey xdrop = dropout_key(ctx, cfg_.attention_dropout, stream(li, kCrossAttn));
        b.lnx->forward(s.lnx.data(), s.lnx_mean.data(), s.lnx_rstd.data(), s.x_mid.data(), n);
        b.q->forward(s.q.data(), s.lnx.data(), n);
        b.kv->forward(s.kv.data(), memory.values, B * memory.T);
        ops::cross_attention_forward(s.xattn.data(), s.xprobs.data(), s.q.data(), s.kv.data(), memory.mask, cs, &xdrop);
        b.xproj->forward(s.xproj.data(), s.xattn.data(), n);
        dropout_or_copy(g_c_.data(), s.xproj.data(), n * C,
                        dropout_key(ctx, cfg_.hidden_dropout, stream(li, kCrossProj)));
        ops::residual_forward(s.x2.data(), s.x_mid.data(), g_c_.data(), n * C);
        mlp_in = s.x2.data();
      }
      b.ln2.forward(s.ln2.data(), s.ln2_mean.data(), s.ln2_rstd.data(), mlp_in, n);
      b.fc1.forward(s.fc1.data(), s.ln2.data(), n);
    } else {
      ops::residual_forward(s.r1.data(), s.x_in.data(), g_c_.data(), n * C);
      b.ln1.forward(s.x_mid.data(), s.ln1_mean.data(), s.ln1_rstd.data(), s.r1.data(), n);
      b.fc1.forward(s.fc1.data(), s.x_mid.data(), n);
    }
    ops::gelu_forward(s.gelu.data(), s.fc1.data(), n * Fl);
    b.fc2.forward(s.fc2.data(), s.gelu.data(), n);
    dropout_or_copy(g_c_.data(), s.fc2.data(), n * C, dropout_key(ctx, cfg_.hidden_dropout, stream(li, mlp_site())));
    if (!cfg_.post_layernorm) {
      ops::residual_forward(next, cfg_.cross_attention ? s.x2.data() : s.x_mid.data(), g_c_.data(), n * C);
    } else {
      ops::residual_forward(s.r2.data(), s.x_mid.data(), g_c_.data(), n * C);
      b.ln2.forward(next, s.ln2_mean.data(), s.ln2_rstd.data(), s.r2.data(), n);
    }
  }
}

void TransformerStack::backward(float* dx, const float* dout, float* dattn_bias, float* dmemory) {
  check(!cfg_.cross_attention || dmemory, "transformer stack: backward of a cross-attention stack needs dmemory");
  const int64_t n = B_ * T_, C = cfg_.hidden, Fl = cfg_.ffn / tp_->size();
  const size_t bytes = sizeof(float) * static_cast<size_t>(n * C);
  const ops::AttentionShape as{B_, T_, heads_local_, C / cfg_.heads, cfg_.causal, heads_local_ * tp_->rank(), cfg_.heads};
  Tensor* dres = &g_a_;  // gradient of the current block's output
  Tensor* dnext = &g_b_;
  std::memcpy(dres->data(), dout, bytes);
  for (size_t l = blocks_.size(); l-- > 0;) {
    Block& b = blocks_[l];
    Saved& s = saved_[l];
    const int li = static_cast<int>(l);
    const ops::DropoutKey attn_drop = dropout_key(ctx_, cfg_.attention_dropout, stream(li, kAttn));
    const float* mlp_in = cfg_.cross_attention ? s.x2.data() : s.x_mid.data();
    // --- MLP half: out = x_mid + drop(fc2(gelu(fc1(h)))) [pre-LN: h = ln2(x_mid); post-LN: out = ln2(r2), h = x_mid]
    float* d_sum = dres->data();  // gradient of the residual sum
    if (cfg_.post_layernorm) {
      out_copy_.zero();
      b.ln2.backward(out_copy_.data(), dres->data(), s.r2.data(), s.ln2_mean.data(), s.ln2_rstd.data(), n);
      d_sum = out_copy_.data();
    }
    std::memcpy(dnext->data(), d_sum, bytes);  // d of the MLP's input through the residual path
    g_c_.zero();
    dropout_or_copy_backward(g_c_.data(), d_sum, n * C, dropout_key(ctx_, cfg_.hidden_dropout, stream(li, mlp_site())));
    g_ff_a_.zero();
    b.fc2.backward(g_ff_a_.data(), g_c_.data(), s.gelu.data(), n);
    g_ff_b_.zero();
    ops::gelu_backward(g_ff_b_.data(), g_ff_a_.data(), s.fc1.data(), n * Fl);
    if (!cfg_.post_layernorm) {
      g_c_.zero();
      b.fc1.backward(g_c_.data(), g_ff_b_.data(), s.ln2.data(), n);
      b.ln2.backward(dnext->data(), g_c_.data(), mlp_in, s.ln2_mean.data(), s.ln2_rstd.data(), n);
    } else {
      b.fc1.backward(dnext->data(), g_ff_b_.data(), s.x_mid.data(), n);
    }
    std::swap(dres, dnext);
    if (cfg_.cross_attention) {  // x2 = x_mid + drop(xproj(cross(q(lnx(x_mid)), kv(memory))))
      const ops::CrossAttentionShape cs{B_, T_, Tm_, heads_local_, C / cfg_.heads, heads_local_ * tp_->rank(), cfg_.heads};
      std::memcpy(dnext->data(), dres->data(), bytes);  // d x_mid through the residual path
      g_c_.zero();
      dropout_or_copy_backward(g_c_.data(), dres->data(), n * C,
                               dropout_key(ctx_, cfg_.hidden_dropout, stream(li, kCrossProj)));
      g_attn_.zero();
      b.xproj->backward(g_attn_.data(), g_c_.data(), s.xattn.data(), n);
      g_q_.zero();
      g_kv_.zero();
      const ops::DropoutKey xdrop = dropout_key(ctx_, cfg_.attention_dropout, stream(li, kCrossAttn));
      ops::cross_attention_backward(g_q_.data(), g_kv_.data(), g_attn_.data(), s.q.data(), s.kv.data(), s.xprobs.data(),
                                    memory_.mask, cs, &xdrop);
      b.kv->backward(dmemory, g_kv_.data(), memory_.values, B_ * Tm_);
      g_c_.zero();
      b.q->backward(g_c_.data(), g_q_.data(), s.lnx.data(), n);
      b.lnx->backward(dnext->data(), g_c_.data(), s.x_mid.data(), s.lnx_mean.data(), s.lnx_rstd.data(), n);
      std::swap(dres, dnext);
    }
    // --- attention half: x_mid = x_in + drop(proj(attn(qkv(h)))) [pre-LN: h = ln1(x_in); post-LN: x_mid = ln1(r1), h = x_in]
    d_sum = dres->data();
    if (cfg_.post_layernorm) {
      out_copy_.zero();
      b.ln1.backward(out_copy_.data(), dres->data(), s.r1.data(), s.ln1_mean.data(), s.ln1_rstd.data(), n);
      d_sum = out_copy_.data();
    }
    std::memcpy(dnext->data(), d_sum, bytes);  // d x_in through the residual path
    g_c_.zero();
    dropout_or_copy_backward(g_c_.data(), d_sum, n * C, dropout_key(ctx_, cfg_.hidden_dropout, stream(li, kProj)));
    g_attn_.zero();
    b.proj.backward(g_attn_.data(), g_c_.data(), s.attn.data(), n);
    g_qkv_.zero();
    ops::attention_backward(g_qkv_.data(), g_attn_.data(), s.qkv.data(), s.probs.data(), mask_, as, &attn_drop,
                            bias_ ? dattn_bias : nullptr);
    if (!cfg_.post_layernorm) {
      g_c_.zero();
      b.qkv.backward(g_c_.data(), g_qkv_.data(), s.ln1.data(), n);
      b.ln1.backward(dnext->data(), g_c_.data(), s.x_in.data(), s.ln1_mean.data(), s.ln1_rstd.data(), n);
    } else {
      b.qkv.backward(dnext->data(), g_qkv_.data(), s.x_in.data(), n);
    }
    std::swap(dres, dnext);
  }
  std::memcpy(dx, dres->data(), bytes);
}

}  // namespace megabatch::models
