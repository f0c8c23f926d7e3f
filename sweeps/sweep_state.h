// What the sweep tool writes for a sweep's points to run from: each point's point.json
// (its train configuration, with the sweep's checkpoint schedule) and runs/<name>/sweep.json
// (the expanded sweep and each point's state), as `sweep run` and `sweep export-points`
// write them alike. Read back by sweeps/run_dir.h.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "core/train/batch_rampup.h"
#include "sweeps/sweep.h"
#include "sweeps/table.h"

namespace megabatch::sweeps {

// A configuration's rampup_batch_size as three integers (nullopt: none, or not three integers,
// which train --check refuses).
std::optional<train::BatchRampup> rampup_of(const nlohmann::json& config);

// A configuration's global batch size (the final one of a ramp), with train's defaults.
int64_t global_batch_of(const nlohmann::json& config);

// A configuration's iterations (train_iters, or train_samples in global batches, a ramp's as
// train counts them).
int64_t iters_of(const nlohmann::json& config);

// The samples a configuration's run trains on: its iterations x global batch, or what a
// ramp's iterations take.
int64_t samples_of(const nlohmann::json& config);

// The configuration a point's train runs with, its point.json whatever launches it (sweep
// run, a Slurm array task, an EKS job): the point's own, with the sweep's checkpoint schedule
// where the point sets none: a checkpoint every tenth of its iterations, the newest two kept
// while it runs. A point killed outright (a node lost) then loses at most a tenth of its work.
nlohmann::json launch_config(const Point& point);

// runs/<name>/sweep.json's content: the sweep and each point's state; where a launcher ran it
// (RunOptions::launcher), that command and the directory it ran in.
nlohmann::json state_json(const std::vector<PointState>& points, const Sweep& sweep, const std::string& launcher = "");

// The command that runs a sweep again with `options` ("--rerun damaged"): the `launcher`'s that
// ran it (RunOptions::launcher, as state_json records it), with "cd CWD && " before it where it
// ran in another directory than the current one; sweep run where none did.
std::string run_again(const std::string& launcher, const std::string& cwd, const std::string& options);

}  // namespace megabatch::sweeps
