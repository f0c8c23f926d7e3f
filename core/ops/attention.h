// Scaled dot-product softmax attention.
//
// Self-attention over a fused QKV activation: qkv is (B, T, H, 3, D), for each token and
// head q, k and v of head size D side by side (Megatron's interleaved layout, so splitting
// the QKV projection by columns gives each tensor-parallel rank whole heads). With grouped-
// query attention (Megatron's --group-query-attention), H query heads share G key/value
// heads: qkv is (B, T, G, H/G + 2, D), each group's H/G queries, then its key and its value
// (Megatron's layout, read in place: no copy of a key per head), and query head h reads group
// h / (H/G). Per-head attention is the case G = H. The key's and value's gradients are the
// sums over their group's heads, in head order. out is
// (B, T, H, D); probs (B, H, T, T) are the softmax probabilities saved for backward
// (before dropout), in the activation dtype, computed in f32.
// Masks: causal (key j > query i masked) and/or key padding (key_mask u8 (B, T), 0 = pad)
// and/or documents (i32 (B, T), the document of each token: key j is masked for query i when
// their documents differ; Megatron's --reset-attention-mask, with which a row of documents
// packed together attends within each document only). A document is a run of positions: the
// ids are nondecreasing along each row (refused otherwise where the host can read them; the
// flash kernels find a document's tiles by binary search).
// A query row whose keys are all masked gets probabilities 0, so its output is 0 and its
// gradient is 0. Dropout of the probabilities draws element (b, global head, i, j) of the
// full (B, total heads, T, T) tensor, so masks are the same under any tensor-parallel split.
#pragma once

#include <cstdint>

#include "core/ops/dropout.h"
#include "core/tensor/tensor.h"

namespace megabatch::ops {

struct AttentionShape {
  int64_t B = 0, T = 0, H = 0, D = 0;
  bool causal = true;
  int64_t head_offset = 0;  // global index of head 0 (tensor parallelism), for dropout
  int64_t total_heads = 0;  // heads over all ranks (0 = H)
  int64_t groups = 0;       // key/value heads (this rank's; 0 = H): divides H
};

// The key/value heads of a shape (G), the elements of one token's qkv ((H + 2G) D), and the
// query heads a key/value head serves (H / G).
inline int64_t kv_heads(const AttentionShape& s) { return s.groups ? s.groups : s.H; }
inline int64_t qkv_width(const AttentionShape& s) { return (s.H + 2 * kv_heads(s)) * s.D; }
inline int64_t heads_per_group(const AttentionShape& s) { return s.H / kv_heads(s); }
struct Accepts;  // (accepts.h)

namespace detail {
// Refuses groups that do not divide the heads, and groups beside a position bias (or its
// gradient), naming the op.
void check_groups(const char* op, const AttentionShape& s, const Tensor& bias);
// Refuses documents (when defined) of another dtype or size than i32 (B, T) and, where the host
// reads them, ids that decrease along a row, naming the op.
void check_documents(const char* op, const Accepts& row, const Tensor& documents, const AttentionShape& s, Device d);
}  // namespace detail

// dropout may be null (or p == 0). bias, when defined, is added to the scaled scores
// before the softmax: (H, T, T), the same for every batch row (T5's relative position
// bias). key_mask and documents may be undefined.
void attention_forward(const Tensor& out, const Tensor& probs, const Tensor& qkv, const Tensor& key_mask,
                       const AttentionShape& s, const DropoutKey* dropout, const Tensor& bias = {},
                       const Tensor& documents = {});

// dqkv += the gradient with respect to qkv; dbias (H, T, T), when defined, += the gradient
// with respect to the bias (summed over the batch in batch order). The masks are in probs
// (a masked entry's probability is 0, so is its gradient): no key mask or documents needed.
void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                        const Tensor& key_mask, const AttentionShape& s, const DropoutKey* dropout,
                        const Tensor& dbias = {});

// Cross-attention (T5's decoder attending to the encoder): queries q (B, Tq, H, D), keys
// and values kv (B, Tk, H, 2, D) (Megatron's interleaved linear_kv layout), key_mask
// (B, Tk) over the encoder positions, no causal mask. out (B, Tq, H, D); probs (B, H, Tq, Tk).
struct CrossAttentionShape {
  int64_t B = 0, Tq = 0, Tk = 0, H = 0, D = 0;
  int64_t head_offset = 0;
  int64_t total_heads = 0;
};

void cross_attention_forward(const Tensor& out, const Tensor& probs, const Tensor& q, const Tensor& kv,
                             const Tensor& key_mask, const CrossAttentionShape& s, const DropoutKey* dropout);
// dq += dL/dq, dkv += dL/dkv.
void cross_attention_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& q,
                              const Tensor& kv, const Tensor& probs, const Tensor& key_mask,
                              const CrossAttentionShape& s, const DropoutKey* dropout);

}  // namespace megabatch::ops
