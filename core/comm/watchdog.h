// A deadline on waiting for the other ranks (Megatron's --distributed-timeout-minutes): a
// collective that has not completed this long after it began means a rank died, hung or was
// stopped, and without a deadline the job would wait for it until its allocation ran out. A
// thread of its own checks the waits; at the deadline it prints which group's collective
// waited how long, on which rank, and ends the process with kExitCollectiveTimeout (mpirun and
// srun then end the other ranks). Nothing is being written then (the rank waits in a
// collective), and metrics.h5 and checkpoints are whole on disk between their writes, so
// nothing already written is lost; a rerun resumes from the last checkpoint. Off (no thread)
// until set_collective_timeout is given a deadline.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace megabatch::comm {

// The exit status of a rank that ended at the deadline.
inline constexpr int kExitCollectiveTimeout = 5;

// The deadline in seconds (0: none; the default) and the words that name it in the message
// (e.g. "--distributed-timeout-minutes 10"); `rank` is the world rank the message names.
// Starts the checking thread the first time a deadline is set.
void set_collective_timeout(double seconds, const std::string& flag, int rank);

// While alive: this thread waits in collective `what` of group `group` (a blocking MPI call, a
// host collective over NCCL). Free when no deadline is set.
class CollectiveWait {
 public:
  CollectiveWait(const char* what, const std::string& group);
  ~CollectiveWait();
  CollectiveWait(const CollectiveWait&) = delete;
  CollectiveWait& operator=(const CollectiveWait&) = delete;

 private:
  int64_t id_ = -1;
};

// Collectives queued on a GPU stream (NCCL), which the host does not wait for: `queued` when
// one is enqueued, and the checking thread asks `done` (e.g. cudaEventQuery on an event
// recorded after the newest) until it says so or the deadline passes, counted from the oldest
// not yet done. Registered for its lifetime; free when no deadline is set.
class QueuedCollectives {
 public:
  explicit QueuedCollectives(std::function<bool()> done);
  ~QueuedCollectives();
  QueuedCollectives(const QueuedCollectives&) = delete;
  QueuedCollectives& operator=(const QueuedCollectives&) = delete;
  void queued(const char* what, const std::string& group);

 private:
  int64_t id_ = -1;
};

}  // namespace megabatch::comm
