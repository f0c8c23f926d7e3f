#include "core/comm/watchdog.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

namespace megabatch::comm {
namespace {

using Clock = std::chrono::steady_clock;

struct Wait {
  std::string what, group;
  Clock::time_point since;
  bool pending = true;
  std::function<bool()> done;  // queued collectives: asked by the checking thread
};

// Never destroyed: the checking thread (detached) may read it while the process exits.
struct State {
  std::mutex mu;
  double seconds = 0;
  std::string flag;
  int rank = 0;
  bool started = false;
  int64_t next = 0;
  std::map<int64_t, Wait> waits;
};
State& state() {
  static State* s = new State;
  return *s;
}
// Whether a deadline is set: read without the lock, so that a collective without one costs a load.
std::atomic<bool> g_on{false};

[[noreturn]] void expire(const State& s, const Wait& w, double waited) {
  std::fprintf(
      stderr,
      "train (rank %d): error: the %s group's %s has waited %.1f s for its other ranks (%s): one of them died, "
      "hung or was stopped. Ending the job (exit status %d); a rerun with --load resumes from the last checkpoint\n",
      s.rank, w.group.c_str(), w.what.c_str(), waited, s.flag.c_str(), kExitCollectiveTimeout);
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(kExitCollectiveTimeout);
}

void check_loop() {
  State& s = state();
  for (;;) {
    double period;
    {
      std::unique_lock<std::mutex> lock(s.mu);
      period = std::min(1.0, std::max(0.01, s.seconds / 20));
      const auto now = Clock::now();
      for (auto& [id, w] : s.waits) {
        if (!w.pending) continue;
        if (w.done && w.done()) {  // a queued collective that completed
          w.pending = false;
          continue;
        }
        const double waited = std::chrono::duration<double>(now - w.since).count();
        if (waited > s.seconds) expire(s, w, waited);
      }
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(period));
  }
}

int64_t add(Wait w) {
  if (!g_on.load(std::memory_order_relaxed)) return -1;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.seconds <= 0) return -1;
  const int64_t id = s.next++;
  s.waits.emplace(id, std::move(w));
  return id;
}
void remove(int64_t id) {
  if (id < 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.waits.erase(id);
}

}  // namespace

void set_collective_timeout(double seconds, const std::string& flag, int rank) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.seconds = seconds;
  s.flag = flag;
  s.rank = rank;
  g_on.store(seconds > 0);
  if (seconds > 0 && !s.started) {
    s.started = true;
    std::thread(check_loop).detach();
  }
}

CollectiveWait::CollectiveWait(const char* what, const std::string& group) {
  if (g_on.load(std::memory_order_relaxed)) id_ = add(Wait{what, group, Clock::now(), true, nullptr});
}
CollectiveWait::~CollectiveWait() { remove(id_); }

QueuedCollectives::QueuedCollectives(std::function<bool()> done)
    : id_(add(Wait{"", "", Clock::now(), false, std::move(done)})) {}
QueuedCollectives::~QueuedCollectives() { remove(id_); }

void QueuedCollectives::queued(const char* what, const std::string& group) {
  if (id_ < 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  Wait& w = s.waits.at(id_);
  if (!w.pending) {  // (one still pending keeps its start and name: the oldest not done)
    w.since = Clock::now();
    w.what = what;
    w.group = group;
  }
  w.pending = true;
}

}  // namespace megabatch::comm
