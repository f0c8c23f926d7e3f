#include "models/transformer.h"

#include <cmath>

#include "core/comm/collectives.h"
#include "core/ops/activation.h"
#include "core/ops/attention.h"
#include "core/ops/flash_attention.h"
#include "core/ops/gather.h"
#include "core/ops/residual.h"
#include "core/ops/rotary.h"
#include "core/util/error.h"
#include "core/util/philox.h"

namespace megabatch::models {

nn::Init embedding_init(const ModelConfig& c) {
  const double own = c.embedding_init_method_std;
  return own > 0 && own != c.init_method_std ? nn::Init::normal_own(own) : nn::Init::normal(c.init_method_std);
}

StackConfig stack_config(const ModelConfig& c, const std::string& prefix, int64_t layers, bool causal) {
  StackConfig sc;
  sc.prefix = prefix;
  sc.layers = layers;
  sc.hidden = c.hidden_size;
  sc.heads = c.num_attention_heads;
  sc.query_groups = c.query_groups();
  sc.ffn = c.ffn();
  sc.hidden_dropout = c.hidden_dropout;
  sc.attention_dropout = c.attention_dropout;
  sc.init_std = c.init_method_std;
  sc.eps = c.layernorm_epsilon;
  sc.norm = nn::parse_norm_kind(c.normalization, "normalization");
  sc.norm_1p = c.apply_layernorm_1p;
  sc.residual_post_norm = c.residual_post_norm;
  sc.causal = causal;
  sc.attention_backend = c.attention_backend;
  sc.bias_linear = !c.disable_bias_linear;
  sc.qkv_bias = c.add_qkv_bias;
  sc.swiglu = c.swiglu;
  sc.squared_relu = c.squared_relu;
  sc.qk_norm = c.qk_layernorm;
  sc.rotary_dim = c.rope ? c.rotary_dim() : 0;
  sc.rotary_base = c.rotary_base;
  sc.rotary_interleaved = c.rotary_interleaved;
  sc.rotary_position_scale = 1.0 / static_cast<double>(c.rotary_interpolation);
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

const Tensor& dropout_or_same(const Tensor& scratch, const Tensor& x, const ops::DropoutKey& k) {
  if (k.p == 0) return x;
  ops::dropout_forward(scratch, x, 0, k);
  return scratch;
}

void alloc(Tensor& t, std::vector<int64_t> shape, const nn::ParameterStore& store) {
  t.resize(std::move(shape), store.dtype(), store.device());
}
void alloc_acc(Tensor& t, std::vector<int64_t> shape, const nn::ParameterStore& store) {
  t.resize(std::move(shape), DType::kF32, store.device());
}

TransformerStack::TransformerStack(nn::ParameterStore& store, comm::Communicator& tp, const StackConfig& c)
    : cfg_(c),
      store_(&store),
      tp_(&tp),
      heads_local_(c.heads / tp.size()),
      groups_local_((c.query_groups ? c.query_groups : c.heads) / tp.size()) {
  check(!c.cross_attention || !c.post_layernorm, "transformer stack: cross-attention blocks are pre-LN only");
  const int64_t groups = c.query_groups ? c.query_groups : c.heads;
  check(c.heads % groups == 0 && groups % tp.size() == 0 && (groups == c.heads || !c.cross_attention),
        "transformer stack: ", c.heads, " heads in ", groups, " key/value groups over ", tp.size(),
        " tensor-parallel ranks", c.cross_attention ? ", with cross-attention" : "",
        ": the groups must divide the heads, the ranks the groups, and cross-attention takes no groups");
  const int64_t C = c.hidden, qkv_width = C + 2 * groups * (C / c.heads);  // (heads + 2 groups) x head dim
  const double out_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.layers));
  const bool x = c.cross_attention;
  blocks_.reserve(static_cast<size_t>(c.layers));
  for (int l = 0; l < c.layers; ++l) {
    first_param_.push_back(static_cast<int>(store.count()));
    const std::string p = c.prefix + std::to_string(l) + ".";
    // braced initialization runs in order: parameters are declared in member order
    blocks_.push_back(
        Block{nn::Norm(store, p + "input_layernorm", C, l, c.norm, c.eps, c.norm_1p),
              x ? std::make_optional<nn::Norm>(store, p + "pre_cross_attn_layernorm", C, l, c.norm, c.eps, c.norm_1p)
                : std::nullopt,
              nn::Norm(store, p + "pre_mlp_layernorm", C, l, c.norm, c.eps, c.norm_1p),
              nn::ColumnParallelLinear(store, tp, p + "self_attention.linear_qkv", C, qkv_width, l, c.init_std,
                                       c.bias_linear || c.qkv_bias),
              x ? std::make_optional<nn::ColumnParallelLinear>(store, tp, p + "cross_attention.linear_q", C, C, l,
                                                               c.init_std, c.bias_linear || c.qkv_bias)
                : std::nullopt,
              x ? std::make_optional<nn::ColumnParallelLinear>(store, tp, p + "cross_attention.linear_kv", C, 2 * C, l,
                                                               c.init_std, c.bias_linear || c.qkv_bias)
                : std::nullopt,
              nn::ColumnParallelLinear(store, tp, p + "mlp.linear_fc1", C, (c.swiglu ? 2 : 1) * c.ffn, l, c.init_std,
                                       c.bias_linear),
              nn::RowParallelLinear(store, tp, p + "self_attention.linear_proj", C, C, l, out_std, c.bias_linear),
              x ? std::make_optional<nn::RowParallelLinear>(store, tp, p + "cross_attention.linear_proj", C, C, l,
                                                            out_std, c.bias_linear)
                : std::nullopt,
              nn::RowParallelLinear(store, tp, p + "mlp.linear_fc2", c.ffn, C, l, out_std, c.bias_linear),
              c.qk_norm ? std::make_optional<nn::Norm>(store, p + "self_attention.q_layernorm", C / c.heads, l, c.norm,
                                                       c.eps, c.norm_1p)
                        : std::nullopt,
              c.qk_norm ? std::make_optional<nn::Norm>(store, p + "self_attention.k_layernorm", C / c.heads, l, c.norm,
                                                       c.eps, c.norm_1p)
                        : std::nullopt});
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
  // the self-attention's qkv: G groups of [H/G queries, a key, a value] x D a token (this rank's)
  const int64_t D = C / cfg_.heads, per = heads_local_ / groups_local_,
                qkv_local = (heads_local_ + 2 * groups_local_) * D;
  const int64_t qk_rows = n * (heads_local_ + groups_local_);  // qk_norm: every query and key
  saved_.resize(blocks_.size());
  for (auto& s : saved_) {
    for (Tensor* t : {&s.x_in, &s.ln1, &s.proj, &s.x_mid, &s.ln2, &s.fc2}) alloc(*t, {n, C}, P);
    if (cfg_.post_layernorm)
      for (Tensor* t : {&s.r1, &s.r2}) alloc(*t, {n, C}, P);
    for (Tensor* t : {&s.ln1_rstd, &s.ln2_rstd}) alloc_acc(*t, {n}, P);
    if (!rms)
      for (Tensor* t : {&s.ln1_mean, &s.ln2_mean}) alloc_acc(*t, {n}, P);
    alloc(s.qkv, {n, qkv_local}, P);
    if (cfg_.qk_norm) {
      alloc(s.qk_in, {qk_rows, D}, P);
      alloc_acc(s.qk_rstd, {qk_rows}, P);
      if (!rms) alloc_acc(s.qk_mean, {qk_rows}, P);
    }
    if (flash_) {
      alloc_acc(s.lse, {B, heads_local_, T}, P);
      s.probs = Tensor();
    } else {
      alloc(s.probs, {B, heads_local_, T, T}, P);
      s.lse = Tensor();
    }
    alloc(s.attn, {n, Cl}, P);
    alloc(s.fc1, {n, (cfg_.swiglu ? 2 : 1) * Fl}, P);
    alloc(s.gelu, {n, Fl}, P);
    if (cfg_.cross_attention) {
      for (Tensor* t : {&s.lnx, &s.xproj, &s.x2}) alloc(*t, {n, C}, P);
      alloc_acc(s.lnx_rstd, {n}, P);
      if (!rms) alloc_acc(s.lnx_mean, {n}, P);
      for (Tensor* t : {&s.q, &s.xattn}) alloc(*t, {n, Cl}, P);
      alloc(s.kv, {B * Tm, 2 * Cl}, P);
      if (flash_) {
        alloc_acc(s.xlse, {B, heads_local_, T}, P);
        s.xprobs = Tensor();
      } else {
        alloc(s.xprobs, {B, heads_local_, T, Tm}, P);
        s.xlse = Tensor();
      }
    }
  }
  for (Tensor* t : {&g_a_, &g_b_, &g_c_}) alloc(*t, {n, C}, P);
  alloc(g_qkv_, {n, qkv_local}, P);
  if (cfg_.qk_norm) {
    for (Tensor* t : {&g_qk_, &g_qk_in_}) alloc(*t, {qk_rows, D}, P);
    // the queries in (token, head) order, then the keys in (token, group) order: rows of
    // (n G (H/G + 2), D), a group's queries at 0..H/G - 1 and its key at H/G
    std::vector<int32_t> rows;
    rows.reserve(static_cast<size_t>(qk_rows));
    for (int64_t i = 0; i < n * groups_local_; ++i)
      for (int64_t j = 0; j < per; ++j) rows.push_back(static_cast<int32_t>(i * (per + 2) + j));
    for (int64_t i = 0; i < n * groups_local_; ++i) rows.push_back(static_cast<int32_t>(i * (per + 2) + per));
    upload(qk_rows_, rows, {qk_rows}, P.device());
  }
  alloc(g_attn_, {n, Cl}, P);
  alloc(g_ff_b_, {n, (cfg_.swiglu ? 2 : 1) * Fl}, P);
  if (cfg_.swiglu || cfg_.squared_relu) alloc(g_act_, {n, Fl}, P);
  if (cfg_.cross_attention) {
    alloc(g_q_, {n, Cl}, P);
    alloc(g_kv_, {B * Tm, 2 * Cl}, P);
  }
}

bool flash_attention_chosen(const std::string& backend, Device device, DType dtype, int64_t head_dim) {
  if (backend == "unfused" || backend == "local") return false;
  const bool runs = ops::flash_attention_supported(device, dtype, head_dim);
  if (backend != "flash") return device.is_cuda() && runs;
  check(runs, "--attention-backend flash: ", device.str(),
        " runs the flash kernels in bf16 or fp16 at head size 64 or ", "128 (sm_75: fp16 at 64), not ",
        dtype_name(dtype), " at head size ", head_dim,
        "; use --attention-backend auto, which takes the explicit attention where flash cannot run");
  return true;
}

ops::RotaryShape TransformerStack::rotary_shape() const {
  return {T_,
          heads_local_,
          cfg_.hidden / cfg_.heads,
          cfg_.rotary_dim,
          cfg_.rotary_base,
          cfg_.rotary_interleaved,
          cfg_.rotary_position_scale,
          groups_local_};
}

ops::AttentionShape TransformerStack::attention_shape() const {
  return {B_,         T_,           heads_local_, cfg_.hidden / cfg_.heads, cfg_.causal, heads_local_ * tp_->rank(),
          cfg_.heads, groups_local_};
}

void TransformerStack::forward(const Tensor& out, const Tensor& x, int64_t B, int64_t T, const Tensor& key_mask,
                               const train::StepContext& ctx, const Tensor& attn_bias, const StackMemory& memory,
                               const Tensor& documents) {
  check(cfg_.cross_attention == memory.values.defined(), "transformer stack: a cross-attention stack needs a memory ",
        "and only it takes one");
  allocate(B, T, memory.T,
           flash_attention_chosen(cfg_.attention_backend, store_->device(), store_->dtype(), cfg_.hidden / cfg_.heads));
  ctx_ = ctx;
  mask_ = key_mask;
  bias_ = attn_bias;
  documents_ = documents;
  memory_ = memory;
  copy(saved_[0].x_in, x);
  for (size_t l = 0; l < blocks_.size(); ++l) block_forward(l, l + 1 < blocks_.size() ? saved_[l + 1].x_in : out);
}

void TransformerStack::block_forward(size_t l, const Tensor& next) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  const Tensor& attn_branch = self_attention_forward(l);
  // each residual add runs fused with the norm that reads its sum; a sub-layer adds its
  // output to its input, or (residual_post_norm) to its norm's output
  if (!cfg_.post_layernorm) {
    const Tensor& residual = cfg_.residual_post_norm ? s.ln1 : s.x_in;
    if (cfg_.cross_attention) {
      b.lnx->forward_residual(s.x_mid, s.lnx, s.lnx_mean, s.lnx_rstd, residual, attn_branch);
      const Tensor& cross_branch = cross_attention_forward(l);
      b.ln2.forward_residual(s.x2, s.ln2, s.ln2_mean, s.ln2_rstd, cfg_.residual_post_norm ? s.lnx : s.x_mid,
                             cross_branch);
    } else {
      b.ln2.forward_residual(s.x_mid, s.ln2, s.ln2_mean, s.ln2_rstd, residual, attn_branch);
    }
    mlp_forward(l, s.ln2, next);
  } else {
    b.ln1.forward_residual(s.r1, s.x_mid, s.ln1_mean, s.ln1_rstd, s.x_in, attn_branch);
    mlp_forward(l, s.x_mid, next);
  }
}

