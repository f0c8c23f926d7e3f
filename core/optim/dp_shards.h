// The distributed optimizer's layout (Megatron's --use-distributed-optimizer). Each
// gradient bucket [begin, end) of the flat buffers is cut into D equal shards over the D
// data-parallel ranks (the bucket padded to a multiple of D where it is not one), and rank
// r owns the r-th. Gradients are reduce-scattered bucket by bucket into this rank's shard
// buffer; the optimizer updates only the masters (and keeps only the state) of its shards;
// the masters are all-gathered after the step, so every rank computes with the whole model.
// Per parameter, this rank holds one contiguous range of its local elements, its piece,
// possibly empty: the ranks' pieces of a parameter cover it exactly once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/nn/parameters.h"
#include "core/tensor/tensor.h"

namespace megabatch::optim {

// Parameter `id`'s piece on this rank: local elements [begin, end) (flattened, row-major),
// whose reduced gradients are at grads()[at, at + end - begin).
struct Piece {
  int64_t begin = 0, end = 0;
  size_t at = 0;
  int64_t numel() const { return end - begin; }
};

class DpShards {
 public:
  struct Range {
    size_t begin = 0, end = 0;  // flat-buffer elements
  };
  // `buckets` partition the store's flat buffers (any order, each of whole parameters).
  DpShards(nn::ParameterStore& store, std::vector<Range> buckets, comm::Communicator& dp);

  comm::Communicator& dp() const { return dp_; }
  size_t buckets() const { return buckets_.size(); }
  Range bucket(size_t b) const { return {buckets_[b].begin, buckets_[b].end}; }
  std::vector<Range> ranges() const;  // every bucket, in bucket order
  const Piece& piece(int id) const { return pieces_.at(static_cast<size_t>(id)); }
  // This rank's reduced fp32 gradients: its shard of every bucket, in bucket order.
  const Tensor& grads() const { return grads_; }
  // Segments of grads() that hold pieces of tensor-parallel sharded / replicated
  // parameters (for norms: sharded ones are summed over the TP group, replicated once).
  const std::vector<std::pair<size_t, size_t>>& segments(bool sharded) const { return sharded ? sharded_ : replicated_; }
  // Elements of the optimizer state this rank keeps per parameter-shaped state buffer, over
  // all parameters (the sum of the pieces), against the whole model's.
  int64_t piece_elements() const;

  // Starts the sum over the ranks of bucket b of the store's flat gradients into this
  // rank's shard of grads() (complete after dp().wait_all()).
  void start_reduce_scatter(size_t b);
  // Every rank's shard of the fp32 masters to every rank (after the optimizer step).
  void all_gather_masters();

 private:
  struct Bucket {
    size_t begin = 0, end = 0;  // flat range
    size_t shard = 0;           // elements per rank (the bucket padded to shard x D)
    size_t at = 0;              // this rank's shard in grads_
    Tensor staging;             // shard x D elements where the bucket is not a multiple of D
  };
  nn::ParameterStore& store_;
  comm::Communicator& dp_;
  std::vector<Bucket> buckets_;
  std::vector<Piece> pieces_;
  std::vector<std::pair<size_t, size_t>> sharded_, replicated_;
  Tensor grads_, send_;
};

}  // namespace megabatch::optim
