#include "sweeps/scheduler.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>

#include "core/train/exit_status.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/strings.h"
#include "core/util/threads.h"
#include "sweeps/placement.h"
#include "sweeps/run_dir.h"
#include "sweeps/sweep_state.h"

namespace megabatch::sweeps {
namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop(int) { g_stop = 1; }


// A point this invocation still has to start: not yet run, interrupted, or failed with
// retries left.
bool to_start(const PointState& p, int retries) {
  return p.state == PointStatus::kPending || p.state == PointStatus::kInterrupted || (p.state == PointStatus::kFailed && p.attempts <= retries);
}

// Runs the points as train processes, `jobs` at a time (with --gpus, each on GPUs of its
// own), until every one has ended or a stop signal has made them checkpoint and exit;
// keeps runs/<name>/sweep.json and the table current.
class Scheduler {
 public:
  Scheduler(const Sweep& sweep, const RunOptions& o, fs::path root, std::vector<PointState>& ps)
      : sweep_(sweep),
        o_(o),
        root_(std::move(root)),
        ps_(ps),
        placer_(o.gpus),
        rerun_damaged_(run_again(o.launcher, "", "--rerun damaged")) {
    threads_ = o.threads ? o.threads : sweep.threads;
    if (!threads_) threads_ = 1;
    jobs_ = o.jobs ? o.jobs : sweep.jobs;
    if (!jobs_) jobs_ = o.gpus.empty() ? std::max(1, available_cpus() / threads_) : static_cast<int>(o.gpus.size());
  }

  int run();

 private:
  void save_state() { write_file_atomic(root_ / "sweep.json", state_json(ps_, sweep_, o_.launcher).dump(2) + "\n"); }
  // A point of more than one rank runs under mpirun, and with --ranks every point (mpirun may
  // place even one rank on another host).
  bool under_mpirun(const PointState& p) const { return p.ranks > 1 || o_.ranks > 0; }
  int running() const {
    int n = 0;
    for (const auto& p : ps_) n += p.state == PointStatus::kRunning;
    return n;
  }
  void start_waiting_points();
  void start(PointState& p);
  void stop_running_points();
  void reap();
  void ended(PointState& p, int status);
  void display(bool force);