const Tensor& TransformerStack::self_attention_forward(size_t l) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  const int li = static_cast<int>(l);
  const ops::AttentionShape as = attention_shape();
  const ops::DropoutKey attn_drop = dropout_key(ctx_, cfg_.attention_dropout, stream(li, kAttn));
  // a later pre-LN block's ln1 ran with the block before's last residual add (mlp_forward)
  if (!cfg_.post_layernorm && l == 0) b.ln1.forward(s.ln1, s.ln1_mean, s.ln1_rstd, s.x_in);
  b.qkv.forward(s.qkv, cfg_.post_layernorm ? s.x_in : s.ln1);
  if (cfg_.qk_norm) qk_norm_forward(l);
  if (cfg_.rotary_dim) ops::rope_forward(s.qkv, rotary_shape());
  if (flash_)
    ops::flash_attention_forward(s.attn, s.lse, s.qkv, mask_, as, &attn_drop, bias_, documents_);
  else
    ops::attention_forward(s.attn, s.probs, s.qkv, mask_, as, &attn_drop, bias_, documents_);
  b.proj.forward(s.proj, s.attn);
  return dropout_or_same(g_c_, s.proj, dropout_key(ctx_, cfg_.hidden_dropout, stream(li, kProj)));
}

const Tensor& TransformerStack::cross_attention_forward(size_t l) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  const int li = static_cast<int>(l);
  const int64_t C = cfg_.hidden;
  const ops::CrossAttentionShape cs{B_, T_, memory_.T, heads_local_, C / cfg_.heads, heads_local_ * tp_->rank(),
                                    cfg_.heads};
  const ops::DropoutKey xdrop = dropout_key(ctx_, cfg_.attention_dropout, stream(li, kCrossAttn));
  b.q->forward(s.q, s.lnx);
  b.kv->forward(s.kv, memory_.values);
  if (flash_)
    ops::flash_cross_attention_forward(s.xattn, s.xlse, s.q, s.kv, memory_.mask, cs, &xdrop);
  else
    ops::cross_attention_forward(s.xattn, s.xprobs, s.q, s.kv, memory_.mask, cs, &xdrop);
  b.xproj->forward(s.xproj, s.xattn);
  return dropout_or_same(g_c_, s.xproj, dropout_key(ctx_, cfg_.hidden_dropout, stream(li, kCrossProj)));
}

