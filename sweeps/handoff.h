// Handing a sweep's points to launchers that run them elsewhere (launchers/slurm, eks,
// ec2): the points and their configurations written for them, the cluster a sweep was sized
// for, and the end of a point a launcher ran, recorded as `sweep run` records it.
#pragma once

#include <filesystem>

#include "sweeps/runner.h"
#include "sweeps/sweep.h"

namespace megabatch::sweeps {

// Writes runs/<name>/points.txt (one id per line, in order), each point's point.json (as
// sweep run would start it: its checkpoint schedule included) and the sweep's state,
// sweep.json, for launchers that run points elsewhere (a Slurm job array task runs line
// i+1); status, plot and report then read the sweep as one sweep run ran. As in run_sweep,
// points that already ran with another configuration are refused, naming the keys, and the
// points --rerun marks (changed, diverged, damaged) are discarded, so that their tasks run
// them afresh; a finished point whose result is lost is named. Of `o`: runs_dir, dry_run
// (check and say, write nothing), the rerun flags, and ranks: > 0, the processes of the job
// each point will run as (a Slurm array task's nodes x tasks per node), where points whose
// layout does not fit (layout_problem) are refused, named, before anything is written.
int export_points(const Sweep& sweep, const RunOptions& o);

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
