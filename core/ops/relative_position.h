// T5's relative position bias: every (query i, key j) pair falls in a bucket of the
// distance j - i, and each bucket has a learned bias per head, added to the attention
// scores of every layer of a stack.
#pragma once

#include <cstdint>

#include "core/tensor/tensor.h"

namespace megabatch::ops {

// The bucket of key position j seen from query position i: exact buckets for small
// distances, logarithmically wider ones up to max_distance, the last bucket beyond.
// Bidirectional (encoder) buckets split the range by the sign of j - i; unidirectional
// (decoder) ones map every later key to bucket 0.
int relative_position_bucket(int64_t i, int64_t j, bool bidirectional, int num_buckets, int max_distance);

// out(H, T, T) = table[buckets[i, j], h]: table (num_buckets, H) in the activation dtype,
// buckets i32 (T, T).
void relative_bias_forward(const Tensor& out, const Tensor& table, const Tensor& buckets);
// dtable[buckets[i, j], h] += dout[h, i, j] (accumulator dtype). Deterministic: each
// (bucket, head) sums its positions in row-major order.
void relative_bias_backward(const Tensor& dtable, const Tensor& dout, const Tensor& buckets);

}  // namespace megabatch::ops