void TransformerStack::mlp_forward(size_t l, const Tensor& h, const Tensor& next) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  if (cfg_.swiglu) {
    b.fc1.forward(s.fc1, h);
    ops::swiglu_forward(s.gelu, s.fc1);
  } else if (cfg_.squared_relu) {
    b.fc1.forward(s.fc1, h);
    ops::squared_relu_forward(s.gelu, s.fc1);
  } else {
    b.fc1.forward_gelu(s.gelu, s.fc1, h);
  }
  b.fc2.forward(s.fc2, s.gelu);
  const Tensor& branch =
      dropout_or_same(g_c_, s.fc2, dropout_key(ctx_, cfg_.hidden_dropout, stream(static_cast<int>(l), mlp_site())));
  if (cfg_.post_layernorm) {
    b.ln2.forward_residual(s.r2, next, s.ln2_mean, s.ln2_rstd, s.x_mid, branch);
    return;
  }
  const Tensor& residual = cfg_.residual_post_norm ? s.ln2 : cfg_.cross_attention ? s.x2 : s.x_mid;
  if (l + 1 < blocks_.size()) {  // next is block l + 1's input: its ln1 with the add
    Saved& after = saved_[l + 1];
    blocks_[l + 1].ln1.forward_residual(next, after.ln1, after.ln1_mean, after.ln1_rstd, residual, branch);
  } else {
    ops::residual_forward(next, residual, branch);
  }
}

