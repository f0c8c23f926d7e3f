// ThreadGroup / ThreadCommunicator: a communicator whose ranks are threads of one process,
// sharing memory. It lets tensor-parallel code (layers, TP-aware norms, optimizer plugins)
// run as a real N-way split inside one test process before multi-process runs exist, and
// it is the reference the MPI communicator is checked against.
//
//   comm::ThreadGroup group(2);
//   std::thread t0([&] { auto& c = group.rank(0); ... }), t1([&] { auto& c = group.rank(1); ... });
//
// Every rank must call the same collectives in the same order with the same sizes, as
// with any communicator; a rank that never arrives blocks the others (tests only).
// Reductions add the ranks' contributions in rank order, so every rank gets bitwise the
// same result.
#pragma once

#include <barrier>
#include <cstring>
#include <memory>
#include <vector>

#include "core/comm/communicator.h"

namespace megabatch::comm {

class ThreadGroup;

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override;
  void all_reduce(float* data, size_t n, ReduceOp op) override { reduce(data, n, op); }
  void all_reduce(double* data, size_t n, ReduceOp op) override { reduce(data, n, op); }
  void all_gather_bytes(const void* in, void* out, size_t bytes) override;
  void reduce_scatter(const float* in, float* out, size_t n) override;
  void broadcast(float* data, size_t n, int root) override;
  void barrier() override;

 private:
  template <typename T>
  void reduce(T* data, size_t n, ReduceOp op);
  ThreadGroup& group_;
  int rank_;
};

class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : barrier_(size), posted_(static_cast<size_t>(size)) {
    for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<ThreadCommunicator>(*this, r));
  }
  int size() const { return static_cast<int>(ranks_.size()); }
  ThreadCommunicator& rank(int r) { return *ranks_[static_cast<size_t>(r)]; }

 private:
  friend class ThreadCommunicator;
  std::barrier<> barrier_;
  std::vector<const void*> posted_;  // each rank's buffer during a collective
  std::vector<std::unique_ptr<ThreadCommunicator>> ranks_;
};

inline int ThreadCommunicator::size() const { return group_.size(); }

inline void ThreadCommunicator::barrier() { group_.barrier_.arrive_and_wait(); }

template <typename T>
void ThreadCommunicator::reduce(T* data, size_t n, ReduceOp op) {
  group_.posted_[static_cast<size_t>(rank_)] = data;
  barrier();  // every buffer posted
  std::vector<T> result(n);
  for (int r = 0; r < size(); ++r) {
    const T* in = static_cast<const T*>(group_.posted_[static_cast<size_t>(r)]);
    for (size_t i = 0; i < n; ++i)
      result[i] = r == 0 ? in[i] : op == ReduceOp::kSum ? result[i] + in[i] : (in[i] > result[i] ? in[i] : result[i]);
  }
  barrier();  // every rank has read every buffer
  std::memcpy(data, result.data(), n * sizeof(T));
  barrier();  // no rank reuses its buffer before all have finished
}

inline void ThreadCommunicator::all_gather_bytes(const void* in, void* out, size_t bytes) {
  group_.posted_[static_cast<size_t>(rank_)] = in;
  barrier();
  std::vector<char> result(bytes * static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r)
    std::memcpy(result.data() + static_cast<size_t>(r) * bytes, group_.posted_[static_cast<size_t>(r)], bytes);
  barrier();
  std::memcpy(out, result.data(), result.size());
  barrier();
}

inline void ThreadCommunicator::reduce_scatter(const float* in, float* out, size_t n) {
  group_.posted_[static_cast<size_t>(rank_)] = in;
  barrier();
  std::vector<float> result(n, 0.0f);
  for (int r = 0; r < size(); ++r) {
    const float* src = static_cast<const float*>(group_.posted_[static_cast<size_t>(r)]) + static_cast<size_t>(rank_) * n;
    for (size_t i = 0; i < n; ++i) result[i] += src[i];
  }
  barrier();
  std::memcpy(out, result.data(), n * sizeof(float));
  barrier();
}

inline void ThreadCommunicator::broadcast(float* data, size_t n, int root) {
  group_.posted_[static_cast<size_t>(rank_)] = data;
  barrier();
  std::vector<float> result(static_cast<const float*>(group_.posted_[static_cast<size_t>(root)]),
                            static_cast<const float*>(group_.posted_[static_cast<size_t>(root)]) + n);
  barrier();
  std::memcpy(data, result.data(), n * sizeof(float));
  barrier();
}

}  // namespace megabatch::comm
