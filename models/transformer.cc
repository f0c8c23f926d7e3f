#include "models/transformer.h"

#include <cmath>

#include "core/ops/activation.h"
#include "core/ops/attention.h"
#include "core/ops/flash_attention.h"
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
  sc.norm = nn::parse_norm_kind(c.normalization, "normalization");
  sc.causal = causal;
  return sc;
}

void check_model_group(const ModelConfig& c, const comm::Communicator& tp) {
  c.validate();
  check(c.tensor_model_parallel_size == tp.size(), "tensor_model_parallel_size (", c.tensor_model_parallel_size,
        ") differs from the tensor-parallel group size (", tp.size(), ")");
}

void position_ids(Tensor& ids, int64_t B, int64_t T, Device device) {
  if (ids.defined() && ids.numel() == static_cast<size_t>(B * T) && ids.device() == device && ids.ndim() == 2 &&
      ids.dim(1) == T)
    return;
  std::vector<int32_t> pos(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i % T);
  upload(ids, pos, {B, T}, device);
}

ops::DropoutKey dropout_key(const train::StepContext& ctx, double p, uint64_t stream) {
  ops::DropoutKey k;
  k.p = ctx.training ? p : 0.0;
  k.key = mix_key(mix_key(ctx.seed, static_cast<uint64_t>(ctx.iteration)), static_cast<uint64_t>(ctx.micro_batch));
  k.stream = stream;
  return k;
}

void dropout_or_copy(const Tensor& out, const Tensor& in, const ops::DropoutKey& k) {
  if (k.p > 0)
    ops::dropout_forward(out, in, 0, k);
  else
    copy(out, in);
}

void dropout_or_copy_backward(const Tensor& din, const Tensor& dout, const ops::DropoutKey& k) {
  if (k.p > 0)
    ops::dropout_backward(din, dout, 0, k);
  else
    ops::residual_backward(din, Tensor(), dout);
}

void alloc(Tensor& t, std::vector<int64_t> shape, const nn::ParameterStore& store) {
  t.resize(std::move(shape), store.dtype(), store.device());
}
void alloc_acc(Tensor& t, std::vector<int64_t> shape, const nn::ParameterStore& store) {
  t.resize(std::move(shape), DType::kF32, store.device());
}

