// What Slurm's queue says of the points of an exported sweep that launchers/slurm/submit.sh
// submitted: a job array run in the sweep's directory, task i running line i+1 of
// points.txt. sweep status uses it to tell a point that runs or waits in the queue from one
// that has stopped (scancel, a lost node) and resumes only when the sweep is submitted again.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "sweeps/point_status.h"

namespace megabatch::sweeps {

struct QueuedTask {
  PointStatus state;  // running (RUNNING, COMPLETING) or queued (any other state squeue lists)
  std::string job;    // "123_4"
};

// The array tasks in `squeue -h -o "%i|%Z|%T"` output whose working directory is `dir`, by
// array index; a pending range ("123_[2-5,7%4]") gives each of its indices.
std::map<int, QueuedTask> parse_queue(std::string_view squeue_output, const std::filesystem::path& dir);

// squeue of this user's jobs, parsed for `dir`; none where there is no squeue or it fails
// (no Slurm on this machine, its controller down).
std::optional<std::map<int, QueuedTask>> slurm_queue(const std::filesystem::path& dir);

}  // namespace megabatch::sweeps