// A norm's backward from *dres (d of its output) into *dnext (d of its input `in`), which then
// become *dres: the residual reaches the input through the norm alone.
void TransformerStack::norm_backward_swap(nn::Norm& norm, Tensor*& dres, Tensor*& dnext, const Tensor& in,
                                          const Tensor& mean, const Tensor& rstd) {
  dnext->zero();
  norm.backward(*dnext, *dres, in, mean, rstd);
  std::swap(dres, dnext);
}

void TransformerStack::backward(const Tensor& dx, const Tensor& dout, const Tensor& dattn_bias, const Tensor& dmemory) {
  check(!cfg_.cross_attention || dmemory.defined(), "transformer stack: backward of a cross-attention stack needs dmemory");
  Tensor* dres = &g_a_;  // gradient of the current block's output, then of its input
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

// out = x_mid + drop(fc2(gelu(fc1(h)))) [pre-LN: h = ln2(x_mid); post-LN: out = ln2(r2), h = x_mid;
// residual_post_norm: out = h + drop(...), h = ln2(x_mid)]
void TransformerStack::mlp_backward(size_t l, Tensor*& dres, Tensor*& dnext) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  const Tensor& mlp_in = cfg_.cross_attention ? s.x2 : s.x_mid;
  if (cfg_.post_layernorm)  // d of the residual sum r2, into the other buffer
    norm_backward_swap(b.ln2, dres, dnext, s.r2, s.ln2_mean, s.ln2_rstd);
  // *dres: d of the residual sum, which is d of the MLP's input through the residual path;
  // the branch's gradient is added to it once fc2's backward has read it
  const Tensor& d_fc2 =
      dropout_or_same(g_c_, *dres, dropout_key(ctx_, cfg_.hidden_dropout, stream(static_cast<int>(l), mlp_site())));
  if (cfg_.swiglu) {
    b.fc2.backward(g_act_, d_fc2, s.gelu, ops::Write::kSet);
    ops::swiglu_backward(g_ff_b_, g_act_, s.fc1);
  } else if (cfg_.squared_relu) {
    b.fc2.backward(g_act_, d_fc2, s.gelu, ops::Write::kSet);
    ops::squared_relu_backward(g_ff_b_, g_act_, s.fc1);
  } else {
    b.fc2.backward_gelu(g_ff_b_, d_fc2, s.gelu, s.fc1);
  }
  if (cfg_.residual_post_norm) {  // d h: the residual's and fc1's; then d x_mid through ln2 alone
    b.fc1.backward(*dres, g_ff_b_, s.ln2);
    norm_backward_swap(b.ln2, dres, dnext, mlp_in, s.ln2_mean, s.ln2_rstd);
  } else if (!cfg_.post_layernorm) {
    b.fc1.backward(g_c_, g_ff_b_, s.ln2, ops::Write::kSet);
    b.ln2.backward(*dres, g_c_, mlp_in, s.ln2_mean, s.ln2_rstd);
  } else {
    b.fc1.backward(*dres, g_ff_b_, s.x_mid);
  }
}

