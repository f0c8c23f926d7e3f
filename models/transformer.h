// The transformer layer stack shared by GPT (causal), BERT (bidirectional with padding
// masks) and T5's encoder and decoder: self-attention with a fused per-head QKV projection
// (per group of heads with grouped-query attention, which the attention reads in place:
// attention.h), optionally cross-attention to a memory (T5's decoder attending to the encoder), and a
// GELU MLP, tensor-parallel through the nn layers, with dropout keyed by
// (seed, iteration, micro-batch, stream) so masks never depend on the thread count.
//
//   pre-LN  (Megatron):      x = x + drop(proj(attn(qkv(ln1(x)))))
//                            x = x + drop(xproj(cross(q(lnx(x)), kv(memory))))    (cross_attention only)
//                            x = x + drop(fc2(gelu(fc1(ln2(x)))))
//   residual_post_norm:      h = ln1(x); x = h + drop(proj(attn(qkv(h))))            (each sub-layer so: the
//                            residual is its norm's output, Megatron's --apply-residual-connection-post-layernorm)
//   post-LN (original BERT): x = ln1(x + drop(proj(attn(qkv(x)))));  x = ln2(x + drop(fc2(gelu(fc1(x)))))
// The final LayerNorm of a pre-LN model belongs to the model, not the stack.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/nn/layers.h"
#include "core/ops/attention.h"
#include "core/ops/dropout.h"
#include "core/ops/rotary.h"
#include "core/tensor/tensor.h"
#include "core/train/model.h"
#include "models/presets.h"

