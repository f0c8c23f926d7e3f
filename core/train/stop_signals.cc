#include "core/train/stop_signals.h"

#include <unistd.h>

namespace megabatch::train {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
}  // namespace

extern "C" void on_stop_signal(int sig) {
  if (sig == SIGINT) {  // the handler is installed with SA_RESETHAND: a second Ctrl-C ends the process
    static const char msg[] =
        "\n received SIGINT: stopping at the end of this iteration (with a checkpoint where --save is set); "
        "Ctrl-C again exits at once\n";
    [[maybe_unused]] const auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  }
  g_stop_signal = sig;
}

StopSignals::StopSignals() {
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, &old_[0]);
  ::sigaction(SIGUSR1, &sa, &old_[1]);
  struct sigaction current {};
  ::sigaction(SIGINT, nullptr, &current);
  if (current.sa_handler != SIG_IGN) {
    sa.sa_flags = SA_RESETHAND;
    ::sigaction(SIGINT, &sa, &old_[2]);
    int_installed_ = true;
  }
}

StopSignals::~StopSignals() {
  ::sigaction(SIGTERM, &old_[0], nullptr);
  ::sigaction(SIGUSR1, &old_[1], nullptr);
  if (int_installed_) ::sigaction(SIGINT, &old_[2], nullptr);
}

int stop_signal_received() { return g_stop_signal; }

}  // namespace megabatch::train