// x2 = x_mid + drop(xproj(cross(q(lnx(x_mid)), kv(memory)))) [residual_post_norm: x2 = lnx(x_mid) + ...];
// dres: d x2 in, d x_mid out
void TransformerStack::cross_attention_backward(size_t l, const Tensor& dmemory, Tensor*& dres, Tensor*& dnext) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  const int li = static_cast<int>(l);
  const int64_t C = cfg_.hidden;
  const ops::CrossAttentionShape cs{B_, T_, Tm_, heads_local_, C / cfg_.heads, heads_local_ * tp_->rank(), cfg_.heads};
  const Tensor& d_xproj = dropout_or_same(g_c_, *dres, dropout_key(ctx_, cfg_.hidden_dropout, stream(li, kCrossProj)));
  b.xproj->backward(g_attn_, d_xproj, s.xattn, ops::Write::kSet);
  const ops::DropoutKey xdrop = dropout_key(ctx_, cfg_.attention_dropout, stream(li, kCrossAttn));
  if (flash_) {
    ops::flash_cross_attention_backward(g_q_, g_kv_, g_attn_, s.q, s.kv, s.xattn, s.xlse, memory_.mask, cs, &xdrop,
                                        ops::Write::kSet);
  } else {
    g_q_.zero();  // the explicit cross attention accumulates
    g_kv_.zero();
    ops::cross_attention_backward(g_q_, g_kv_, g_attn_, s.q, s.kv, s.xprobs, memory_.mask, cs, &xdrop);
  }
  b.kv->backward(dmemory, g_kv_, memory_.values);
  if (cfg_.residual_post_norm) {
    b.q->backward(*dres, g_q_, s.lnx);
    norm_backward_swap(*b.lnx, dres, dnext, s.x_mid, s.lnx_mean, s.lnx_rstd);
  } else {
    b.q->backward(g_c_, g_q_, s.lnx, ops::Write::kSet);
    b.lnx->backward(*dres, g_c_, s.x_mid, s.lnx_mean, s.lnx_rstd);
  }
}

