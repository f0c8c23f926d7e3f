// Running a function on n threads at once, with an error instead of std::terminate where the
// system refuses a thread (a --workers beyond the process's thread limit: std::thread throws
// std::system_error, and a vector of joinable threads destroyed by that exception ends the
// process, as `preprocess --workers 100000` did). The threads already started are joined
// before the error, so none outlives the data it works on.
#pragma once

#include <cstddef>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/util/error.h"

namespace megabatch {

// f(t) for t in [0, n), each on its own thread; returns when all have finished. `what` names
// the setting that asked for n threads ("preprocess: --workers 100000") in the error.
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
