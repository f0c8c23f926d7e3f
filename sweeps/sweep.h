// Sweep files and their expansion into points.
//
//   {
//     "name": "lamb_bsz",
//     "include": "base.json",                  // optional: another sweep file this one overrides
//     "base": { ...train --config keys... },   // every point's configuration, before the axes
//     "grid": {"optimizer": ["lamb", "adamw"]},           // cartesian product
//     "zip": [{"global_batch_size": [8, 16], "lr_warmup_iters": [10, 5]}],  // lists varying together
//     "random": {"count": 8, "seed": 0,                  // drawn values, reproducible by seed
//                "params": {"lr": {"log_uniform": [1e-4, 1e-2]}, "weight_decay": {"uniform": [0, 0.1]}}},
//     "seeds": [1, 2],
//     "derive": {"lr_scaling": {"rule": "sqrt", "ref_batch": 8},  // lr = lr x (B / ref)^k
//                "sample_budget": 2560},           // train_iters = budget / B (train_samples where the
//                                                  // batch ramps or the schedule counts samples)
//     "jobs": 2, "threads": 1,                 // optional: concurrent points, threads per point
//     "checkpoints": "final",                  // optional: a finished point keeps its final checkpoint
//                                              // ("final", the default), "all" it wrote (the last two) or "none"
//     "cluster": {"instance_type": "p4d.24xlarge", "nodes": 2}   // what a full-scale sweep was sized for
//   }
//
// Points are the product of the grid, the zip groups, the random draws (one axis of
// `count` assignments) and the seeds, in file order. Each
// point's id is built from its swept values (optimizer, bs<global batch>, the other grid
// keys and the first key of each zip group by their initials, lr<value> when the learning
// rate is swept or derived, s<seed>), e.g.
// lamb-bs4096-lr0.0283-s1: readable and deterministic, so re-running a sweep finds its
// points again (sweeps/point_id.h). An id is a file name of its own (safe_point_id): a string value with
// slashes (a data path) contributes its last component (a pretrained_checkpoint, from-<the
// run whose checkpoints/ it names; a list, such as a blend, its items joined by '+'), and
// nothing but letters, digits and '-', '_', '.', '+' reaches the file system (no separators, no '..', no leading dot,
// at most 120 characters). Objects of an included file are merged key by key (the including file
// wins); arrays and scalars are replaced. A null unsets its key, as in a JSON merge patch:
// `"base": {"weight_decay": null}` over an included base, or a null in one entry of an axis
// (`"weight_decay": [0.01, null]` zipped with the optimizers), leaves that option at train's
// default for the points it reaches; `"grid": null` drops an included file's grid.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace megabatch::sweeps {

struct Point {
  std::string id;
  nlohmann::json config;                 // the train configuration of this point
  std::vector<std::string> swept;        // the keys whose values vary across the sweep
};

struct Sweep {
  std::string name;
  std::filesystem::path file;
  nlohmann::ordered_json spec;           // the file after includes
  std::vector<Point> points;
  int jobs = 0, threads = 0;             // 0: decided by the runner
  std::string checkpoints = "final";     // what a finished point keeps: final, all (its last two) or none
};

// A sweep of more points than this is refused unless the limit is raised (--max-points).
inline constexpr size_t kDefaultMaxPoints = 10000;

// Loads, merges includes, expands and validates every point against train's options.
// Errors name the file and key, or the point id and the failing key; a sweep of more than
// max_points points is refused before it is expanded. "{runs_dir}" in a string value is the
// directory the sweep's runs go to (sweep run --runs-dir), as in a pretrained_checkpoint of an
// earlier sweep's point: "{runs_dir}/first/lamb-bs8-s1/checkpoints".
Sweep load_sweep(const std::filesystem::path& file, size_t max_points = kDefaultMaxPoints,
                 const std::string& runs_dir = "runs");

// Where points log the gradient noise scale at several global batch sizes and none says how
// to average it (noise_scale_window or noise_scale_ema), a note for the console: train's
// default decay a step (0.99) remembers 100 steps, so more samples at a larger batch, and B_simple
// at the same loss is not averaged alike; "noise_scale_window" = the largest batch would.
// Otherwise "".
std::string noise_scale_note(const Sweep& sweep);

}  // namespace megabatch::sweeps
