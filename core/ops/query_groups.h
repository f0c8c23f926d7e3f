// Grouped-query attention (Megatron's --group-query-attention --num-query-groups G): H query
// heads share G key/value heads, query head h reading the key and value of group h / (H / G).
// The QKV projection then gives each token G groups of [H / G queries, a key, a value] x D
// (Megatron's layout, so splitting it by columns gives each tensor-parallel rank whole groups),
// not the per-head [q, k, v] x D the attention kernels read (attention.h). expand_query_groups
// writes that per-head layout, each group's key and value copied to each of its heads; its
// backward, reduce_query_groups, takes the per-head gradient back to the grouped one, each
// key's and value's gradient summed over the group's heads in head order (the same bits on
// every run and device).
#pragma once

#include <cstdint>

#include "core/tensor/tensor.h"

namespace megabatch::ops {

struct QueryGroupShape {
  int64_t heads = 0;     // query heads in a row (this rank's)
  int64_t groups = 0;    // key/value heads in a row (this rank's); divides heads
  int64_t head_dim = 0;  // D
};

// qkv (n, H x [q, k, v] x D) = grouped (n, G x [H/G q, k, v] x D) with each group's k and v
// copied to its heads (=, every element written).
void expand_query_groups(const Tensor& qkv, const Tensor& grouped, const QueryGroupShape& s);
// dgrouped = the gradient of grouped from dqkv, that of qkv: each query's copied, each group's
// key and value gradients the sum over its heads (=, every element written).
void reduce_query_groups(const Tensor& dgrouped, const Tensor& dqkv, const QueryGroupShape& s);

}  // namespace megabatch::ops
