// Where a training step's time goes, by op family: the table `gpu_train_bench --profile`
// and `train --profile-steps N` print.
//
// What issues work marks it. Every op marks itself through its dispatch (MB_OP_DISPATCH,
// core/ops/check.h) with its family (family_of_op); a part of the step that owns a whole
// stretch of it opens a Region (the LM head and its loss, the optimizer's chores and step,
// each collective). The innermost Region names everything issued inside it; an op inside
// another op, or inside a Region, takes the family already open. A Recorder collects what
// ran between its construction and stop():
// - on a GPU, every kernel, memset and memcpy of the process, from CUPTI's activity
//   records (start and end on the GPU's clock), each tied to the family open when the host
//   issued it through CUPTI's external correlation ids. Where two overlap (a collective on
//   another stream under a GEMM) the time counts once, for the compute family; time in the
//   window when nothing ran is "idle": the GPU waiting for the host.
// - on the CPU, the host time spent inside each family; the rest of the window (the
//   trainer's own work, reading data) is "outside ops".
// Either way the rows and the idle row add up to the window. Without a Recorder a mark
// costs one relaxed atomic load.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/device/device.h"

namespace megabatch::profile {

enum class Family : uint8_t {
  kOther = 0,          // issued outside every mark (fills, copies, the trainer's own kernels)
  kAttentionForward,   // attention (self, cross, relative position bias), forward
  kAttentionBackward,  // and backward
  kGemm,               // linear layers (GEMMs with their bias)
  kLmHeadLoss,         // the LM head's GEMMs and its cross entropy, forward and backward
  kNorm,               // LayerNorm / RMSNorm
  kElementwise,        // activations, residual adds, dropout, casts, scales, fills
  kEmbedding,          // embedding lookups and their gradients
  kOptimizer,          // unscale, overflow check, clip, the plugin's step, the loss scaler
  kCommunication,      // collectives
  kCount
};
const char* family_name(Family f);
// The family of an op, by its name in core/ops/backend_ops.inc ("attention_forward").
Family family_of_op(std::string_view op);

// Whether a Recorder is running (in this process).
bool active();

namespace detail {
void enter(Family f, bool region, const char* name);
void leave();
}  // namespace detail

// Everything issued while it is open belongs to `f` (the innermost Region wins).
class Region {
 public:
  explicit Region(Family f) : on_(active()) {
    if (on_) detail::enter(f, true, family_name(f));
  }
  ~Region() {
    if (on_) detail::leave();
  }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

 private:
  bool on_;
};

// Marks one op call (`op`: a string literal, its backend entry point's name).
class OpMark {
 public:
  explicit OpMark(const char* op) : on_(active()) {
    if (on_) detail::enter(family_of_op(op), false, op);
  }
  ~OpMark() {
    if (on_) detail::leave();
  }
  OpMark(const OpMark&) = delete;
  OpMark& operator=(const OpMark&) = delete;

 private:
  bool on_;
};

// One stretch of device (or host) work: [begin, end) in nanoseconds on one clock.
struct Interval {
  uint64_t begin = 0, end = 0;
  Family family = Family::kOther;
  bool copy = false;  // a memset or memcpy (zero-fills show here)
  std::string name;   // the kernel (or op)
  bool counted = true;  // false: the rest of a host mark after one nested in it (not another call)
};

struct Row {
  Family family = Family::kOther;
  double seconds = 0;       // over the whole window (all steps)
  int64_t count = 0;        // kernels, memsets and memcpys (on the CPU: op calls)
  double copy_seconds = 0;  // of which memsets and memcpys
};
struct TopEntry {
  std::string name;
  Family family = Family::kOther;
  double seconds = 0;
  int64_t count = 0;
};
struct Table {
  std::string clock;  // "GPU (CUPTI)" or "host"
  std::string device;
  int64_t steps = 0;
  double window_seconds = 0;
  double idle_seconds = 0;      // the window less every row
  // The idle time as stretches with nothing running: those under kShortGapSeconds are the
  // gaps between one launch and the next (what a CUDA graph of the step could shrink), the
  // others the device waiting on the host's own work.
  int64_t short_gaps = 0, long_gaps = 0;
  double short_gap_seconds = 0, long_gap_seconds = 0;
  std::vector<Row> rows;        // every family that ran, in enum order
  std::vector<TopEntry> top;    // the costliest kernels (ops on the CPU), costliest first
  uint64_t dropped = 0;         // activity records CUPTI dropped (the table is then incomplete)
};

inline constexpr double kShortGapSeconds = 10e-6;

// The table of `intervals` over the window [begin, end): each nanosecond of the window
// counts once, for the interval that covers it (a non-communication interval before a
// communication one, then the one that began first), or as idle. Intervals are clipped
// to the window. `top` keeps that many kernels by the time they were counted for.
Table attribute(std::vector<Interval> intervals, uint64_t begin, uint64_t end, int64_t steps, size_t top = 10);

// The table as text: a row per family with ms per step, share of the step, count per step
// and the memset/memcpy part, the idle row, the total, the idle gaps by length; then the
// costliest kernels.
std::string format(const Table& t);

// Records what ran on device `d` from construction to stop(). One at a time in a process
// (a second is an Error). Synchronizes the device at both ends.
class Recorder {
 public:
  explicit Recorder(Device d);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;
  // The table of the window, `steps` training steps long.
  Table stop(int64_t steps);

 private:
  Device device_;
  uint64_t begin_ = 0;
  bool running_ = false;
};

}  // namespace megabatch::profile