TransformerStack::TransformerStack(nn::ParameterStore& store, comm::Communicator& tp, const StackConfig& c)
    : cfg_(c), store_(&store), tp_(&tp), heads_local_(c.heads / tp.size()) {
  check(!c.cross_attention || !c.post_layernorm, "transformer stack: cross-attention blocks are pre-LN only");
  const int64_t C = c.hidden;
  const double out_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.layers));
  const bool x = c.cross_attention;
  blocks_.reserve(static_cast<size_t>(c.layers));
  for (int l = 0; l < c.layers; ++l) {
    first_param_.push_back(static_cast<int>(store.count()));
    const std::string p = c.prefix + std::to_string(l) + ".";
    // braced initialization runs in order: parameters are declared in member order
    blocks_.push_back(Block{
        nn::Norm(store, p + "input_layernorm", C, l, c.norm, c.eps),
        x ? std::make_optional<nn::Norm>(store, p + "pre_cross_attn_layernorm", C, l, c.norm, c.eps) : std::nullopt,
        nn::Norm(store, p + "pre_mlp_layernorm", C, l, c.norm, c.eps),
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
  first_param_.push_back(static_cast<int>(store.count()));
}

void TransformerStack::allocate(int64_t B, int64_t T, int64_t Tm, bool flash) {
  if (B == B_ && T == T_ && Tm == Tm_ && flash == flash_) return;
  flash_ = flash;
  B_ = B;
  T_ = T;
  Tm_ = Tm;
  const int64_t n = B * T, C = cfg_.hidden, Cl = C / tp_->size(), Fl = cfg_.ffn / tp_->size();
  const bool rms = cfg_.norm == nn::NormKind::kRMSNorm;
  const nn::ParameterStore& P = *store_;
  saved_.resize(blocks_.size());
  for (auto& s : saved_) {
    for (Tensor* t : {&s.x_in, &s.ln1, &s.proj, &s.x_mid, &s.ln2, &s.fc2}) alloc(*t, {n, C}, P);
    if (cfg_.post_layernorm)
      for (Tensor* t : {&s.r1, &s.r2}) alloc(*t, {n, C}, P);
    for (Tensor* t : {&s.ln1_rstd, &s.ln2_rstd}) alloc_acc(*t, {n}, P);
    if (!rms)
      for (Tensor* t : {&s.ln1_mean, &s.ln2_mean}) alloc_acc(*t, {n}, P);
    alloc(s.qkv, {n, 3 * Cl}, P);
    if (flash_) {
      alloc_acc(s.lse, {B, heads_local_, T}, P);
      s.probs = Tensor();
    } else {
      alloc(s.probs, {B, heads_local_, T, T}, P);
      s.lse = Tensor();
    }
    alloc(s.attn, {n, Cl}, P);
    alloc(s.fc1, {n, Fl}, P);
    alloc(s.gelu, {n, Fl}, P);
    if (cfg_.cross_attention) {
      for (Tensor* t : {&s.lnx, &s.xproj, &s.x2}) alloc(*t, {n, C}, P);
      alloc_acc(s.lnx_rstd, {n}, P);
      if (!rms) alloc_acc(s.lnx_mean, {n}, P);
      for (Tensor* t : {&s.q, &s.xattn}) alloc(*t, {n, Cl}, P);
      alloc(s.kv, {B * Tm, 2 * Cl}, P);
      alloc(s.xprobs, {B, heads_local_, T, Tm}, P);
    }
  }
  for (Tensor* t : {&g_a_, &g_b_, &g_c_, &out_copy_}) alloc(*t, {n, C}, P);
  alloc(g_qkv_, {n, 3 * Cl}, P);
  alloc(g_attn_, {n, Cl}, P);
  alloc(g_ff_a_, {n, Fl}, P);
  alloc(g_ff_b_, {n, Fl}, P);
  if (cfg_.cross_attention) {
    alloc(g_q_, {n, Cl}, P);
    alloc(g_kv_, {B * Tm, 2 * Cl}, P);
  }
}

bool flash_attention_runs(Device device, DType dtype, int64_t head_dim, bool position_bias) {
  return !position_bias && device.is_cuda() && ops::flash_attention_supported(device, dtype, head_dim);
}

ops::AttentionShape TransformerStack::attention_shape() const {
  return {B_, T_, heads_local_, cfg_.hidden / cfg_.heads, cfg_.causal, heads_local_ * tp_->rank(), cfg_.heads};
}

void TransformerStack::forward(const Tensor& out, const Tensor& x, int64_t B, int64_t T, const Tensor& key_mask,
                               const train::StepContext& ctx, const Tensor& attn_bias, const StackMemory& memory) {
  check(cfg_.cross_attention == memory.values.defined(), "transformer stack: a cross-attention stack needs a memory ",
        "and only it takes one");
  const bool flash = flash_attention_runs(store_->device(), store_->dtype(), cfg_.hidden / cfg_.heads, attn_bias.defined());
  allocate(B, T, memory.T, flash);
  ctx_ = ctx;
  mask_ = key_mask;
  bias_ = attn_bias;
  memory_ = memory;
  copy(saved_[0].x_in, x);
  for (size_t l = 0; l < blocks_.size(); ++l) block_forward(l, l + 1 < blocks_.size() ? saved_[l + 1].x_in : out);
}

void TransformerStack::block_forward(size_t l, const Tensor& next) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  self_attention_forward(l);
  if (!cfg_.post_layernorm) {
    ops::residual_forward(s.x_mid, s.x_in, g_c_);
    if (cfg_.cross_attention) cross_attention_forward(l);
    b.ln2.forward(s.ln2, s.ln2_mean, s.ln2_rstd, cfg_.cross_attention ? s.x2 : s.x_mid);
    b.fc1.forward(s.fc1, s.ln2);
  } else {
    ops::residual_forward(s.r1, s.x_in, g_c_);
    b.ln1.forward(s.x_mid, s.ln1_mean, s.ln1_rstd, s.r1);
    b.fc1.forward(s.fc1, s.x_mid);
  }
  mlp_forward(l, next);
}

void TransformerStack::self_attention_forward(size_t l) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  const int li = static_cast<int>(l);
  const ops::AttentionShape as = attention_shape();
  const ops::DropoutKey attn_drop = dropout_key(ctx_, cfg_.attention_dropout, stream(li, kAttn));
  if (!cfg_.post_layernorm) {
    b.ln1.forward(s.ln1, s.ln1_mean, s.ln1_rstd, s.x_in);
    b.qkv.forward(s.qkv, s.ln1);
  } else {
    b.qkv.forward(s.qkv, s.x_in);
  }
  if (flash_)
    ops::flash_attention_forward(s.attn, s.lse, s.qkv, mask_, as, &attn_drop);
  else
    ops::attention_forward(s.attn, s.probs, s.qkv, mask_, as, &attn_drop, bias_);
  b.proj.forward(s.proj, s.attn);
  dropout_or_copy(g_c_, s.proj, dropout_key(ctx_, cfg_.hidden_dropout, stream(li, kProj)));
}

