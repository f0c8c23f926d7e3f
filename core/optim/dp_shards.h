// The distributed optimizer's layout (Megatron's --use-distributed-optimizer). Each
// gradient bucket [begin, end) of the flat buffers is cut into D equal shards over the D
// data-parallel ranks (the bucket padded to a multiple of D where it is not one), and rank
// r owns the r-th. Gradients are reduce-scattered bucket by bucket into this rank's shard
// buffer; the optimizer updates only the fp32 masters (and keeps only the state) of its
// shards; the parameters of every shard are then all-gathered, so every rank computes with
// the whole model. In a mixed-precision run this rank keeps the masters of its shards only
// (a buffer laid out as the gradient shards) and the all-gather moves the half parameters,
// rounded from them by their owner; in an f32 run the masters are the parameters.
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
  // In a mixed-precision run this takes this rank's shards of the store's (initialized)
  // fp32 masters and releases the store's whole copy (nn::ParameterStore::release_masters).
  DpShards(nn::ParameterStore& store, std::vector<Range> buckets, comm::Communicator& dp);

  comm::Communicator& dp() const { return dp_; }
  size_t buckets() const { return buckets_.size(); }
  Range bucket(size_t b) const { return {buckets_[b].begin, buckets_[b].end}; }
  std::vector<Range> ranges() const;  // every bucket, in bucket order
  const Piece& piece(int id) const { return pieces_.at(static_cast<size_t>(id)); }
  // This rank's reduced fp32 gradients: its shard of every bucket, in bucket order.
  const Tensor& grads() const { return grads_; }
  // This rank's piece of parameter `id`'s fp32 master (flat): in its shard of the masters
  // (mixed precision, laid out as grads()) or the parameter itself (f32).
  Tensor master_piece(int id) const;
  // Elements of fp32 masters this rank keeps: its shards (mixed precision), else 0 (the
  // masters are the parameters).
  size_t master_elements() const { return masters_.defined() ? masters_.numel() : 0; }
  // Segments of grads() that hold pieces of tensor-parallel sharded / replicated
  // parameters (for norms: sharded ones are summed over the TP group, replicated once).
  const std::vector<std::pair<size_t, size_t>>& segments(bool sharded) const { return sharded ? sharded_ : replicated_; }
  // Elements of the optimizer state this rank keeps per parameter-shaped state buffer, over
  // all parameters (the sum of the pieces), against the whole model's.
  int64_t piece_elements() const;

  // Starts the sum over the ranks of bucket b of the store's flat gradients into this
  // rank's shard of grads() (complete after dp().wait_all()).
  void start_reduce_scatter(size_t b);
  // After the optimizer step: every rank's shard of the parameters to every rank, in the
  // parameters' dtype (each rank's half parameters rounded from its masters first).
  void all_gather_params();
  // The whole (TP-local) fp32 master of every parameter, for checkpoints: the pieces
  // gathered over the data-parallel group (every DP rank calls it; f32: views of the
  // parameters, which are whole after every step).
  std::vector<Tensor> whole_masters() const;
  // Sets every parameter, and this rank's pieces of the masters, from whole fp32 masters
  // (as whole_masters() gives them, loaded from a checkpoint written at any DP size).
  void restore_masters(const std::vector<Tensor>& whole);
  // A whole tensor of `shape` on every DP rank from each rank's piece of it (`piece`, at
  // flat element `offset`; the ranks' pieces disjoint and covering it): a sum over the
  // group of tensors that are -0.0 outside each rank's piece, exact bit for bit (x + -0.0
  // is x for every x, +0.0 included).
  Tensor gather_pieces(const Tensor& piece, int64_t offset, const std::vector<int64_t>& shape) const;

 private:
  struct Bucket {
    size_t begin = 0, end = 0;  // flat range
    size_t shard = 0;           // elements per rank (the bucket padded to shard x D)
    size_t at = 0;              // this rank's shard in grads_
    Tensor staging;             // shard x D elements where the bucket is not a multiple of D
  };
  // This rank's shard of bucket b within the bucket: elements [first, first + n) of it (n
  // short of the shard, or 0, where the shard reaches into the bucket's padding).
  std::pair<size_t, size_t> own(const Bucket& b) const;
  nn::ParameterStore& store_;
  comm::Communicator& dp_;
  std::vector<Bucket> buckets_;
  std::vector<Piece> pieces_;
  std::vector<std::pair<size_t, size_t>> sharded_, replicated_;
  Tensor grads_, send_;
  Tensor masters_;  // mixed precision: this rank's fp32 masters, laid out as grads_
};

}  // namespace megabatch::optim
