// Running a sweep's points locally (`sweep run`) and resuming: the checks before
// (sweeps/preflight.h), then the scheduler (sweeps/scheduler.h). What it keeps on disk is in
// sweeps/run_dir.h and sweeps/sweep_state.h; the table it shows in sweeps/table.h; `sweep
// status` and `sweep prune` in sweeps/status.h; handing points to launchers that run them
// elsewhere in sweeps/handoff.h.
//
// Each point is a `train` process started with --config point.json --run-dir <id>
// --save/--load <id>/checkpoints, so an interrupted point resumes from its last
// checkpoint; a point of TP x DP > 1 ranks is started by mpirun -np TP x DP. With --gpus,
// each point runs on GPUs of its own (CUDA_VISIBLE_DEVICES), as many as it has ranks. A
// point whose configuration changed since it ran is refused unless rerun_changed is set
// (then its directory is cleared).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "sweeps/sweep.h"

namespace megabatch::sweeps {

struct RunOptions {
  std::filesystem::path runs_dir = "runs";
  std::filesystem::path train_binary;  // the train program
  int jobs = 0;                        // concurrent points (0: from the file, else cores / threads)
  int threads = 0;                     // threads per point (0: from the file or base, else 1)
  int retries = 0;                     // extra attempts for failed points
  std::string only;                    // run points whose id matches this glob (or contains it)
  bool dry_run = false;
  bool rerun_changed = false;          // discard and rerun points whose configuration changed
  bool rerun_diverged = false;         // discard and rerun points that diverged (else they are results)
  bool rerun_damaged = false;          // discard and rerun finished points whose metrics.h5 does not read
  bool tty = false;                    // redraw a live table instead of printing lines
  std::vector<int> gpus;               // --gpus: the GPUs points are placed on (sweeps/placement.h); empty: none
  std::string mpirun = "mpirun";       // starts a point of more than one rank (TP x DP > 1)
  int ranks = 0;                       // > 0: every point under `mpirun -np ranks` (DP = ranks / TP), whatever
                                       // its TP x DP says (launchers/ec2/launch.sh --sweep: the whole cluster)
  std::string launcher;  // the command that ran this sweep run, where a launcher did ($MEGABATCH_SWEEP_COMMAND, set
                         // by launch.sh --sweep), ending in sweep run's options: what runs the sweep again
};

// Runs the sweep; returns the process exit status (0: every selected point done or
// diverged — a diverged point, train's exit status 4, is a result and is not retried unless
// rerun_diverged; 1: some failed, or a finished point's metrics.h5 does not read and
// rerun_damaged is not set; 130: interrupted by SIGINT or SIGTERM, every point left resumable).
int run_sweep(const Sweep& sweep, const RunOptions& options);

}  // namespace megabatch::sweeps