namespace megabatch::models {

struct StackConfig {
  std::string prefix;  // parameter names: prefix + "<layer>." + ..., e.g. "decoder.layers."
  int64_t layers = 0, hidden = 0, heads = 0, ffn = 0;
  int64_t query_groups = 0;  // key/value heads of the self-attention (grouped-query attention); 0: one a head
  double hidden_dropout = 0, attention_dropout = 0;
  double init_std = 0.02, eps = 1e-5;
  nn::NormKind norm = nn::NormKind::kLayerNorm;
  bool norm_1p = false;  // every norm's weight applied as 1 + w (--apply-layernorm-1p)
  bool causal = true;
  bool post_layernorm = false;
  bool residual_post_norm = false;  // pre-LN, the residual taken after the norm (Megatron's
                                    // --apply-residual-connection-post-layernorm)
  bool cross_attention = false;  // a cross-attention sub-layer per block (pre-LN only)
  std::string attention_backend = "auto";  // --attention-backend (flash_attention_chosen)
  bool bias_linear = true;  // biases on the linear layers (Megatron's add_bias_linear; --disable-bias-linear)
  bool qkv_bias = false;    // the query, key and value projections' biases kept without them (--add-qkv-bias)
  bool swiglu = false;      // fc1 gives 2 ffn: (gate, up) pairs, gated by ops::swiglu (--swiglu)
  bool squared_relu = false;  // the MLP's activation max(x, 0)^2 instead of GELU (--squared-relu)
  bool qk_norm = false;     // a norm (as `norm`) over each head's q and k, before the rotary turn (--qk-layernorm)
  int64_t rotary_dim = 0;   // rotary embeddings turn this many channels of each head's q and k (0: none)
  double rotary_base = 10000;
  bool rotary_interleaved = false;
  double rotary_position_scale = 1.0;
  // dropout streams: stream_base + sites * layer + site, with 3 sites per layer (attention
  // probabilities, attention output, MLP output) or 5 with cross-attention (its
  // probabilities and output after the self-attention's)
  uint64_t stream_base = 1;
};

// The stack of a model: its layers, sizes, dropout, init and eps from the model config.
// How the word, position and token-type embeddings are drawn: normal at
// embedding_init_method_std where it is given and differs from init_method_std (then even under
// --init-method-xavier-uniform, as Megatron), else as the other weights.
nn::Init embedding_init(const ModelConfig& c);

StackConfig stack_config(const ModelConfig& c, const std::string& prefix, int64_t layers, bool causal);
// Validates the config and checks that it was declared for this tensor-parallel group.
void check_model_group(const ModelConfig& c, const comm::Communicator& tp);

// Learned absolute positions: the position ids (B * T) = row % T of B sequences of length T,
// as an i32 tensor on `device` (reused while the lengths stay the same).
void position_ids(Tensor& ids, int64_t B, int64_t T, Device device);

// The dropout key of one site: keyed by the step context and a stream number.
ops::DropoutKey dropout_key(const train::StepContext& ctx, double p, uint64_t stream);
// out = dropout(in) (a copy when k.p is 0); and its backward, accumulating into din.
void dropout_or_copy(const Tensor& out, const Tensor& in, const ops::DropoutKey& k);
void dropout_or_copy_backward(const Tensor& din, const Tensor& dout, const ops::DropoutKey& k);
// dropout(x) written into `scratch` and returned, or x itself when k.p is 0 (no copy). The
// same map takes a dropout's output gradient to its input gradient.
const Tensor& dropout_or_same(const Tensor& scratch, const Tensor& x, const ops::DropoutKey& k);

// An activation of the model: resized to `shape` in the parameters' dtype and device (acc:
// in fp32, for statistics and losses).
void alloc(Tensor& t, std::vector<int64_t> shape, const nn::ParameterStore& store);
void alloc_acc(Tensor& t, std::vector<int64_t> shape, const nn::ParameterStore& store);

// Whether a stack's attention (self- and cross-, with or without T5's position bias) runs the
// flash kernels, by --attention-backend: "auto" on a GPU where they take the dtype and head size
// (f32 and sm_75's bf16 take the explicit attention), and never on the CPU; "flash" always, on
// the CPU the reference of the flash algorithm, and an Error where the GPU's kernels do not take
// the dtype or head size; "unfused" and "local" never. The memory estimate (models/registry.h)
// asks the same question.
bool flash_attention_chosen(const std::string& backend, Device device, DType dtype, int64_t head_dim);

// What a cross-attention stack attends to: values (B*T, C) with mask (B, T) u8, 1 = attend,
// may be undefined. Both must stay valid until backward.
struct StackMemory {
  Tensor values;
  int64_t T = 0;
  Tensor mask;
};

class TransformerStack {
 public:
  TransformerStack(nn::ParameterStore& store, comm::Communicator& tp, const StackConfig& config);
  // out (B*T, C) from x (B*T, C); key_mask (B, T) u8, 1 = attend, may be undefined.
  // attn_bias (local heads, T, T), when defined, is added to every layer's self-attention
  // scores (T5's relative position bias); documents (B, T) i32, when defined, keep the
  // self-attention within each document (ops/attention.h). Both must stay valid until backward.
  void forward(const Tensor& out, const Tensor& x, int64_t B, int64_t T, const Tensor& key_mask,
               const train::StepContext& ctx, const Tensor& attn_bias = {}, const StackMemory& memory = {},
               const Tensor& documents = {});
  // dx (B*T, C) is overwritten with the gradient of the input; dout is the gradient of out.
  // dattn_bias (local heads, T, T, fp32), when defined, accumulates the bias gradient of all
  // layers; dmemory (B*Tm, C), for a cross-attention stack, accumulates the memory's gradient.
  void backward(const Tensor& dx, const Tensor& dout, const Tensor& dattn_bias = {}, const Tensor& dmemory = {});
  const StackConfig& config() const { return cfg_; }

