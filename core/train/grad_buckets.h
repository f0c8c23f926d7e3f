// Data-parallel gradient reduction in buckets (Megatron's DDP): the flat fp32 gradient
// buffer is cut into buckets of whole parameters, about `bucket_elems` elements each,
// formed in reverse parameter order (the order the backward pass finishes them). Each
// bucket is one sum over the data-parallel group. With overlap, a bucket starts as soon as
// every parameter in it is final in the last micro-batch's backward pass (layers announce
// it through ParameterStore::grads_final), so the reduction runs while the earlier layers
// still compute; without, all start after the backward pass. Either way the buckets, their
// order and their contents are the same, so the reduced gradients are too. With the
// distributed optimizer each bucket is reduce-scattered into the ranks' shards instead of
// summed whole (core/optim/dp_shards.h).
#pragma once

#include <cstddef>
#include <vector>

#include "core/comm/communicator.h"
#include "core/nn/parameters.h"
#include "core/optim/dp_shards.h"

namespace megabatch::train {

// The buckets: ranges of whole parameters of about bucket_elems elements of the flat
// buffers, formed from the last parameter back (the first range ends the buffer).
std::vector<optim::DpShards::Range> bucket_ranges(const nn::ParameterStore& store, size_t bucket_elems);

class GradientBuckets {
 public:
  // `ranges` as bucket_ranges gives them. With `shards` (the distributed optimizer) the
  // buckets are its own and each is reduce-scattered into shards->grads().
  GradientBuckets(nn::ParameterStore& store, comm::Communicator& dp, std::vector<optim::DpShards::Range> ranges,
                  bool overlap, optim::DpShards* shards = nullptr);
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // Before the last micro-batch's backward pass: from now on, buckets start as their
  // parameters become final (with overlap; otherwise nothing happens until finish()).
  void arm();
  // After it: starts the buckets not started yet, in bucket order, and waits for every one.
  void finish();
  size_t count() const { return buckets_.size(); }
  // Buckets started during the backward pass in the last step (overlap achieved).
  size_t started_early() const { return started_early_; }

 private:
  struct Bucket {
    size_t begin = 0, end = 0;  // flat gradient range
    int params = 0;             // parameters in it
    int final = 0;              // of which final in this backward pass
    bool started = false;
  };
  void on_final(int first, int end);
  void start(size_t b);

  nn::ParameterStore& store_;
  comm::Communicator& dp_;
  bool overlap_;
  optim::DpShards* shards_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // parameter id -> bucket
  std::vector<bool> final_;        // parameter id -> final in this backward pass
  bool armed_ = false;
  size_t started_early_ = 0;
};

// Elements per bucket: ddp_bucket_size when it is > 0, else Megatron's default with
// overlap, max(40M, 1M x DP), and without it one bucket of everything (the buffer's size).
size_t bucket_elems(int64_t ddp_bucket_size, size_t flat_size, int dp_size, bool overlap);

}  // namespace megabatch::train
