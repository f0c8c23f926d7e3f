// Exit statuses of `train` that other programs read (the sweep runner, Slurm's point.sbatch).
#pragma once

namespace megabatch::train {

// Stopped before its end by SIGTERM, SIGUSR1 or a first SIGINT, or by
// --exit-duration-in-mins, after writing its checkpoint: resumable.
inline constexpr int kExitStopped = 3;
// Diverged (NaN/inf, or a loss above --divergence-loss): run_dir/DIVERGED says where and
// why; a result, not a failure, and not retried.
inline constexpr int kExitDiverged = 4;

}  // namespace megabatch::train