 private:
  // Members in the order the parameters are declared (the cross-attention ones only with
  // cross_attention).
  struct Block {
    nn::Norm ln1;
    std::optional<nn::Norm> lnx;
    nn::Norm ln2;
    nn::ColumnParallelLinear qkv;
    std::optional<nn::ColumnParallelLinear> q, kv;
    nn::ColumnParallelLinear fc1;
    nn::RowParallelLinear proj;
    std::optional<nn::RowParallelLinear> xproj;
    nn::RowParallelLinear fc2;
    std::optional<nn::Norm> q_norm, k_norm;  // over each head's D channels (qk_norm only)
  };
  struct Saved {  // activations of one block, (n, ...) with n = B * T
    Tensor x_in, ln1, ln1_mean, ln1_rstd, qkv, probs, lse, attn, proj, r1, x_mid, ln2, ln2_mean, ln2_rstd, fc1, gelu, fc2, r2;
    Tensor lnx, lnx_mean, lnx_rstd, q, kv, xprobs, xlse, xattn, xproj, x2;  // cross-attention
    // qk_norm: the q rows then the k rows (n (local heads + local groups), D), before the norms
    Tensor qk_in, qk_mean, qk_rstd;
  };
  enum Site { kAttn = 0, kProj = 1, kCrossAttn = 2, kCrossProj = 3 };
  void allocate(int64_t B, int64_t T, int64_t Tm, bool flash);
  // One block's forward: its output into `next`; and its parts.
  void block_forward(size_t l, const Tensor& next);
  // The branches, each its dropped-out projection (s.proj, s.xproj or g_c_); the cross
  // attention reads lnx (lnx(x_mid), which block_forward computes with x_mid).
  const Tensor& self_attention_forward(size_t l);
  const Tensor& cross_attention_forward(size_t l);
  // h: the MLP's input; the block's output into next (pre-LN, with the next block's ln1)
  void mlp_forward(size_t l, const Tensor& h, const Tensor& next);
  // One block's backward, from *dres (d of its output) to *dres (d of its input). Pre-LN, each
  // part adds its branch's gradient into *dres in place (the residual path's gradient is *dres
  // itself); post-LN, and where the residual is the norm's output (residual_post_norm), the
  // norm's input gradient goes into *dnext and the two swap (norm_backward_swap).
  // Temporaries the next op writes whole are set (ops::Write::kSet), never zero-filled.
  void mlp_backward(size_t l, Tensor*& dres, Tensor*& dnext);
  void cross_attention_backward(size_t l, const Tensor& dmemory, Tensor*& dres, Tensor*& dnext);
  void self_attention_backward(size_t l, const Tensor& dattn_bias, Tensor*& dres, Tensor*& dnext);
  static void norm_backward_swap(nn::Norm& norm, Tensor*& dres, Tensor*& dnext, const Tensor& in, const Tensor& mean,
                                 const Tensor& rstd);
  // qk_norm: the norms of the q and k rows of s.qkv in place; and their backward on g_qkv_ in
  // place, the norms' weight gradients summed over the tensor-parallel ranks' heads
  void qk_norm_forward(size_t l);
  void qk_norm_backward(size_t l);
  // the rows [from, to) of the queries (which 0) or the keys (1) in qk_rows_'s order
  std::pair<int64_t, int64_t> qk_part(int which) const {
    const int64_t queries = B_ * T_ * heads_local_;
    return which == 0 ? std::pair{int64_t{0}, queries} : std::pair{queries, queries + B_ * T_ * groups_local_};
  }
  ops::AttentionShape attention_shape() const;
  ops::RotaryShape rotary_shape() const;  // this rank's heads at the current T
  uint64_t stream(int layer, int site) const {
    return cfg_.stream_base + static_cast<uint64_t>(layer) * (cfg_.cross_attention ? 5 : 3) + static_cast<uint64_t>(site);
  }
  int mlp_site() const { return cfg_.cross_attention ? 4 : 2; }

  StackConfig cfg_;
  nn::ParameterStore* store_;
  comm::Communicator* tp_;
  std::vector<Block> blocks_;
  std::vector<int> first_param_;  // block l declared parameter ids [first_param_[l], first_param_[l + 1])
  int64_t heads_local_, groups_local_;  // this rank's query heads and key/value heads
  // self- and cross-attention through the flash kernels (ops/flash_attention.h): lse saved,
  // not probabilities
  bool flash_ = false;
  int64_t B_ = 0, T_ = 0, Tm_ = 0;
  Tensor mask_, bias_, documents_;
  StackMemory memory_;
  train::StepContext ctx_;
  std::vector<Saved> saved_;
  Tensor g_a_, g_b_, g_c_, g_qkv_, g_attn_, g_ff_b_, g_q_, g_kv_;
  Tensor g_act_;  // SwiGLU, squared ReLU: d of the activation (n, ffn / tp), before d of fc1's output in g_ff_b_
  // qk_norm: the rows of the queries then the keys (i32, n (local heads + local groups)) in the QKV
  // output seen as rows of D (n (local heads + 2 local groups), D); scratch of that many rows of
  // D: the norms' outputs, then their input's gradient
  Tensor qk_rows_, g_qk_, g_qk_in_;
  std::vector<Tensor> qk_grads_before_;  // under tensor parallelism: the norms' gradients before a micro-batch
};

}  // namespace megabatch::models