// x_mid = x_in + drop(proj(attn(qkv(h)))) [pre-LN: h = ln1(x_in); post-LN: x_mid = ln1(r1), h = x_in;
// residual_post_norm: x_mid = h + drop(...), h = ln1(x_in)]
void TransformerStack::self_attention_backward(size_t l, const Tensor& dattn_bias, Tensor*& dres, Tensor*& dnext) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  const int li = static_cast<int>(l);
  const ops::AttentionShape as = attention_shape();
  const ops::DropoutKey attn_drop = dropout_key(ctx_, cfg_.attention_dropout, stream(li, kAttn));
  if (cfg_.post_layernorm)  // d of the residual sum r1, into the other buffer
    norm_backward_swap(b.ln1, dres, dnext, s.r1, s.ln1_mean, s.ln1_rstd);
  const Tensor& d_proj = dropout_or_same(g_c_, *dres, dropout_key(ctx_, cfg_.hidden_dropout, stream(li, kProj)));
  b.proj.backward(g_attn_, d_proj, s.attn, ops::Write::kSet);
  if (flash_) {
    ops::flash_attention_backward(g_qkv_, g_attn_, s.qkv, s.attn, s.lse, mask_, as, &attn_drop, ops::Write::kSet, bias_,
                                  bias_.defined() ? dattn_bias : Tensor(), documents_);
  } else {
    g_qkv_.zero();  // the explicit attention accumulates
    ops::attention_backward(g_qkv_, g_attn_, s.qkv, s.probs, mask_, as, &attn_drop, bias_.defined() ? dattn_bias : Tensor());
  }
  if (cfg_.rotary_dim) ops::rope_backward(g_qkv_, rotary_shape());  // d of the unturned queries and keys
  if (cfg_.qk_norm) qk_norm_backward(l);                            // d of the queries and keys before their norms
  if (cfg_.residual_post_norm) {
    b.qkv.backward(*dres, g_qkv_, s.ln1);
    norm_backward_swap(b.ln1, dres, dnext, s.x_in, s.ln1_mean, s.ln1_rstd);
  } else if (!cfg_.post_layernorm) {
    b.qkv.backward(g_c_, g_qkv_, s.ln1, ops::Write::kSet);
    b.ln1.backward(*dres, g_c_, s.x_in, s.ln1_mean, s.ln1_rstd);
  } else {
    b.qkv.backward(*dres, g_qkv_, s.x_in);
  }
}

