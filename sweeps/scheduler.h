// `sweep run`'s scheduler: runs the points as train processes, `jobs` at a time (with
// --gpus, each on GPUs of its own), retrying failed ones, until every one has ended or a
// stop signal (SIGINT, SIGTERM) has made them checkpoint and exit; keeps
// runs/<name>/sweep.json and the table current.
#pragma once

#include <filesystem>
#include <vector>

#include "sweeps/runner.h"
#include "sweeps/sweep.h"
#include "sweeps/table.h"

namespace megabatch::sweeps {

// Returns run_sweep's exit status (runner.h).
int run_points(const Sweep& sweep, const RunOptions& options, const std::filesystem::path& root,
               std::vector<PointState>& points);

}  // namespace megabatch::sweeps
