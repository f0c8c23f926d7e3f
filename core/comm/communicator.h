// Communicator: the collectives tensor- and data-parallel code is written against.
// Every rank of the group calls each collective in the same order with the same sizes.
// Implementations: LocalCommunicator (one rank; every collective is the identity), and
// later MPI (CPU) and NCCL (GPU).
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>

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
  // out (size() * n) = the n elements of every rank, in rank order.
  virtual void all_gather(const float* in, float* out, size_t n) = 0;
  // in (size() * n) summed over ranks; this rank keeps its n-element slice in out.
  virtual void reduce_scatter(const float* in, float* out, size_t n) = 0;
  virtual void broadcast(float* data, size_t n, int root) = 0;
  virtual void barrier() = 0;
};

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(float*, size_t, ReduceOp) override {}
  void all_reduce(double*, size_t, ReduceOp) override {}
  void all_gather(const float* in, float* out, size_t n) override {
    if (in != out) std::memmove(out, in, n * sizeof(float));
  }
  void reduce_scatter(const float* in, float* out, size_t n) override {
    if (in != out) std::memmove(out, in, n * sizeof(float));
  }
  void broadcast(float*, size_t, int) override {}
  void barrier() override {}
};

}  // namespace megabatch::comm