void TransformerStack::qk_norm_forward(size_t l) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  const int64_t D = s.qk_in.dim(1);
  const Tensor rows = s.qkv.view({static_cast<int64_t>(s.qkv.numel()) / D, D});
  ops::gather_rows(s.qk_in, rows, qk_rows_);
  const bool rms = cfg_.norm == nn::NormKind::kRMSNorm;
  for (int which = 0; which < 2; ++which) {
    const nn::Norm& norm = which == 0 ? *b.q_norm : *b.k_norm;
    const auto [from, to] = qk_part(which);
    const auto at = static_cast<size_t>(from), count = static_cast<size_t>(to - from);
    norm.forward(g_qk_.rows(from, to), rms ? Tensor() : s.qk_mean.flat(at, count), s.qk_rstd.flat(at, count),
                 s.qk_in.rows(from, to));
  }
  ops::scatter_rows(rows, g_qk_, qk_rows_);
}

void TransformerStack::qk_norm_backward(size_t l) {
  Block& b = blocks_[l];
  Saved& s = saved_[l];
  const int64_t D = s.qk_in.dim(1);
  const Tensor rows = g_qkv_.view({static_cast<int64_t>(g_qkv_.numel()) / D, D});
  ops::gather_rows(g_qk_, rows, qk_rows_);  // d of the norms' outputs
  g_qk_in_.zero();                          // the norms' backward accumulates
  const bool rms = cfg_.norm == nn::NormKind::kRMSNorm;
  // Each rank's norm weights see its own heads only, so this micro-batch's part of their
  // gradients is summed over the tensor-parallel ranks: taken alone (the earlier micro-batches'
  // set aside), summed, then added back.
  std::vector<int> ids;
  for (const nn::Norm* norm : {&*b.q_norm, &*b.k_norm})
    for (int id = norm->first_param(); id < norm->end_param(); ++id) ids.push_back(id);
  const bool split = tp_->size() > 1;
  if (split) {
    qk_grads_before_.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      Tensor g = store_->grad(ids[i]);
      qk_grads_before_[i].resize(g.shape(), g.dtype(), g.device());
      copy(qk_grads_before_[i], g);
      g.zero();
    }
  }
  for (int which = 0; which < 2; ++which) {
    nn::Norm& norm = which == 0 ? *b.q_norm : *b.k_norm;
    const auto [from, to] = qk_part(which);
    const auto at = static_cast<size_t>(from), count = static_cast<size_t>(to - from);
    norm.backward(g_qk_in_.rows(from, to), g_qk_.rows(from, to), s.qk_in.rows(from, to),
                  rms ? Tensor() : s.qk_mean.flat(at, count), s.qk_rstd.flat(at, count));
  }
  ops::scatter_rows(rows, g_qk_in_, qk_rows_);
  if (split)
    for (size_t i = 0; i < ids.size(); ++i) {
      comm::all_reduce(*tp_, store_->grad(ids[i]), comm::ReduceOp::kSum);
      ops::residual_backward(store_->grad(ids[i]), Tensor(), qk_grads_before_[i]);
    }
}

}  // namespace megabatch::models
