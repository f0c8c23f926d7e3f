#include "core/device/profile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>

#include "core/device/dispatch.h"
#include "core/device/runtime.h"
#include "core/util/error.h"
#if MEGABATCH_WITH_CUDA
#include "core/device/cuda/cuda_profile.h"
#endif

namespace megabatch::profile {

namespace {

constexpr const char* kNames[] = {"other (unmarked)", "attention forward", "attention backward", "GEMMs (linear layers)",
                                  "LM head + loss",   "LayerNorm",         "elementwise",        "embedding",
                                  "optimizer",        "communication"};
static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(Family::kCount));

enum class Mode { kOff, kHost, kGpu };
std::atomic<bool> g_active{false};
std::atomic<Mode> g_mode{Mode::kOff};
std::mutex g_host_mu;
std::vector<Interval> g_host;  // host mode: what each thread's marks covered

struct Frame {
  Family family;
  const char* name;
  bool inherited = false;  // an op inside a mark: its stretch goes on
  bool resumed = false;    // host mode: a mark nested in this one has closed
};
thread_local std::vector<Frame> t_stack;
thread_local uint64_t t_last = 0;  // host mode: when the top frame's current stretch began

uint64_t host_now() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

// Host mode: the stretch [t_last, now) belongs to the top frame.
void close_stretch(uint64_t now) {
  if (t_stack.empty() || now <= t_last) return;
  const Frame& top = t_stack.back();
  std::lock_guard<std::mutex> lock(g_host_mu);
  g_host.push_back({t_last, now, top.family, false, top.name, !top.resumed});
}

// The `top` costliest names of `in` by the time credited to each interval.
std::vector<TopEntry> costliest(const std::vector<Interval>& in, const std::vector<double>& credited, size_t top) {
  std::map<std::pair<std::string, Family>, TopEntry> by_name;
  for (size_t i = 0; i < in.size(); ++i) {
    TopEntry& e = by_name[{in[i].name, in[i].family}];
    e.name = in[i].name;
    e.family = in[i].family;
    e.seconds += credited[i];
    e.count += in[i].counted ? 1 : 0;
  }
  std::vector<TopEntry> out;
  for (auto& [key, e] : by_name) out.push_back(std::move(e));
  std::stable_sort(out.begin(), out.end(), [](const TopEntry& a, const TopEntry& b) { return a.seconds > b.seconds; });
  if (out.size() > top) out.resize(top);
  return out;
}

}  // namespace

const char* family_name(Family f) {
  const auto i = static_cast<size_t>(f);
  return i < static_cast<size_t>(Family::kCount) ? kNames[i] : "?";
}

Family family_of_op(std::string_view op) {
  auto starts = [&](std::string_view p) { return op.substr(0, p.size()) == p; };
  auto ends = [&](std::string_view s) { return op.size() >= s.size() && op.substr(op.size() - s.size()) == s; };
  if (op.find("attention") != std::string_view::npos || starts("relative_bias"))
    return ends("_backward") ? Family::kAttentionBackward : Family::kAttentionForward;
  if (op == "gemm" || starts("linear_") || starts("bias_")) return Family::kGemm;
  if (starts("layernorm_") || starts("rmsnorm_")) return Family::kNorm;
  if (starts("ce_")) return Family::kLmHeadLoss;
  if (starts("embedding_")) return Family::kEmbedding;
  if (op == "unscale_and_check" || op == "loss_scaler_update" || op == "clip_coefficient") return Family::kOptimizer;
  return Family::kElementwise;  // activations, residual, dropout, casts, scales, sums, gathers, fills
}

bool active() { return g_active.load(std::memory_order_relaxed); }

namespace detail {

void enter(Family f, bool region, const char* name) {
  Frame frame{f, name};
  if (!region && !t_stack.empty()) frame = {t_stack.back().family, t_stack.back().name, true};  // the mark's
  switch (g_mode.load(std::memory_order_relaxed)) {
    case Mode::kHost: {
      if (frame.inherited) break;
      const uint64_t now = host_now();
      close_stretch(now);
      t_last = now;
      break;
    }
    case Mode::kGpu:
      MB_CUDA(cuda_profile::push(static_cast<uint64_t>(frame.family) + 1));
      break;
    case Mode::kOff:
      break;
  }
  t_stack.push_back(frame);
}

void leave() {
  if (t_stack.empty()) return;
  switch (g_mode.load(std::memory_order_relaxed)) {
    case Mode::kHost: {
      if (t_stack.back().inherited) break;
      const uint64_t now = host_now();
      close_stretch(now);
      t_last = now;
      if (t_stack.size() > 1) t_stack[t_stack.size() - 2].resumed = true;
      break;
    }
    case Mode::kGpu:
      MB_CUDA(cuda_profile::pop());
      break;
    case Mode::kOff:
      break;
  }
  t_stack.pop_back();
}

}  // namespace detail

