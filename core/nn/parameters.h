// The parameter registry: every parameter and its gradient is a named view into one flat
// fp32 buffer (params) and one flat fp32 buffer (grads) with identical layouts. Each view
// carries typed facts set where the layer creates it: Megatron-style name, role, layer
// index, local and full (unsharded) shape, and sharding (replicated, or split along one
// dimension across the tensor-parallel group). Norms for clipping and layer-wise
// optimizers rely on the sharding facts: a sharded tensor's squared norm is summed over
// the tensor-parallel group, a replicated one is counted once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor/tensor.h"

namespace megabatch::nn {

enum class Role { kEmbedding, kWeight, kBias, kNorm };
const char* role_name(Role r);

struct Sharding {
  bool sharded = false;
  int partition_dim = -1;  // dimension split across the group when sharded
  int tp_rank = 0, tp_size = 1;
  static Sharding replicated(int tp_rank = 0, int tp_size = 1) { return {false, -1, tp_rank, tp_size}; }
  static Sharding split(int dim, int tp_rank, int tp_size) { return {true, dim, tp_rank, tp_size}; }
};

struct Init {
  enum Kind { kZeros, kOnes, kNormal } kind = kZeros;
  double std = 0.0;
  static Init zeros() { return {kZeros, 0.0}; }
  static Init ones() { return {kOnes, 0.0}; }
  static Init normal(double s) { return {kNormal, s}; }
};

struct ParamSpec {
  std::string name;                  // e.g. decoder.layers.3.self_attention.linear_qkv.weight
  Role role = Role::kWeight;
  int layer = -1;                    // transformer layer index, -1 outside the layers
  std::vector<int64_t> full_shape;   // unsharded shape (at most 2 dimensions)
  Sharding sharding;
  Init init;
};

struct ParamInfo : ParamSpec {
  std::vector<int64_t> shape;  // local shape (full_shape with the partition dim divided)
  size_t offset = 0;           // into the flat buffers, a multiple of 16 elements
  size_t numel = 0;
  int64_t full_numel() const;
  // Index in the full tensor of local element i (the shard's slice of the full tensor).
  int64_t full_index(int64_t i) const;
};

class ParameterStore {
 public:
  // Declares a parameter; returns its id. Errors on a duplicate name or a partition
  // dimension that the group size does not divide.
  int add(ParamSpec spec);
  // Allocates the flat buffers (zeros); no add() after this.
  void finalize();
  bool finalized() const { return finalized_; }
  // Fills every parameter from its Init. Normal draws come from Philox keyed by
  // (seed, name) and counted by the element's index in the full tensor, so a shard holds
  // exactly the matching slice of the unsharded initialization.
  void initialize(uint64_t seed);

  size_t count() const { return infos_.size(); }
  const ParamInfo& info(int id) const { return infos_.at(id); }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  int find(const std::string& name) const;  // -1 when absent

  float* param(int id) { return params_.data() + infos_[id].offset; }
  const float* param(int id) const { return params_.data() + infos_[id].offset; }
  float* grad(int id) { return grads_.data() + infos_[id].offset; }
  const float* grad(int id) const { return grads_.data() + infos_[id].offset; }

  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  size_t flat_size() const { return params_.numel(); }  // including alignment padding
  int64_t num_parameters() const;       // local elements, without padding
  int64_t num_full_parameters() const;  // unsharded elements
  void zero_grad();

 private:
  std::vector<ParamInfo> infos_;
  Tensor params_, grads_;
  size_t next_offset_ = 0;
  bool finalized_ = false;
};

}  // namespace megabatch::nn
