#include "core/train/run_directory.h"

#include "core/io/checkpoint.h"
#include "core/util/error.h"
#include "core/util/files.h"

namespace megabatch::train {

namespace {
// An evaluation (--skip-train) writes config.json and a new metrics.h5: in the directory of a
// run that trained (train's default --run-dir is one), it would replace that run's.
void refuse_a_training_runs(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir / "metrics.h5")) return;
  bool evaluation = false;
  try {
    evaluation = nlohmann::json::parse(read_file(dir / "config.json")).value("skip_train", false);
  } catch (const std::exception&) {  // no config.json, or not one of ours: not an evaluation's
  }
  check(evaluation, dir.string(),
        " holds the metrics.h5 and config.json of a run that trained, which this evaluation "
        "(--skip-train) would replace; give the evaluation a --run-dir of its own (e.g. ",
        dir.string(), "-eval)");
}
}  // namespace

RunDirectory::RunDirectory(std::filesystem::path run_dir, const std::filesystem::path& save_dir,
                           const nlohmann::json& resolved)
    : dir_(std::move(run_dir)) {
  run_lock_.emplace(dir_, "train",
                    "two runs writing one directory would mix their logs and metrics; wait for it to end, or give "
                    "this run another --run-dir");
  std::error_code ec;
  if (!save_dir.empty() && !std::filesystem::equivalent(save_dir, dir_, ec))
    save_lock_.emplace(save_dir, "train",
                       "two runs saving into one directory would overwrite each other's checkpoints and resume "
                       "from the other's; wait for it to end, or give this run another --save");
  if (resolved.value("skip_train", false)) refuse_a_training_runs(dir_);
  std::filesystem::remove(dir_ / "DIVERGED");  // this attempt decides afresh
  write_file_atomic(dir_ / "config.json", resolved.dump(2) + "\n");
  if (!save_dir.empty()) io::remove_unfinished_checkpoints(save_dir);
}

void RunDirectory::write_diverged(int64_t iteration, const std::string& reason, double divergence_loss,
                                  int64_t divergence_intervals) const {
  write_file_atomic(dir_ / "DIVERGED", nlohmann::json({{"iteration", iteration},
                                                      {"reason", reason},
                                                      {"divergence_loss", divergence_loss},
                                                      {"divergence_intervals", divergence_intervals}})
                                               .dump() +
                                           "\n");
}

}  // namespace megabatch::train
