// A sweep's points as the sweep tool tracks them, and the table that shows them: the live
// table of `sweep run` (redrawn, cut to the terminal's width) and `sweep status`.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "sweeps/point_status.h"
#include "sweeps/run_dir.h"
#include "sweeps/sweep.h"

namespace megabatch::sweeps {

struct PointState {
  const Point* point = nullptr;
  std::filesystem::path dir;
  PointStatus state = PointStatus::kPending;
  std::string reason;
  std::string discard;  // why --rerun discards the point's directory ("": kept)
  std::string damaged;  // a finished point whose metrics.h5 does not read: why (unreadable_result)
  int attempts = 0;
  double wall_s = 0;  // over every attempt and invocation
  int64_t train_iters = 0, global_batch = 0;
  int64_t samples = 0;  // what it trains on (samples_of): its work, for the ETA
  pid_t pid = -1;
  std::chrono::steady_clock::time_point started;
  Progress progress;
  int ranks = 1;          // processes (and with --gpus, GPUs) the point needs
  std::vector<int> gpus;  // the GPUs it holds while running
  std::string slurm_job;  // sweep status of an exported sweep: the array task running or queued for it
  bool stopping = false;  // the sweep has asked this attempt to stop (Ctrl-C, SIGTERM)
};

// A point's end as its directory records it: DONE (done), DIVERGED (diverged, with the
// reason) or FAILED (failed under an exported sweep's launcher, with the reason); otherwise
// the state is left as it is.
void read_finished_state(PointState& p);

// Why a finished (done or diverged) point's result is lost: its metrics.h5 is missing or does
// not read (damaged or cut short after the point finished); "" where it reads, and for a
// point that has not finished.
std::string unreadable_result(const PointState& p);

// Samples of a point's work that are behind it: all of them once it is done or diverged
// (a diverged point stops early: nothing of it is left to do).
int64_t work_of(const PointState& p);

// "4m05s", "1h02m"; "-" when unknown (negative or not finite).
std::string fmt_duration(double seconds);

// The table: a summary line, then a line per point that is not skipped. elapsed >= 0: the
// live table, with `eta` (< 0: unknown); elapsed < 0: a status report, where `eta` holds the
// points' total wall time instead. `rerun_damaged`: what runs the points whose result is lost
// again, as the summary names it (an exported sweep's launcher, the command that ran the sweep).
std::vector<std::string> table_lines(const std::vector<PointState>& ps, double elapsed, double eta,
                                     const std::string& rerun_damaged);

// Columns of the terminal on stdout (80 when unknown).
size_t terminal_width();

// A line of the live table cut to `width` columns (a redrawn line that wraps would break
// the redraw): the end becomes "..." when cut. UTF-8 continuation bytes take no column.
std::string fit_width(const std::string& line, size_t width);

}  // namespace megabatch::sweeps
