#include "core/train/run_directory.h"

#include <map>
#include <vector>

#include "core/io/checkpoint.h"
#include "core/io/metrics.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/numbers.h"
#include "core/util/strings.h"

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

// What `dir`'s metrics.h5 holds rows of ("iterations 1 to 40", "an evaluation at iteration 4"),
// "" when it holds none (a run that ended before its first row) or is missing.
std::string rows_held(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / "metrics.h5";
  if (!std::filesystem::exists(file)) return "";
  std::map<std::string, std::vector<double>> series;
  try {
    series = io::read_metric_series(file);
  } catch (const std::exception&) {
    return "a metrics.h5 this build cannot read";
  }
  auto span = [](const std::vector<double>& its) {
    return its.size() == 1 ? "iteration " + shortest(its.front())
                           : "iterations " + shortest(its.front()) + " to " + shortest(its.back());
  };
  if (auto t = series.find("train/iteration"); t != series.end() && !t->second.empty()) return span(t->second);
  for (const char* group : {"validation/iteration", "test/iteration"})
    if (auto e = series.find(group); e != series.end() && !e->second.empty())
      return "an evaluation at " + span(e->second);
  return "";
}

// Moves (or, `copy`, copies) `dir`'s config.json, metrics.h5 and DIVERGED into dir/earlier/N
// (the first N free); returns that directory. config.json goes first: interrupted, the next
// start moves the rest.
std::filesystem::path keep_earlier_run(const std::filesystem::path& dir, bool copy = false) {
  namespace fs = std::filesystem;
  const fs::path kept = first_free_numbered(dir / "earlier");
  fs::create_directories(kept);
  for (const char* name : {"config.json", "metrics.h5", "DIVERGED"})
    if (fs::exists(dir / name))
      copy ? (void)fs::copy_file(dir / name, kept / name) : fs::rename(dir / name, kept / name);
  return kept;
}

}  // namespace

RunDirectory::RunDirectory(std::filesystem::path run_dir, const std::filesystem::path& save_dir,
                           const nlohmann::json& resolved, bool fresh, std::optional<int64_t> start)
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
  if (!save_dir.empty() && start && std::filesystem::is_directory(save_dir)) {
    const io::SetAside aside = io::set_aside_later_checkpoints(save_dir, *start);
    if (!aside.iterations.empty()) {
      earlier_ = save_dir.string() + " held checkpoints past iteration " + std::to_string(*start) +
                 ", where this run starts (" + (aside.iterations.size() > 1 ? "iterations " : "iteration ") +
                 join(aside.iterations, ", ") +
                 "): another trajectory's, which this run's would mix with; they are kept in " + aside.to.string() +
                 " (" + human_bytes(static_cast<double>(aside.bytes)) + "; remove it when you no longer need them)";
      if (const std::string rows = fresh ? "" : rows_held(dir_); !rows.empty())
        earlier_ += "; " + (dir_ / "metrics.h5").string() + " as it was (" + rows + "), whose rows past iteration " +
                    std::to_string(*start) + " this run drops, is kept in " + keep_earlier_run(dir_, true).string();
    }
  }
  if (const std::string rows = fresh ? rows_held(dir_) : ""; !rows.empty()) {
    const std::filesystem::path kept = keep_earlier_run(dir_);
    earlier_ += std::string(earlier_.empty() ? "" : "; ") + dir_.string() + " held the metrics of an earlier run (" +
                rows + "), which this run, starting afresh, would replace; they are kept in " + kept.string();
  }
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
