#include "core/train/run_directory.h"

#include "core/io/checkpoint.h"
#include "core/util/files.h"

namespace megabatch::train {

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
