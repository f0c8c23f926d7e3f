// Communicator: the collectives tensor- and data-parallel code is written against.
// Every rank of the group calls each collective in the same order with the same sizes.
// Implementations: LocalCommunicator (one rank; every collective is the identity),
// MpiCommunicator (host buffers; device tensors are staged through host memory by
// core/comm/collectives.h) and NcclCommunicator (device buffers, on its own stream).
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "core/device/dtype.h"

namespace megabatch::comm {

enum class ReduceOp { kSum, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place over n elements: every rank ends with the reduction over all ranks.
  virtual void all_reduce(float* data, size_t n, ReduceOp op) = 0;
  virtual void all_reduce(double* data, size_t n, ReduceOp op) = 0;
  // out (size() * bytes) = the `bytes` bytes of every rank, in rank order (in and out do
  // not overlap). It moves bits, so it serves every dtype.
  virtual void all_gather_bytes(const void* in, void* out, size_t bytes) = 0;
  // The same over n floats.
  void all_gather(const float* in, float* out, size_t n) { all_gather_bytes(in, out, n * sizeof(float)); }
  // in (size() * n) summed over ranks; this rank keeps its n-element slice in out.
  virtual void reduce_scatter(const float* in, float* out, size_t n) = 0;
  virtual void broadcast(float* data, size_t n, int root) = 0;
  virtual void barrier() = 0;

  // ---- device buffers (only where device_buffers() is true) ----
  // The same collectives over GPU memory of the run's device, element type t (f32, f64,
  // bf16, f16; halves are reduced in their own type, as NCCL does), ordered after
  // everything issued so far on the run's stream, and everything issued after them waits
  // for them. core/comm/collectives.h chooses between these and host staging.
  virtual bool device_buffers() const { return false; }
  virtual void all_reduce_device(void* data, size_t n, DType t, ReduceOp op);
  virtual void all_gather_device(const void* in, void* out, size_t n, DType t);
  virtual void reduce_scatter_device(const void* in, void* out, size_t n, DType t);
  virtual void broadcast_device(void* data, size_t n, DType t, int root);
  // What carries the collectives, for the start-up line ("MPI", "NCCL 2.28.3").
  virtual std::string backend() const { return "local"; }
  // The group, as messages name it ("tensor-parallel", "data-parallel", "world").
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

  // ---- non-blocking sums (gradient buckets that overlap the backward pass) ----
  // start_all_reduce (host f32) and start_all_reduce_device begin a sum over every rank,
  // start_reduce_scatter(_device) a reduce-scatter (the distributed optimizer's buckets),
  // and return; the buffers are not touched by the caller until wait_all(), which
  // completes every one started (on a GPU: the run's stream waits for them). progress()
  // lets started ones advance (MPI moves non-blocking collectives only inside its calls).
  // Defaults: blocking, complete when start returns.
  virtual void start_all_reduce(float* data, size_t n) { all_reduce(data, n, ReduceOp::kSum); }
  virtual void start_all_reduce_device(void* data, size_t n, DType t) { all_reduce_device(data, n, t, ReduceOp::kSum); }
  virtual void start_reduce_scatter(const float* in, float* out, size_t n) { reduce_scatter(in, out, n); }
  virtual void start_reduce_scatter_device(const void* in, void* out, size_t n, DType t) {
    reduce_scatter_device(in, out, n, t);
  }
  virtual void progress() {}
  virtual void wait_all() {}

 private:
  std::string name_ = "world";
};

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(float*, size_t, ReduceOp) override {}
  void all_reduce(double*, size_t, ReduceOp) override {}
  void all_gather_bytes(const void* in, void* out, size_t bytes) override {
    if (in != out) std::memmove(out, in, bytes);
  }
  void reduce_scatter(const float* in, float* out, size_t n) override {
    if (in != out) std::memmove(out, in, n * sizeof(float));
  }
  void broadcast(float*, size_t, int) override {}
  void barrier() override {}
};

}  // namespace megabatch::comm
