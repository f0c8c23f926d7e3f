// Scaled dot-product softmax attention over a fused QKV activation.
//
// qkv is (B, T, H, 3, D): for each token and head, q, k and v of head size D side by side
// (Megatron's interleaved layout, so splitting the QKV projection by columns gives each
// tensor-parallel rank whole heads). out is (B, T, H, D); probs (B, H, T, T) are the
// softmax probabilities saved for backward (before dropout).
// Masks: causal (key j > query i masked) and/or key padding (key_mask (B, T), 0 = pad).
// A query row whose keys are all masked gets probabilities 0, so its output is 0 and its
// gradient is 0.
#pragma once

#include <cstdint>

#include "core/ops/dropout.h"

namespace megabatch::ops {

struct AttentionShape {
  int64_t B = 0, T = 0, H = 0, D = 0;
  bool causal = true;
  int64_t head_offset = 0;  // global index of head 0 (tensor parallelism), for dropout
  int64_t total_heads = 0;  // heads over all ranks (0 = H)
};

// dropout may be null (or p == 0): no attention dropout. bias, when given, is added to
// the scaled scores before the softmax: (H, T, T), the same for every batch row (T5's
// relative position bias).
template <typename T>
void attention_forward(T* out, T* probs, const T* qkv, const uint8_t* key_mask, const AttentionShape& s,
                       const DropoutKey* dropout, const T* bias = nullptr);

// dqkv += gradient of the loss with respect to qkv; dbias (H, T, T), when given, += the
// gradient with respect to the bias (summed over the batch).
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* probs, const uint8_t* key_mask,
                        const AttentionShape& s, const DropoutKey* dropout, T* dbias = nullptr);

// Cross-attention (T5's decoder attending to the encoder): queries q (B, Tq, H, D) from
// the decoder, keys and values kv (B, Tk, H, 2, D) from the encoder (Megatron's
// interleaved linear_kv layout), key_mask (B, Tk) over the encoder positions (0 = pad),
// no causal mask. out is (B, Tq, H, D); probs (B, H, Tq, Tk).
struct CrossAttentionShape {
  int64_t B = 0, Tq = 0, Tk = 0, H = 0, D = 0;
  int64_t head_offset = 0;
  int64_t total_heads = 0;
};

template <typename T>
void cross_attention_forward(T* out, T* probs, const T* q, const T* kv, const uint8_t* key_mask,
                             const CrossAttentionShape& s, const DropoutKey* dropout);

// dq += dL/dq, dkv += dL/dkv.
template <typename T>
void cross_attention_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* probs,
                              const uint8_t* key_mask, const CrossAttentionShape& s, const DropoutKey* dropout);

// T5's relative position bucket of key position j seen from query position i: exact
// buckets for small distances, logarithmically wider ones up to max_distance, the last
// bucket beyond. Bidirectional (encoder) buckets split the range by the sign of j - i;
// unidirectional (decoder) ones map every later key to bucket 0.
int relative_position_bucket(int64_t i, int64_t j, bool bidirectional, int num_buckets, int max_distance);

}  // namespace megabatch::ops