Table attribute(std::vector<Interval> intervals, uint64_t begin, uint64_t end, int64_t steps, size_t top) {
  Table t;
  t.steps = steps;
  end = std::max(end, begin);
  t.window_seconds = static_cast<double>(end - begin) * 1e-9;
  // in order of beginning, then clipped to the window (what falls outside it goes)
  std::stable_sort(intervals.begin(), intervals.end(), [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  std::vector<Interval> in;
  in.reserve(intervals.size());
  for (auto& iv : intervals) {
    iv.begin = std::max(iv.begin, begin);
    iv.end = std::min(iv.end, end);
    if (iv.end > iv.begin) in.push_back(std::move(iv));
  }
  // sweep over the boundaries; `open` is ordered by who gets the time: compute before
  // communication, then the one that began first (its index, the intervals being sorted)
  std::vector<std::pair<uint64_t, size_t>> ends;  // (end, index), a min-heap
  auto later = [](const auto& a, const auto& b) { return a.first > b.first; };
  std::set<std::pair<int, size_t>> open;
  std::vector<double> seconds(static_cast<size_t>(Family::kCount)), copy_seconds(seconds.size());
  std::vector<int64_t> counts(seconds.size());
  std::vector<double> credited(in.size());
  uint64_t busy = 0, now = begin;
  size_t next = 0;
  auto gap = [&](uint64_t length) {  // a stretch with nothing running
    const double s = static_cast<double>(length) * 1e-9;
    (s < kShortGapSeconds ? t.short_gaps : t.long_gaps) += 1;
    (s < kShortGapSeconds ? t.short_gap_seconds : t.long_gap_seconds) += s;
  };
  auto credit = [&](uint64_t until) {
    if (until <= now) return;
    if (open.empty()) {
      gap(until - now);
    } else {
      const Interval& w = in[open.begin()->second];
      const double s = static_cast<double>(until - now) * 1e-9;
      seconds[static_cast<size_t>(w.family)] += s;
      if (w.copy) copy_seconds[static_cast<size_t>(w.family)] += s;
      credited[open.begin()->second] += s;
      busy += until - now;
    }
    now = until;
  };
  while (next < in.size() || !ends.empty()) {
    const bool start_next = next < in.size() && (ends.empty() || in[next].begin < ends.front().first);
    if (start_next) {
      credit(in[next].begin);
      open.insert({in[next].family == Family::kCommunication ? 1 : 0, next});
      ends.emplace_back(in[next].end, next);
      std::push_heap(ends.begin(), ends.end(), later);
      if (in[next].counted) counts[static_cast<size_t>(in[next].family)] += 1;
      ++next;
    } else {
      std::pop_heap(ends.begin(), ends.end(), later);
      const auto [e, i] = ends.back();
      ends.pop_back();
      credit(e);
      open.erase({in[i].family == Family::kCommunication ? 1 : 0, i});
    }
  }
  if (end > now) gap(end - now);  // after the last interval
  for (size_t f = 0; f < seconds.size(); ++f)
    if (counts[f] > 0 || seconds[f] > 0) t.rows.push_back({static_cast<Family>(f), seconds[f], counts[f], copy_seconds[f]});
  t.idle_seconds = static_cast<double>((end - begin) - busy) * 1e-9;
  t.top = costliest(in, credited, top);
  return t;
}

std::string format(const Table& t) {
  std::ostringstream o;
  const double steps = static_cast<double>(std::max<int64_t>(t.steps, 1));
  const double step_ms = 1e3 * t.window_seconds / steps;
  char line[256];
  o << "profile: " << t.steps << " step(s) on " << t.device << ", " << t.clock << " time; " << std::fixed;
  o.precision(2);
  o << step_ms << " ms a step\n";
  std::snprintf(line, sizeof line, "%-26s %10s %7s %9s %12s\n", "family", "ms/step", "share", "count/step",
                "fill+copy ms");
  o << line;
  auto share = [&](double s) { return t.window_seconds > 0 ? 100.0 * s / t.window_seconds : 0.0; };
  double sum = 0;
  for (const Row& r : t.rows) {
    sum += r.seconds;
    std::snprintf(line, sizeof line, "%-26s %10.3f %6.1f%% %10.1f %12.3f\n", family_name(r.family),
                  1e3 * r.seconds / steps, share(r.seconds), static_cast<double>(r.count) / steps,
                  1e3 * r.copy_seconds / steps);
    o << line;
  }
  const char* idle = t.clock == "host" ? "outside ops (host)" : "idle (GPU waiting)";
  std::snprintf(line, sizeof line, "%-26s %10.3f %6.1f%%\n", idle, 1e3 * t.idle_seconds / steps, share(t.idle_seconds));
  o << line;
  std::snprintf(line, sizeof line, "%-26s %10.3f %6.1f%%\n", "step (sum of the above)", 1e3 * (sum + t.idle_seconds) / steps,
                share(sum + t.idle_seconds));
  o << line;
  if (t.clock != "host") {  // (on the CPU the rest of the window is the trainer's work, not gaps)
    std::snprintf(line, sizeof line, "idle gaps a step: %.1f under %.0f us (%.3f ms), %.1f longer (%.3f ms)\n",
                  static_cast<double>(t.short_gaps) / steps, kShortGapSeconds * 1e6, 1e3 * t.short_gap_seconds / steps,
                  static_cast<double>(t.long_gaps) / steps, 1e3 * t.long_gap_seconds / steps);
    o << line;
  }
  if (!t.top.empty()) {
    o << (t.clock == "host" ? "costliest ops:\n" : "costliest kernels:\n");
    for (const TopEntry& e : t.top) {
      std::string name = e.name.size() > 70 ? e.name.substr(0, 67) + "..." : e.name;
      std::snprintf(line, sizeof line, "  %10.3f ms/step %6.1f%%  %-20s %s\n", 1e3 * e.seconds / steps, share(e.seconds),
                    family_name(e.family), name.c_str());
      o << line;
    }
  }
  if (t.dropped > 0) o << "warning: CUPTI dropped " << t.dropped << " activity records; the table is incomplete\n";
  return o.str();
}

Recorder::Recorder(Device d) : device_(d) {
  check(!g_active.exchange(true), "profile: a profile is already being recorded in this process");
  try {
    runtime::synchronize(d);
    if (d.is_cuda()) {
      MB_CUDA(cuda_profile::start());
      MB_CUDA(begin_ = cuda_profile::timestamp());
      g_mode = Mode::kGpu;
    } else {
      {
        std::lock_guard<std::mutex> lock(g_host_mu);
        g_host.clear();
      }
      begin_ = host_now();
      t_last = begin_;
      g_mode = Mode::kHost;
    }
  } catch (...) {
    g_active = false;
    throw;
  }
  running_ = true;
}

Recorder::~Recorder() {
  if (!running_) return;
  try {
    stop(1);
  } catch (...) {  // a destructor reports nothing; stop() would have
  }
}

Table Recorder::stop(int64_t steps) {
  check(running_, "profile: this recorder has already stopped");
  running_ = false;
  runtime::synchronize(device_);
  const Mode mode = g_mode.exchange(Mode::kOff);
  g_active = false;
  std::vector<Interval> intervals;
  uint64_t end = 0, dropped = 0;
  if (mode == Mode::kGpu) {
    MB_CUDA(end = cuda_profile::timestamp());
#if MEGABATCH_WITH_CUDA
    cuda_profile::Collected c = cuda_profile::stop();
    dropped = c.dropped;
    intervals.reserve(c.activities.size());
    for (auto& a : c.activities) {
      const auto it = c.external.find(a.correlation);
      const uint64_t f = it == c.external.end() ? 0 : it->second - 1;
      intervals.push_back({a.begin, a.end, f < static_cast<uint64_t>(Family::kCount) ? static_cast<Family>(f) : Family::kOther,
                           a.copy, std::move(a.name)});
    }
#endif
  } else {
    end = host_now();
    std::lock_guard<std::mutex> lock(g_host_mu);
    intervals.swap(g_host);
  }
  Table t = attribute(std::move(intervals), begin_, end, steps);
  t.clock = mode == Mode::kGpu ? "GPU (CUPTI)" : "host";
  t.device = device_.is_cuda() ? runtime::gpu_info(device_.index).name : "cpu";
  t.dropped = dropped;
  return t;
}

}  // namespace megabatch::profile
