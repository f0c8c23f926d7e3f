// A run's directory while `train` runs in it: RUN_DIR/config.json (the fully resolved
// configuration), RUN_DIR/DIVERGED when the run diverged, and the locks that refuse a second
// run writing the same --run-dir or --save. Held by the rank that logs, for the whole run.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/util/dir_lock.h"

namespace megabatch::train {

class RunDirectory {
 public:
  // Takes the locks (an error naming the running holder), forgets an earlier attempt's
  // DIVERGED, writes config.json and removes unfinished checkpoints from `save_dir` (empty:
  // none). An evaluation (`resolved` says skip_train) is refused the directory of a run that
  // trained, whose config.json and metrics.h5 it would replace. `fresh`: this run writes a new
  // metrics.h5 (it does not resume); an earlier run's rows there are not lost: its config.json,
  // metrics.h5 and DIVERGED move to run_dir/earlier/N first, and earlier() says so. `start`: the
  // iteration this run starts at (nullopt: it saves nothing, an evaluation). The checkpoints of
  // `save_dir` past it are another trajectory's: they move to save_dir/earlier/N
  // (io::set_aside_later_checkpoints), and a resumed run's metrics.h5, whose rows past `start`
  // it drops, is copied to run_dir/earlier/N first; earlier() says so.
  RunDirectory(std::filesystem::path run_dir, const std::filesystem::path& save_dir, const nlohmann::json& resolved,
               bool fresh, std::optional<int64_t> start);
  const std::filesystem::path& path() const { return dir_; }
  // where an earlier run's metrics and checkpoints went, or ""
  const std::string& earlier() const { return earlier_; }
  std::filesystem::path metrics_path() const { return dir_ / "metrics.h5"; }
  // RUN_DIR/DIVERGED: when, why, and the thresholds that decided it (read by `sweep`).
  void write_diverged(int64_t iteration, const std::string& reason, double divergence_loss,
                      int64_t divergence_intervals) const;

 private:
  std::filesystem::path dir_;
  std::string earlier_;
  std::optional<DirLock> run_lock_, save_lock_;
};

}  // namespace megabatch::train
