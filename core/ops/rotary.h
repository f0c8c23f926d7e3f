// Rotary position embeddings (RoPE; Megatron's --position-embedding-type rope), applied in
// place to the queries and keys of the QKV projection's output. qkv holds n = B T rows of G
// groups of [H/G queries, a key, a value] x D (attention.h's layout; G = H: per-head
// [q, k, v]), row r at position r % T. In each query and key, the first rotary_dim channels
// (even) are taken in pairs (x1, x2): in halves, channels (i, i + d/2) (Megatron's rotate-half
// form), or interleaved, channels (2i, 2i + 1) (--rotary-interleaved), and pair i turns by the
// angle pos * base^(-2i / d): (x1 cos - x2 sin, x2 cos + x1 sin). pos is the position times
// position_scale (1 / Megatron's --rotary-seq-len-interpolation-factor). The angle is computed
// in fp32, as Megatron computes its frequencies; the other channels and v stay as they are.
#pragma once

#include <cstdint>

#include "core/tensor/tensor.h"

namespace megabatch::ops {

struct RotaryShape {
  int64_t T = 0;           // positions: row r is at r % T
  int64_t heads = 0;       // heads in a row (this rank's)
  int64_t head_dim = 0;    // D
  int64_t rotary_dim = 0;  // channels turned, even, <= D
  double base = 10000;     // Megatron's --rotary-base
  bool interleaved = false;     // pairs (2i, 2i + 1) instead of (i, i + d/2)
  double position_scale = 1.0;  // positions scaled by it (1 / the interpolation factor)
  int64_t groups = 0;           // key/value heads in a row (0 = heads): divides heads
};
inline int64_t kv_heads(const RotaryShape& s) { return s.groups ? s.groups : s.heads; }

// qkv turned in place (the forward).
void rope_forward(const Tensor& qkv, const RotaryShape& s);
// dqkv turned back in place: the gradient of the input qkv from that of the turned one (each
// rotation's transpose, by -angle).
void rope_backward(const Tensor& dqkv, const RotaryShape& s);

}  // namespace megabatch::ops
