// Optimizer state as the host keeps it for a plugin: one fp32 buffer per (parameter name,
// state name), on the run's device, with how it is split across the tensor-parallel group.
// Checkpoints save the checkpointed buffers in their full (unsharded) shape.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor/tensor.h"

namespace megabatch::optim {

struct PluginState {
  Tensor tensor;
  int partition_dim = -1;    // the dimension split across the group; -1: the same on every rank
  bool checkpointed = true;  // false: scratch
  // The distributed optimizer: the tensor is elements [piece_offset, piece_offset +
  // numel) of a parameter-shaped state of shape piece_of (empty: the tensor is all of it).
  std::vector<int64_t> piece_of;
  int64_t piece_offset = 0;
  // The unsharded shape: the partition dimension times the group size.
  std::vector<int64_t> full_shape(int tp_size) const {
    std::vector<int64_t> s = tensor.shape();
    if (partition_dim >= 0) s[static_cast<size_t>(partition_dim)] *= tp_size;
    return s;
  }
  // Index in the full tensor of local element i on rank `rank`.
  int64_t full_index(int64_t i, int rank, int tp_size) const {
    if (partition_dim < 0) return i;
    const std::vector<int64_t>& s = tensor.shape();
    const size_t d = static_cast<size_t>(partition_dim);
    int64_t inner = 1;
    for (size_t k = d + 1; k < s.size(); ++k) inner *= s[k];
    const int64_t outer_i = i / (s[d] * inner), mid = (i / inner) % s[d], in = i % inner;
    return (outer_i * s[d] * tp_size + static_cast<int64_t>(rank) * s[d] + mid) * inner + in;
  }
};

using OptimizerState = std::map<std::pair<std::string, std::string>, PluginState>;

}  // namespace megabatch::optim
