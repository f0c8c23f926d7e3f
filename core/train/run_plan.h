// What a run is about to do, said before its first iteration: the model, the optimizer, the
// data and its split, the batch and parallel layout, the schedule, where metrics go and when
// the run counts as diverged (or, evaluating only, its batches and where the results go).
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>

#include "core/train/train_options.h"

namespace megabatch::train {

struct RunPlan {
  std::string model;      // the model's one-line summary
  std::string optimizer;  // plugin, version, file and hyperparameters
  std::string data;       // the dataset, its split and samples per epoch
  int64_t tp_size = 1, dp_size = 1, world_size = 1;
  int threads = 1;
  std::filesystem::path metrics;
  bool evaluation_only = false;  // --skip-train: the batches evaluated, not the training
};

void print_plan(const RunPlan& plan, const TrainOptions& options, std::ostream& console);

}  // namespace megabatch::train
