// Embedding lookup over a (possibly vocabulary-sharded) table holding rows
// [row_begin, row_begin + rows) of the full table. Ids outside that range give zeros
// (the other shards supply them; VocabParallelEmbedding all-reduces).
#pragma once

#include <cstdint>

namespace megabatch::ops {

// out(n, C) = table[ids[i] - row_begin] or 0
template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int64_t n, int64_t C, int64_t row_begin,
                       int64_t rows);

// dtable[ids[i] - row_begin] += dout[i]. Parallel over columns: deterministic.
template <typename T>
void embedding_backward(T* dtable, const T* dout, const int32_t* ids, int64_t n, int64_t C, int64_t row_begin,
                        int64_t rows);

}  // namespace megabatch::ops
