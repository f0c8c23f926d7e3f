// Running a sweep's points locally, resuming, and reporting status.
//
//   runs/<name>/sweep.json          the expanded sweep and each point's state
//   runs/<name>/<id>/point.json     the point's train configuration (its input)
//   runs/<name>/<id>/config.json    train's resolved configuration
//   runs/<name>/<id>/metrics.h5, checkpoints/, stdout.log, DONE
//
// Each point is a `train` process started with --config point.json --run-dir <id>
// --save/--load <id>/checkpoints, so an interrupted point resumes from its last
// checkpoint; a point of TP x DP > 1 ranks is started by mpirun -np TP x DP. With --gpus,
// each point runs on GPUs of its own (CUDA_VISIBLE_DEVICES), as many as it has ranks. A point whose configuration changed since it ran is refused unless
// rerun_changed is set (then its directory is cleared).
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
  bool tty = false;                    // redraw a live table instead of printing lines
  std::vector<int> gpus;               // --gpus: the GPUs points are placed on (sweeps/placement.h); empty: none
  std::string mpirun = "mpirun";       // starts a point of more than one rank (TP x DP > 1)
};

// Runs the sweep; returns the process exit status (0: every selected point done or
// diverged — a diverged point, train's exit status 4, is a result and is not retried unless
// rerun_diverged; 1: some failed; 130: interrupted by SIGINT or SIGTERM, every point left resumable).
int run_sweep(const Sweep& sweep, const RunOptions& options);

// Writes runs/<name>/points.txt (one id per line, in order) and each point's point.json,
// for launchers that run points elsewhere (a Slurm job array task runs line i+1). Points
// that already ran with another configuration are refused as in run_sweep.
int export_points(const Sweep& sweep, const std::filesystem::path& runs_dir);

// What a finished point keeps of its checkpoints directory: "final" (the newest
// iter_*.h5), "all" or "none"; returns the bytes freed. Only regular iter_*.h5 files in
// that directory are removed.
int64_t prune_checkpoints(const std::filesystem::path& dir, const std::string& keep);

// sweep prune: every finished (done or diverged) point of runs/<name> keeps only its
// final checkpoint; prints what was freed.
int prune_sweep(const std::filesystem::path& sweep_dir);

// Prints the status table of runs/<name> (the directory sweep run wrote) and the disk it uses.
int print_status(const std::filesystem::path& sweep_dir);

}  // namespace megabatch::sweeps
