// The parameter registry: every parameter and its gradient is a named view into one flat
// buffer of parameters and one flat fp32 buffer of gradients with identical layouts, on
// the run's device. Parameters are in the run's dtype (f32, or bf16 / f16 for mixed
// precision); gradients are always fp32 (Megatron's main gradients, accumulated over
// micro-batches in fp32), and a mixed-precision run keeps fp32 master weights beside the
// half ones: the optimizer steps the masters, copy_masters_to_params() rounds them into the
// parameters the layers compute with. Each view
// carries typed facts set where the layer creates it: Megatron-style name, role, layer
// index, local and full (unsharded) shape, and sharding (replicated, or split along one
// dimension across the tensor-parallel group). Norms for clipping and layer-wise
// optimizers rely on the sharding facts: a sharded tensor's squared norm is summed over
// the tensor-parallel group, a replicated one is counted once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
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
  // normal at std even where --init-method-xavier-uniform draws the other weights uniformly
  // (Megatron's embeddings at an --embedding-init-method-std of their own)
  bool own_std = false;
  static Init zeros() { return {kZeros, 0.0}; }
  static Init ones() { return {kOnes, 0.0}; }
  static Init normal(double s) { return {kNormal, s}; }
  static Init normal_own(double s) { return {kNormal, s, true}; }
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
  // Allocates the flat buffers (zeros) on `device`: parameters in `dtype` (f32, bf16 or
  // f16), fp32 gradients and, for the half types, fp32 masters. No add() after this.
  void finalize(DType dtype = DType::kF32, Device device = Device::cpu());
  bool finalized() const { return finalized_; }
  // Fills every parameter from its Init. Normal draws come from Philox keyed by
  // (seed, name) and counted by the element's index in the full tensor, so a shard holds
  // exactly the matching slice of the unsharded initialization. In a mixed-precision run
  // the masters start as the rounded parameters (as Megatron's fp32 copies of bf16 weights).
  // xavier_uniform (Megatron's --init-method-xavier-uniform): every normal-initialized 2-D
  // parameter (the weights and embeddings) instead draws from U(-a, a), a = sqrt(6 / (rows +
  // columns)) of its full shape, so that it too is the same under any tensor parallelism (as
  // Megatron's --use-cpu-initialization; its GPU initialization takes each shard's shape).
  void initialize(uint64_t seed, bool xavier_uniform = false);

  size_t count() const { return infos_.size(); }
  const ParamInfo& info(int id) const { return infos_.at(id); }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  // Segments [begin, end) of the flat buffers that hold tensor-parallel sharded (or
  // replicated) parameters, in declaration order: for norms, where sharded parameters are
  // summed over the TP group and replicated ones counted once.
  std::vector<std::pair<size_t, size_t>> segments(bool sharded) const {
    std::vector<std::pair<size_t, size_t>> out;
    for (const auto& info : infos_)
      if (info.sharding.sharded == sharded) out.emplace_back(info.offset, info.offset + info.numel);
    return out;
  }
  int find(const std::string& name) const;  // -1 when absent

  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool mixed() const { return is_half(dtype_); }  // separate fp32 masters

  // Views of parameter `id` (its local shape): in the run's dtype, its fp32 gradient, its
  // fp32 master (the parameter itself in an f32 run).
  Tensor param(int id) const;
  Tensor grad(int id) const;
  Tensor master(int id) const;

  // The flat buffers (including alignment padding between parameters).
  const Tensor& params() const { return params_; }
  const Tensor& grads() const { return grads_; }
  const Tensor& masters() const;
  size_t flat_size() const { return params_.numel(); }
  int64_t num_parameters() const;       // local elements, without padding
  int64_t num_full_parameters() const;  // unsharded elements
  void zero_grad();
  // params = masters rounded to the run's dtype (nothing to do in an f32 run).
  void copy_masters_to_params();
  // Frees the whole fp32 masters of a mixed-precision run: the distributed optimizer
  // (optim::DpShards) has taken this rank's shards of them and keeps only those, as
  // Megatron's does. From then on master(), masters(), copy_masters_to_params() and
  // initialize() are errors. Nothing to free in an f32 run (the masters are the parameters).
  void release_masters();

  // Backward-pass progress, for gradient reduction that overlaps the backward pass: a
  // layer whose parameters' gradients are final (nothing later in this backward pass
  // writes them) calls grads_final with its id range [first, end); the hook, when one is
  // set (the trainer's gradient buckets), hears it. Parameters never announced are final
  // when backward returns.
  using GradsFinalHook = std::function<void(int first, int end)>;
  void set_grads_final_hook(GradsFinalHook hook) { grads_final_hook_ = std::move(hook); }
  void grads_final(int first, int end) const {
    if (grads_final_hook_) grads_final_hook_(first, end);
  }

 private:
  Tensor view(const Tensor& flat, int id) const;
  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, int> index_;  // name -> id: declaring L layers is linear in L
  Tensor params_, grads_, masters_;
  DType dtype_ = DType::kF32;
  Device device_;
  size_t next_offset_ = 0;
  int64_t full_elements_ = 0;
  bool finalized_ = false;
  bool masters_released_ = false;
  GradsFinalHook grads_final_hook_;
};

}  // namespace megabatch::nn