void TransformerStack::cross_attention_forward(size_t l) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  const int li = static_cast<int>(l);
  const int64_t C = cfg_.hidden;
  const ops::CrossAttentionShape cs{B_, T_, memory_.T, heads_local_, C / cfg_.heads, heads_local_ * tp_->rank(),
                                    cfg_.heads};
  const ops::DropoutKey xdrop = dropout_key(ctx_, cfg_.attention_dropout, stream(li, kCrossAttn));
  b.lnx->forward(s.lnx, s.lnx_mean, s.lnx_rstd, s.x_mid);
  b.q->forward(s.q, s.lnx);
  b.kv->forward(s.kv, memory_.values);
  ops::cross_attention_forward(s.xattn, s.xprobs, s.q, s.kv, memory_.mask, cs, &xdrop);
  b.xproj->forward(s.xproj, s.xattn);
  dropout_or_copy(g_c_, s.xproj, dropout_key(ctx_, cfg_.hidden_dropout, stream(li, kCrossProj)));
  ops::residual_forward(s.x2, s.x_mid, g_c_);
}

void TransformerStack::mlp_forward(size_t l, const Tensor& next) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  ops::gelu_forward(s.gelu, s.fc1);
  b.fc2.forward(s.fc2, s.gelu);
  dropout_or_copy(g_c_, s.fc2, dropout_key(ctx_, cfg_.hidden_dropout, stream(static_cast<int>(l), mlp_site())));
  if (!cfg_.post_layernorm) {
    ops::residual_forward(next, cfg_.cross_attention ? s.x2 : s.x_mid, g_c_);
  } else {
    ops::residual_forward(s.r2, s.x_mid, g_c_);
    b.ln2.forward(next, s.ln2_mean, s.ln2_rstd, s.r2);
  }
}

void TransformerStack::backward(const Tensor& dx, const Tensor& dout, const Tensor& dattn_bias, const Tensor& dmemory) {
  check(!cfg_.cross_attention || dmemory.defined(), "transformer stack: backward of a cross-attention stack needs dmemory");
  Tensor* dres = &g_a_;  // gradient of the current block's output
  Tensor* dnext = &g_b_;
  copy(*dres, dout);
  for (size_t l = blocks_.size(); l-- > 0;) {
    mlp_backward(l, dres, dnext);
    if (cfg_.cross_attention) cross_attention_backward(l, dmemory, dres, dnext);
    self_attention_backward(l, dattn_bias, dres, dnext);
    store_->grads_final(first_param_[l], first_param_[l + 1]);  // this block is done: its buckets may go
  }
  copy(dx, *dres);
}

