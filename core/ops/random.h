// Random draws that are a pure function of (key, element of the full tensor): the same
// numbers on the CPU and a GPU, on any thread count and any tensor-parallel layout (the
// host's service behind plugins' noise, e.g. lamb_noise).
#pragma once

#include <cstdint>

#include "core/tensor/tensor.h"
#include "core/util/host_device.h"


namespace megabatch::ops {

// Where the elements of a local shard sit in the full (unsharded) 1-D or 2-D tensor, as
// nn::ParamInfo::full_index: element i of the shard is element full_index(i).
struct ShardLayout {
  int64_t rows = 0, cols = 1;  // local shape (cols 1 for 1-D)
  int64_t full_cols = 1;
  int partition_dim = -1;      // -1: not sharded
  int64_t rank = 0;            // this shard's index along partition_dim
  int64_t offset = 0;          // element i is local element offset + i (a distributed optimizer's piece)
  MB_HOST_DEVICE int64_t full_index(int64_t i) const {
    i += offset;
    if (partition_dim < 0) return i;
    const int64_t r = i / cols, c = i % cols;
    if (partition_dim == 0) return (rank * rows + r) * full_cols + c;
    return r * full_cols + rank * cols + c;
  }
};

// out[i] = a standard normal draw, philox_normal(key, layout.full_index(i)) (f32).
void normal_fill(const Tensor& out, uint64_t key, const ShardLayout& layout);

}  // namespace megabatch::ops
