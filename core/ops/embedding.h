// Embedding lookup over a (possibly vocabulary-sharded) table holding rows
// [row_begin, row_begin + rows) of the full table. Ids outside that range give zeros (the
// other shards supply them; VocabParallelEmbedding all-reduces). Also the learned position
// and token-type embeddings (ids = positions, or token types).
#pragma once

#include <cstdint>

#include "core/tensor/tensor.h"

namespace megabatch::ops {

// out(n, C) = table[ids[i] - row_begin], or 0 for ids outside the table; with accumulate,
// out += instead. ids: i32 (n) on the same device.
void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table, int64_t row_begin,
                       bool accumulate = false);

// dtable[ids[i] - row_begin] += dout[i] (accumulator dtype), for ids inside the table.
// Deterministic: every row of dtable has one writer, which adds its tokens in order.
void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids, int64_t row_begin);

}  // namespace megabatch::ops