// out = x_mid + drop(fc2(gelu(fc1(h)))) [pre-LN: h = ln2(x_mid); post-LN: out = ln2(r2), h = x_mid]
void TransformerStack::mlp_backward(size_t l, Tensor*& dres, Tensor*& dnext) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  const Tensor& mlp_in = cfg_.cross_attention ? s.x2 : s.x_mid;
  const Tensor* d_sum = dres;  // gradient of the residual sum
  if (cfg_.post_layernorm) {
    out_copy_.zero();
    b.ln2.backward(out_copy_, *dres, s.r2, s.ln2_mean, s.ln2_rstd);
    d_sum = &out_copy_;
  }
  copy(*dnext, *d_sum);  // d of the MLP's input through the residual path
  g_c_.zero();
  dropout_or_copy_backward(g_c_, *d_sum, dropout_key(ctx_, cfg_.hidden_dropout, stream(static_cast<int>(l), mlp_site())));
  g_ff_a_.zero();
  b.fc2.backward(g_ff_a_, g_c_, s.gelu);
  g_ff_b_.zero();
  ops::gelu_backward(g_ff_b_, g_ff_a_, s.fc1);
  if (!cfg_.post_layernorm) {
    g_c_.zero();
    b.fc1.backward(g_c_, g_ff_b_, s.ln2);
    b.ln2.backward(*dnext, g_c_, mlp_in, s.ln2_mean, s.ln2_rstd);
  } else {
    b.fc1.backward(*dnext, g_ff_b_, s.x_mid);
  }
  std::swap(dres, dnext);
}

// x2 = x_mid + drop(xproj(cross(q(lnx(x_mid)), kv(memory))))
void TransformerStack::cross_attention_backward(size_t l, const Tensor& dmemory, Tensor*& dres, Tensor*& dnext) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  const int li = static_cast<int>(l);
  const int64_t C = cfg_.hidden;
  const ops::CrossAttentionShape cs{B_, T_, Tm_, heads_local_, C / cfg_.heads, heads_local_ * tp_->rank(), cfg_.heads};
  copy(*dnext, *dres);  // d x_mid through the residual path
  g_c_.zero();
  dropout_or_copy_backward(g_c_, *dres, dropout_key(ctx_, cfg_.hidden_dropout, stream(li, kCrossProj)));
  g_attn_.zero();
  b.xproj->backward(g_attn_, g_c_, s.xattn);
  g_q_.zero();
  g_kv_.zero();
  const ops::DropoutKey xdrop = dropout_key(ctx_, cfg_.attention_dropout, stream(li, kCrossAttn));
  ops::cross_attention_backward(g_q_, g_kv_, g_attn_, s.q, s.kv, s.xprobs, memory_.mask, cs, &xdrop);
  b.kv->backward(dmemory, g_kv_, memory_.values);
  g_c_.zero();
  b.q->backward(g_c_, g_q_, s.lnx);
  b.lnx->backward(*dnext, g_c_, s.x_mid, s.lnx_mean, s.lnx_rstd);
  std::swap(dres, dnext);
}

// x_mid = x_in + drop(proj(attn(qkv(h)))) [pre-LN: h = ln1(x_in); post-LN: x_mid = ln1(r1), h = x_in]
void TransformerStack::self_attention_backward(size_t l, const Tensor& dattn_bias, Tensor*& dres, Tensor*& dnext) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  const int li = static_cast<int>(l);
  const ops::AttentionShape as = attention_shape();
  const ops::DropoutKey attn_drop = dropout_key(ctx_, cfg_.attention_dropout, stream(li, kAttn));
  const Tensor* d_sum = dres;
  if (cfg_.post_layernorm) {
    out_copy_.zero();
    b.ln1.backward(out_copy_, *dres, s.r1, s.ln1_mean, s.ln1_rstd);
    d_sum = &out_copy_;
  }
  copy(*dnext, *d_sum);  // d x_in through the residual path
  g_c_.zero();
  dropout_or_copy_backward(g_c_, *d_sum, dropout_key(ctx_, cfg_.hidden_dropout, stream(li, kProj)));
  g_attn_.zero();
  b.proj.backward(g_attn_, g_c_, s.attn);
  g_qkv_.zero();
  if (flash_)
    ops::flash_attention_backward(g_qkv_, g_attn_, s.qkv, s.attn, s.lse, mask_, as, &attn_drop);
  else
    ops::attention_backward(g_qkv_, g_attn_, s.qkv, s.probs, mask_, as, &attn_drop, bias_.defined() ? dattn_bias : Tensor());
  if (!cfg_.post_layernorm) {
    g_c_.zero();
    b.qkv.backward(g_c_, g_qkv_, s.ln1);
    b.ln1.backward(*dnext, g_c_, s.x_in, s.ln1_mean, s.ln1_rstd);
  } else {
    b.qkv.backward(*dnext, g_qkv_, s.x_in);
  }
  std::swap(dres, dnext);
}

}  // namespace megabatch::models