  const Sweep& sweep_;
  const RunOptions& o_;
  const fs::path root_;
  std::vector<PointState>& ps_;
  GpuPlacer placer_;
  const std::string rerun_damaged_;  // what runs the points whose result is lost again, as the table names it
  int threads_ = 1, jobs_ = 1;
  Clock::time_point t0_ = Clock::now(), last_plain_ = Clock::now();
  int64_t work_done_at_start_ = 0, work_total_ = 0;  // samples
  size_t printed_ = 0;  // lines of the live table on screen (0: print it afresh below)
};

int Scheduler::run() {
  fs::create_directories(root_);
  const auto n_to_start =
      std::count_if(ps_.begin(), ps_.end(), [&](const PointState& p) { return to_start(p, o_.retries); });
  std::cout << "> sweep " << sweep_.name << ": " << sweep_.points.size() << " points"
            << (static_cast<size_t>(n_to_start) == ps_.size() ? "" : " (" + std::to_string(n_to_start) + " to run)")
            << ", " << jobs_ << " at a time, "
            << threads_ << " thread(s) each" << (o_.gpus.empty() ? "" : " on GPUs " + gpu_list(o_.gpus))
            << "; runs in " << root_.string() << std::endl;
  g_stop = 0;
  auto old_int = std::signal(SIGINT, on_stop);
  auto old_term = std::signal(SIGTERM, on_stop);
  save_state();
  t0_ = Clock::now();
  for (const auto& p : ps_) {
    if (p.state == PointStatus::kSkipped) continue;
    work_total_ += p.samples;
    work_done_at_start_ += work_of(p);
  }
  while (true) {
    if (!g_stop) start_waiting_points();
    if (running() == 0) break;
    reap();
    if (g_stop) stop_running_points();
    for (auto& p : ps_)
      if (p.state == PointStatus::kRunning) p.progress = parse_progress(p.dir / "stdout.log");
    display(false);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  int failed = 0, diverged = 0, damaged = 0;
  for (const auto& p : ps_) {
    failed += p.state == PointStatus::kFailed;
    diverged += p.state == PointStatus::kDiverged;
    damaged += !p.damaged.empty();
  }
  save_state();
  display(true);
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);
  if (g_stop) {
    std::cout << "> stopped; every point is resumable: run the same command again" << std::endl;
    return 130;
  }
  if (diverged)
    std::cout << "> " << diverged << " point(s) diverged (a result, not retried; --rerun diverged runs them again)"
              << std::endl;
  if (failed) {
    std::cout << "> " << failed << " point(s) failed; their logs are in " << root_.string()
              << "/<id>/stdout.log (rerun to retry them, or --retries N)" << std::endl;
    return 1;
  }
  if (damaged) {
    std::cout << "> " << damaged << " finished point(s) have no readable metrics.h5 (named above): their results are "
              << "lost; " << rerun_damaged_ << " runs them again" << std::endl;
    return 1;
  }
  std::cout << "> all points done; plot with: sweep plot " << root_.string() << std::endl;
  return 0;
}

// Starts points in sweep order while fewer than `jobs` run: pending, interrupted, and
// failed ones with retries left; with --gpus, a point waits for enough free GPUs while
// later, smaller points that fit start.
void Scheduler::start_waiting_points() {
  int running = this->running();
  for (auto& p : ps_) {
    if (running >= jobs_) break;
    if (!to_start(p, o_.retries)) continue;
    if (!o_.gpus.empty()) {
      p.gpus = placer_.take(p.ranks);
      if (p.gpus.empty()) continue;
    }
    try {
      start(p);
      ++running;
    } catch (const std::exception& e) {  // its directory unwritable, say: this point fails, the sweep goes on
      p.state = PointStatus::kFailed;
      p.attempts = o_.retries + 1;  // the file system will not change by retrying at once
      p.reason = std::string("cannot start: ") + e.what();
      placer_.give_back(p.gpus);
      p.gpus.clear();
      std::cout << (o_.tty ? "" : "> ") << "failed " << p.point->id << ": " << p.reason << std::endl;
      printed_ = 0;
    }
    save_state();
  }
}

// One attempt of a point: train (under mpirun for more than one rank) in its own process
// group, output appended to its stdout.log, checkpointing as launch_config says.
void Scheduler::start(PointState& p) {
  make_point_dir(p.dir);
  fs::remove(p.dir / "FAILED");  // a launcher's record of an earlier attempt (sweep finish)
  write_file_atomic(p.dir / "point.json", launch_config(*p.point).dump(2) + "\n");
  const fs::path ckpt = p.dir / "checkpoints";
  std::vector<std::string> args;
  // one process per rank (and GPU)
  if (under_mpirun(p)) args = {o_.mpirun, "-np", std::to_string(p.ranks)};
  args.insert(args.end(), {o_.train_binary.string(), "--config", (p.dir / "point.json").string(), "--run-dir",
                           p.dir.string(), "--save", ckpt.string(), "--load", ckpt.string(), "--threads",
                           std::to_string(threads_)});
  const int fd = ::open((p.dir / "stdout.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  check(fd >= 0, (p.dir / "stdout.log").string(), ": cannot open the point's log");
  const pid_t pid = fork();
  check(pid >= 0, "fork failed: ", std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a killed sweep takes its points with it
    setpgid(0, 0);                      // Ctrl-C reaches the sweep, which stops points cleanly
    dup2(fd, 1);
    dup2(fd, 2);
    if (!p.gpus.empty()) {
      const std::string list = gpu_list(p.gpus);
      setenv("CUDA_VISIBLE_DEVICES", list.c_str(), 1);
      std::printf("> sweep: %s on GPU%s %s (CUDA_VISIBLE_DEVICES=%s)\n", p.point->id.c_str(), p.gpus.size() > 1 ? "s" : "",
                  list.c_str(), list.c_str());
    }
    if (under_mpirun(p)) std::printf("> sweep: %d ranks: %s -np %d\n", p.ranks, o_.mpirun.c_str(), p.ranks);
    std::fflush(stdout);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "sweep: error: cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  ::close(fd);
  p.pid = pid;
  p.state = PointStatus::kRunning;
  p.stopping = false;
  p.started = Clock::now();
  ++p.attempts;
  if (!o_.tty)
    std::cout << "> start " << p.point->id << " (attempt " << p.attempts << ")"
              << (p.gpus.empty() ? "" : " on GPU" + std::string(p.gpus.size() > 1 ? "s " : " ") + gpu_list(p.gpus))
              << std::endl;
}

// Forwards the sweep's stop to every running point, again at each look until it has ended
// (a process still starting has no handler yet, and mpirun passes a signal on only to the
// ranks it has started), so that each finishes its iteration, checkpoints and exits 3. A
// process of its own gets SIGTERM; mpirun gets SIGUSR1, which it passes on to the ranks
// (train takes either as the stop), where a SIGTERM would make it end the job itself: the
// ranks killed a moment later, whatever they were writing, and the point "failed".
void Scheduler::stop_running_points() {
  for (auto& p : ps_)
    if (p.state == PointStatus::kRunning && p.pid > 0) {
      ::kill(p.pid, under_mpirun(p) ? SIGUSR1 : SIGTERM);
      p.stopping = true;
    }
}

// Every point process that has ended since the last look.
void Scheduler::reap() {
  int status = 0;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
    for (auto& p : ps_)
      if (p.pid == pid) ended(p, status);
}

// A point's process ended with `status`: done (its checkpoints pruned to the sweep's
// policy, DONE written), diverged, interrupted (resumable), or failed (its error in full
// once, then the lines before it).
void Scheduler::ended(PointState& p, int status) {
  p.pid = -1;
  placer_.give_back(p.gpus);
  p.gpus.clear();
  p.wall_s += std::chrono::duration<double>(Clock::now() - p.started).count();
  p.progress = parse_progress(p.dir / "stdout.log");
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 0) {
    p.state = PointStatus::kDone;
    p.reason.clear();
    mark_done(p.dir, sweep_.checkpoints,
              {{"wall_s", p.wall_s}, {"iteration", p.progress.iteration}, {"lm_loss", p.progress.loss}});
    if (!o_.tty) std::cout << "> done " << p.point->id << " (" << fmt_duration(p.wall_s) << ")" << std::endl;
  } else if (code == train::kExitDiverged) {
    p.state = PointStatus::kDiverged;
    p.reason = divergence_reason(p.dir);
    std::cout << (o_.tty ? "" : "> ") << "diverged " << p.point->id << ": " << p.reason << std::endl;
    printed_ = 0;
  } else if (code == train::kExitStopped || p.stopping) {
    // asked to stop: at a checkpoint (3), or ended by the signal before its first
    // iteration; either way it resumes from its newest checkpoint
    p.state = PointStatus::kInterrupted;
    if (!o_.tty) std::cout << "> interrupted " << p.point->id << " (resumable)" << std::endl;
  } else {
    p.state = PointStatus::kFailed;
    const fs::path log = p.dir / "stdout.log";
    p.reason = failure_reason(log, status);
    std::cout << (o_.tty ? "" : "> ") << "failed " << p.point->id << ": " << p.reason << "\n  last lines of "
              << log.string() << ":\n";
    for (const auto& line : last_log_lines(log, 5, p.reason)) std::cout << "    " << line << "\n";
    std::cout << std::flush;
    printed_ = 0;
  }
  save_state();
}

// The live table redrawn in place on a terminal; otherwise its summary line, every 30 s
// or when forced.
void Scheduler::display(bool force) {
  double work_now = 0;
  bool open = false;  // points still to run or running
  for (const auto& p : ps_)
    if (p.state != PointStatus::kSkipped) {
      work_now += static_cast<double>(work_of(p));
      open = open || p.state == PointStatus::kRunning || to_start(p, o_.retries);
    }
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0_).count();
  const double gained = work_now - static_cast<double>(work_done_at_start_);
  const double eta = !open ? 0.0 : gained > 0 ? elapsed * (static_cast<double>(work_total_) - work_now) / gained : -1;
  const auto lines = table_lines(ps_, elapsed, eta, rerun_damaged_);
  if (o_.tty) {
    if (printed_) std::cout << "\033[" << printed_ << "A";
    const size_t width = terminal_width();
    for (const auto& l : lines) std::cout << "\r\033[K" << fit_width(l, width) << "\n";
    printed_ = lines.size();
    std::cout << std::flush;
  } else if (force || Clock::now() - last_plain_ > std::chrono::seconds(30)) {
    std::cout << lines.front() << std::endl;
    last_plain_ = Clock::now();
  }
}

}  // namespace

int run_points(const Sweep& sweep, const RunOptions& options, const fs::path& root, std::vector<PointState>& points) {
  return Scheduler(sweep, options, root, points).run();
}

}  // namespace megabatch::sweeps
