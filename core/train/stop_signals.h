// The signals that stop a run at the end of an iteration: SIGTERM and SIGUSR1 (schedulers:
// Slurm's --signal, a preemption) and SIGINT (Ctrl-C, once; a second ends the process).
#pragma once

#include <csignal>

namespace megabatch::train {

// The stop signals' handlers for the duration of a run: SIGTERM and SIGUSR1 (schedulers),
// SIGINT (Ctrl-C, once; left ignored where the parent ignores it, as for background jobs
// of a script). The destructor puts the previous handlers back.
class StopSignals {
 public:
  StopSignals();  // (clears the signal received)
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_[3] {};
  bool int_installed_ = false;
};

// The last stop signal received since the StopSignals of the run were installed (0: none).
int stop_signal_received();

}  // namespace megabatch::train
