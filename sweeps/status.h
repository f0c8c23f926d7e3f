// sweep status and sweep prune: what a sweep's run directory (runs/<name>, sweeps/run_dir.h)
// holds, and freeing the checkpoints its finished points no longer need.
#pragma once

#include <filesystem>

namespace megabatch::sweeps {

// Prints the status table of runs/<name> (the directory sweep run wrote) and the disk it
// uses, with what sweep prune would free.
int print_status(const std::filesystem::path& sweep_dir);

// sweep prune: every finished (done or diverged) point of runs/<name> keeps only its
// final checkpoint; prints what was freed.
int prune_sweep(const std::filesystem::path& sweep_dir);

}  // namespace megabatch::sweeps
