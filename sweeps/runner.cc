#include "sweeps/runner.h"

#include <iostream>
#include <optional>

#include "core/util/dir_lock.h"
#include "core/util/threads.h"
#include "sweeps/preflight.h"
#include "sweeps/scheduler.h"

namespace megabatch::sweeps {
namespace fs = std::filesystem;

int run_sweep(const Sweep& sweep, const RunOptions& o) {
  const fs::path root = o.runs_dir / sweep.name;
  // every point runs `train --threads N`, which refuses more threads than this machine's CPUs
  if (o.threads) check_thread_count(o.threads, "--threads");
  else if (sweep.threads) check_thread_count(sweep.threads, sweep.file.string() + ": threads");
  // One sweep run per directory: started again while it runs, it is refused, naming the first.
  std::optional<DirLock> lock;
  auto take_lock = [&] {
    if (o.dry_run || lock) return;
    lock.emplace(root, "sweep run",
                 "a second sweep run would run the same points into the same directories; follow this one with "
                 "`sweep status " + root.string() + "`, or stop it (Ctrl-C stops its points at a checkpoint) and run "
                 "the sweep again to resume");
  };
  if (fs::exists(root)) take_lock();  // it may be running: locked before its state is read
  std::vector<PointState> ps =
      point_states(sweep, o, root, "Run with --rerun to discard those points and run them again, or give the sweep a new name");
  take_lock();  // a new sweep's directory is made once its points are valid
  discard_rerun_points(ps, root, o);
  if (const std::string note = noise_scale_note(sweep); !note.empty()) std::cout << "> " << note << std::endl;
  if (o.dry_run) return dry_run(sweep, o, root, ps);
  return run_points(sweep, o, root, ps);
}

}  // namespace megabatch::sweeps
