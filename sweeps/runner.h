// Running a sweep's points locally (`sweep run`), resuming, and exporting them for
// launchers that run them elsewhere. What it keeps on disk is in sweeps/run_dir.h; the
// table it shows in sweeps/table.h; `sweep status` and `sweep prune` in sweeps/status.h.
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
  bool tty = false;                    // redraw a live table instead of printing lines
  std::vector<int> gpus;               // --gpus: the GPUs points are placed on (sweeps/placement.h); empty: none
  std::string mpirun = "mpirun";       // starts a point of more than one rank (TP x DP > 1)
  int ranks = 0;                       // > 0: every point under `mpirun -np ranks` (DP = ranks / TP), whatever
                                       // its TP x DP says (launchers/ec2/launch.sh --sweep: the whole cluster)
};

// Runs the sweep; returns the process exit status (0: every selected point done or
// diverged — a diverged point, train's exit status 4, is a result and is not retried unless
// rerun_diverged; 1: some failed; 130: interrupted by SIGINT or SIGTERM, every point left resumable).
int run_sweep(const Sweep& sweep, const RunOptions& options);

// Writes runs/<name>/points.txt (one id per line, in order), each point's point.json (as
// sweep run would start it: its checkpoint schedule included) and the sweep's state,
// sweep.json, for launchers that run points elsewhere (a Slurm job array task runs line
// i+1); status, plot and report then read the sweep as one sweep run ran. Points that
// already ran with another configuration are refused as in run_sweep, naming the keys.
// `ranks` > 0: the processes of the job each point will run as (a Slurm array task's nodes x
// tasks per node); points whose layout does not fit it (layout_problem) are refused, named,
// before anything is written.
int export_points(const Sweep& sweep, const std::filesystem::path& runs_dir, int ranks, bool dry_run = false);

// What the sweep file's "cluster" names, for launchers/slurm/submit.sh to size its jobs by:
// "NODES GPUS_PER_NODE INSTANCE_TYPE" on one line; nothing when it names no cluster. An
// error names a field of another type.
int print_cluster(const Sweep& sweep);

// What sweep run does when a point's train ends, for a launcher that ran the point of an
// exported sweep (runs/<name>/<id>), by train's `exit_status` (as a shell gives it): 0, its
// checkpoints pruned as the sweep's "checkpoints" says, then DONE written (refused where the
// log has not reached the last iteration); 4 (diverged) and 3 (stopped at a checkpoint),
// said; any other, FAILED written with the reason, which is printed with the log's last
// lines, and 1 returned. `wall_s`: the point's wall time as its launcher measured it (0:
// unknown), kept in DONE.
int finish_point(const std::filesystem::path& point_dir, int exit_status, double wall_s);

}  // namespace megabatch::sweeps
