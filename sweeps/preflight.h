// Before a sweep's points run (`sweep run`, `sweep export-points`): their states as
// runs/<name> has them, the refusals (a point whose configuration changed, a point that does
// not fit the job or the GPUs), --rerun's discards, and --dry-run's listing with each point
// checked by train --check.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "sweeps/runner.h"
#include "sweeps/sweep.h"
#include "sweeps/table.h"

namespace megabatch::sweeps {

// The cluster a sweep file says it was sized for ("cluster": instance_type, nodes,
// gpus_per_node), its fields checked; none when the file names none.
struct Cluster {
  int64_t nodes = 0, gpus_per_node = 0;
  std::string instance_type;
  int ranks() const { return static_cast<int>(nodes * gpus_per_node); }
};
std::optional<Cluster> sweep_cluster(const Sweep& sweep);

// Refuses the points that cannot run as a job of `ranks` ranks (layout_problem), naming
// three and counting the rest (most misfits of one sweep share their reason); `how` says
// where the job size came from.
void check_layouts(const Sweep& sweep, const std::vector<const Point*>& points, int ranks, const std::string& how);

// The sweep's points as runs/<name> has them: finished, diverged, partly run or not yet,
// with the wall time of earlier invocations; points --only leaves out are "skipped". Points
// whose configuration changed since they ran are refused unless --rerun (then marked to be
// discarded), as is a point needing more GPUs than --gpus gives; nothing is deleted here.
// `remedy` ends the refusal of changed points.
std::vector<PointState> point_states(const Sweep& sweep, const RunOptions& o, const std::filesystem::path& root,
                                     const std::string& remedy);

// --rerun changed, diverged or damaged: the marked points' directories go, each said, and
// they run afresh; under --dry-run only says so. Warns where --rerun found nothing to
// discard, and names each finished point whose result is lost and is kept as it is.
void discard_rerun_points(std::vector<PointState>& ps, const std::filesystem::path& root, const RunOptions& o);

// --dry-run: lists the points with their swept values and checks each that has still to
// run with train --check; 2 when one cannot run.
int dry_run(const Sweep& sweep, const RunOptions& o, const std::filesystem::path& root, const std::vector<PointState>& ps);

}  // namespace megabatch::sweeps
