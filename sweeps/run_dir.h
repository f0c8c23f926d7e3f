// What `sweep run` keeps on disk, and how the sweep tool reads it back:
//
//   runs/<name>/sweep.json          the expanded sweep and each point's state
//   runs/<name>/.megabatch.lock     held by the running `sweep run` (core/util/dir_lock.h);
//                                   <id>/ and <id>/checkpoints/ have train's
//   runs/<name>/<id>/.megabatch-point   the mark: the sweep tool made this directory
//   runs/<name>/<id>/point.json     the point's train configuration (its input)
//   runs/<name>/<id>/config.json    train's resolved configuration
//   runs/<name>/<id>/stdout.log     train's output (Megatron's log lines)
//   runs/<name>/<id>/metrics.h5, checkpoints/, DONE or DIVERGED (or FAILED, from a launcher
//                                   of an exported sweep: sweep finish --exit-status)
//
// The sweep tool deletes only directories that carry its mark, never through a symlink.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace megabatch::sweeps {

// ---- the sweep's state --------------------------------------------------------------------

// runs/<name>/sweep.json, parsed; errors name the file and say what to do.
nlohmann::json read_sweep_state(const std::filesystem::path& sweep_dir);

// The directories of finished (done or diverged) points of `state` (read_sweep_state) that
// the sweep tool made, never through a symlink: what sweep prune may thin out. A running
// point keeps its checkpoints.
std::vector<std::filesystem::path> finished_point_dirs(const std::filesystem::path& sweep_dir,
                                                       const nlohmann::json& state);

// Bytes of the regular files under `dir`, not following symlinks, and of those in a
// checkpoints/ directory (or set aside in its earlier/N).
struct DiskUsage {
  int64_t total = 0, checkpoints = 0;
};
DiskUsage disk_usage(const std::filesystem::path& dir);

// Whether the sweep in `dir` is run by a launcher (sweep export-points wrote its points.txt
// for Slurm or EKS), whose commands, not sweep run, run its points again.
bool exported(const std::filesystem::path& dir);

// ---- a point's directory ------------------------------------------------------------------

// Whether the point in `dir` has finished: done or diverged (its DONE or DIVERGED is there).
bool finished(const std::filesystem::path& dir);

// Makes the directory (and its parents) and marks it as the sweep tool's.
void make_point_dir(const std::filesystem::path& dir);

// Removes a point directory (--rerun): only a real directory (not a symlink) directly in
// `sweep_dir`, carrying the mark; what is inside is removed without following symlinks.
// Anything else is an error that says why.
void remove_point_dir(const std::filesystem::path& sweep_dir, const std::filesystem::path& dir);

// The keys whose values differ between the configuration the point in `dir` ran with (its
// point.json) and `config`, as "key: old -> new"; empty when it has not run or only keys
// that cannot change results differ (plugin_path, threads, checkpoint intervals, ...).
std::vector<std::string> config_changes(const std::filesystem::path& dir, const nlohmann::json& config);

// The wall time a point's DONE records (sweep run's, or its launcher's through sweep
// finish --wall-s); 0 where it records none or cannot be read.
double done_wall_s(const std::filesystem::path& dir);

// Why a point diverged, from its DIVERGED file: "iteration N: reason".
std::string divergence_reason(const std::filesystem::path& dir);

// A point of an exported sweep whose train failed under its launcher (sweep finish
// --exit-status): FAILED, written whole, says why; the launcher's next attempt (and sweep
// run's) removes it. failed_reason reads it back ("" where there is none).
void mark_failed(const std::filesystem::path& dir, const std::string& reason);
std::string failed_reason(const std::filesystem::path& dir);

// ---- a point's log ------------------------------------------------------------------------

// Progress from a point's stdout.log: the last iteration line's iteration and lm loss, and
// the result, the validation loss after training.
struct Progress {
  int64_t iteration = 0;
  int64_t consumed = 0;  // consumed samples after `iteration`
  double loss = 0;
  bool has_loss = false;
  double valid_loss = 0;
  bool has_valid = false;
};
Progress parse_progress(const std::filesystem::path& log);

// Why a point failed: the last error line of train's in its log (rather than the launcher's
// after it: mpirun's MPI_ABORT notice), else the last line that says "error", else how the
// process ended (`status` as waitpid gives it).
std::string failure_reason(const std::filesystem::path& log, int status);

// The log's last `n` lines (of its last 1,500 bytes), without `except` (the error already
// printed in full).
std::vector<std::string> last_log_lines(const std::filesystem::path& log, size_t n, const std::string& except);

// ---- checkpoints --------------------------------------------------------------------------

// What a finished point keeps of its checkpoints directory: "final" (the newest iter_*.h5, and
// those its run keeps for good: --save-retain-interval), "all" or "none"; returns the bytes freed. Only regular
// iter_*.h5 files in that directory are removed.
int64_t prune_checkpoints(const std::filesystem::path& dir, const std::string& keep);

// A point whose train ended with status 0 (point_dir): its checkpoints/ pruned as `keep`
// says, then DONE written whole with `record` (JSON); returns the bytes freed.
int64_t mark_done(const std::filesystem::path& point_dir, const std::string& keep, const nlohmann::json& record);

// The bytes prune_checkpoints(dir, keep) would free; removes nothing.
int64_t prunable_checkpoint_bytes(const std::filesystem::path& dir, const std::string& keep);

}  // namespace megabatch::sweeps
