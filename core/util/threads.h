// Threads: the CPUs this process may use, a check of a thread-count setting against them,
// and running a function on n threads with an error instead of std::terminate where the
// system refuses one (std::thread throws std::system_error, and a vector of joinable threads
// destroyed by that exception ends the process, as `preprocess --workers 100000` did).
#pragma once

#include <sched.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/util/error.h"

namespace megabatch {

// The CPUs this process may run on (its affinity mask: what taskset, Slurm's cpuset or a
// container's cpuset leave it), at least 1.
inline int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, CPU_COUNT(&set));
}

// An error unless `threads` (0: all CPUs) fits the CPUs this process may use: more threads
// than CPUs only slow a run down, and far more fail in the OpenMP runtime (train --threads
// 100000 ended in a segmentation fault). `flag` names the setting ("--threads").
inline void check_thread_count(int64_t threads, const std::string& flag) {
  const int cpus = available_cpus();
  check(threads <= cpus, flag, ": ", threads, " is more than the ", cpus, " CPUs this process may use; give at most ",
        cpus, " (0: all of them)");
}

// f(t) for t in [0, n), each on its own thread; returns when all have finished. Where a thread
// is refused, those already started are joined (none outlives the data it works on) and the
// error names the setting that asked for n threads (`what`: "preprocess: --workers 100000").
template <class F>
void run_on_threads(size_t n, const std::string& what, const F& f) {
  std::vector<std::thread> threads;
  threads.reserve(n);
  std::string refused;
  for (size_t t = 0; t < n; ++t) {
    try {
      threads.emplace_back(f, t);
    } catch (const std::system_error& e) {
      refused = e.what();
      break;
    }
  }
  for (auto& th : threads) th.join();
  if (!refused.empty())
    fail(what, ": the system refused to start thread ", threads.size() + 1, " of ", n, " (", refused,
         "); ask for fewer");
}

}  // namespace megabatch
