#include "sweeps/runner.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

#include "core/train/exit_status.h"
#include "core/util/dir_lock.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/strings.h"
#include "core/util/threads.h"
#include "sweeps/placement.h"
#include "sweeps/run_dir.h"
#include "sweeps/table.h"

namespace megabatch::sweeps {
namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop(int) { g_stop = 1; }

// train --check of a point's configuration (plugin and its hyperparameters, data files,
// memory), from a temporary copy of it, as the point will run: a point of more than one
// rank under `mpirun -np` (its layout checked, its memory per rank); "" when fine, else
// train's error line(s).
std::string check_point(const fs::path& train, const Point& point, const std::string& mpirun) {
  char path[] = "/tmp/megabatch-check-XXXXXX";
  const int fd = mkstemp(path);
  check(fd >= 0, "cannot make a temporary file to check point ", point.id, ": ", std::strerror(errno));
  const std::string text = point.config.dump();
  const bool wrote = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  std::optional<CommandOutput> r;
  if (wrote) {
    const int ranks = ranks_needed(point.config);
    r = read_command((ranks > 1 ? shell_quote(mpirun) + " -np " + std::to_string(ranks) + " " : std::string()) +
                     shell_quote(train.string()) + " --config " + shell_quote(path) + " --check --threads 1 2>&1");
  }
  ::unlink(path);
  if (!r) return "could not run train --check";
  if (r->status == 0) return "";
  // "train: error: ..." or, from each rank of an MPI check, "train (rank N): error: ...":
  // each message once (the ranks of a job mostly say the same), mpirun's own lines left out
  std::vector<std::string> messages;
  for_each_line(r->text, [&](std::string_view line, size_t) {
    const size_t at = line.find("error: ");
    if (line.substr(0, 5) != "train" || at == std::string_view::npos) return;
    const std::string said(line.substr(at));
    if (std::find(messages.begin(), messages.end(), said) == messages.end()) messages.push_back(said);
  });
  return messages.empty() ? "train --check failed: " + r->text : "train: " + join(messages, "; ");
}

// The cluster a sweep file says it was sized for ("cluster": instance_type, nodes,
// gpus_per_node), its fields checked; none when the file names none.
struct Cluster {
  int64_t nodes = 0, gpus_per_node = 0;
  std::string instance_type;
  int ranks() const { return static_cast<int>(nodes * gpus_per_node); }
};
std::optional<Cluster> sweep_cluster(const Sweep& sweep) {
  if (!sweep.spec.contains("cluster")) return std::nullopt;
  const json& c = sweep.spec["cluster"];
  const std::string where = sweep.file.string() + ": cluster";
  check(c.is_object(), where, ": expected an object (instance_type, nodes, gpus_per_node), got ", c.dump());
  for (const char* k : {"nodes", "gpus_per_node"})
    check(c.contains(k) && c[k].is_number_integer() && c[k].get<int64_t>() >= 1 && c[k].get<int64_t>() <= 100000, where,
          ".", k, ": expected a whole number >= 1, got ", c.contains(k) ? c[k].dump() : "nothing");
  check(c.contains("instance_type") && c["instance_type"].is_string(), where,
        ".instance_type: expected a string (p4d.24xlarge), got ", c.contains("instance_type") ? c["instance_type"].dump() : "nothing");
  return Cluster{c["nodes"].get<int64_t>(), c["gpus_per_node"].get<int64_t>(), c["instance_type"].get<std::string>()};
}

// Refuses the points that cannot run as a job of `ranks` ranks (layout_problem), naming
// three and counting the rest (most misfits of one sweep share their reason); `how` says
// where the job size came from.
void check_layouts(const Sweep& sweep, const std::vector<const Point*>& points, int ranks, const std::string& how) {
  std::vector<std::string> misfits;
  for (const Point* p : points)
    if (const std::string why = layout_problem(p->config, ranks); !why.empty()) misfits.push_back(p->id + ": " + why);
  const size_t n = misfits.size(), shown = 3;
  if (n == 0) return;
  if (n > shown + 1) {
    misfits.resize(shown);
    misfits.push_back("and " + std::to_string(n - shown) + " more");
  }
  fail(sweep.file.string(), ": ", n, " point(s) cannot run as a job of ", ranks, " ranks (", how, "): ",
       join(misfits, "; "), ". Give the job another size, or change those points");
}

int64_t iters_of(const json& c) {
  if (c.contains("train_iters")) return c["train_iters"].get<int64_t>();
  const int64_t B = c.contains("global_batch_size") ? c["global_batch_size"].get<int64_t>() : 1;
  return c.contains("train_samples") ? c["train_samples"].get<int64_t>() / B : 0;
}

// The configuration a point's train runs with, its point.json whatever launches it (sweep
// run, a Slurm array task, an EKS job): the point's own, with the sweep's checkpoint schedule
// where the point sets none: a checkpoint every tenth of its iterations, the newest two kept
// while it runs. A point killed outright (a node lost) then loses at most a tenth of its work.
json launch_config(const Point& point) {
  json c = point.config;
  if (!c.contains("save_interval")) c["save_interval"] = std::max<int64_t>(1, iters_of(c) / 10);
  if (!c.contains("keep_checkpoints")) c["keep_checkpoints"] = 2;
  return c;
}

json state_json(const std::vector<PointState>& ps, const Sweep& s) {
  json points = json::array();
  for (const auto& p : ps)
    points.push_back({{"id", p.point->id}, {"state", status_name(p.state)}, {"reason", p.reason}, {"attempts", p.attempts},
                      {"wall_s", p.wall_s}, {"train_iters", p.train_iters}, {"global_batch_size", p.global_batch},
                      {"iteration", p.progress.iteration}, {"ranks", p.ranks}, {"gpus", p.gpus},
                      {"config", p.point->config}});
  json state = {{"name", s.name}, {"file", fs::absolute(s.file).string()}, {"sweep_pid", static_cast<int64_t>(getpid())},
                {"checkpoints", s.checkpoints}, {"points", points}};
  if (s.spec.contains("cluster")) state["cluster"] = s.spec["cluster"];  // for the launchers (eks/render.py --sweep)
  return state;
}

bool selected(const std::string& id, const std::string& only) {
  if (only.empty()) return true;
  return fnmatch(only.c_str(), id.c_str(), 0) == 0 || id.find(only) != std::string::npos;
}

// The sweep's points as runs/<name> has them: finished, diverged, partly run or not yet,
// with the wall time of earlier invocations; points --only leaves out are "skipped". Points
// whose configuration changed since they ran are refused unless --rerun (then marked to be
// discarded), as is a point needing more GPUs than --gpus gives; nothing is deleted here.
// `remedy` ends the refusal of changed points.
std::vector<PointState> point_states(const Sweep& sweep, const RunOptions& o, const fs::path& root,
                                     const std::string& remedy) {
  std::map<std::string, json> previous;  // id -> its state when the sweep last ran
  if (fs::exists(root / "sweep.json")) {
    const json state = read_sweep_state(root);  // named: a range-for over a temporary's member dangles
    for (const auto& p : state["points"]) previous[p["id"].get<std::string>()] = p;
  }
  std::vector<PointState> ps(sweep.points.size());
  std::vector<std::string> changes;  // "id (key: old -> new, ...)" of points that ran with another configuration
  for (size_t i = 0; i < ps.size(); ++i) {
    PointState& p = ps[i];
    p.point = &sweep.points[i];
    p.dir = root / p.point->id;
    p.train_iters = iters_of(p.point->config);
    p.ranks = o.ranks > 0 ? o.ranks : ranks_needed(p.point->config);
    p.global_batch = p.point->config.contains("global_batch_size") ? p.point->config["global_batch_size"].get<int64_t>()
                                                                   : p.point->config.value("micro_batch_size", int64_t{8});
    if (!selected(p.point->id, o.only)) {
      p.state = PointStatus::kSkipped;
      continue;
    }
    if (auto it = previous.find(p.point->id); it != previous.end()) p.wall_s = it->second.value("wall_s", 0.0);
    if (const auto diff = config_changes(p.dir, p.point->config); !diff.empty()) {
      changes.push_back(p.point->id + " (" + join(diff, ", ") + ")");
      p.discard = "its configuration changed";
    }
    read_finished_state(p);
    if (p.state == PointStatus::kDiverged && o.rerun_diverged) p.discard = p.reason;
    p.progress = parse_progress(p.dir / "stdout.log");
  }
  if (!o.only.empty() && std::none_of(ps.begin(), ps.end(), [](const PointState& p) { return p.state != PointStatus::kSkipped; })) {
    std::vector<std::string> some;
    for (size_t i = 0; i < sweep.points.size() && i < 4; ++i) some.push_back(sweep.points[i].id);
    fail("--only '", o.only, "' matches none of the ", sweep.points.size(), " points of ", sweep.file.string(),
         " (ids such as ", join(some, ", "), "); give a glob such as 'lamb-*' or a part of an id");
  }
  if (!changes.empty() && !o.rerun_changed)
    fail(sweep.file.string(), ": the configuration of ", changes.size(), " point(s) that already ran differs from ",
         "this file: ", join(changes, "; "), ". Results of two configurations are not mixed (keys that cannot change "
         "results, such as plugin_path and threads, are not compared). ", remedy);
  if (o.ranks > 0) {  // every point must run as a job of that many ranks
    std::vector<const Point*> selected_points;
    for (const auto& p : ps)
      if (p.state != PointStatus::kSkipped) selected_points.push_back(p.point);
    check_layouts(sweep, selected_points, o.ranks, "--ranks");
  }
  if (!o.gpus.empty()) {  // every point must fit on the GPUs it may use
    std::vector<std::string> too_big;
    for (const auto& p : ps)
      if (p.state != PointStatus::kSkipped && static_cast<size_t>(p.ranks) > o.gpus.size())
        too_big.push_back(p.point->id + " needs " + std::to_string(p.ranks));
    if (!too_big.empty())
      fail(sweep.file.string(), ": ", too_big.size(), " point(s) need more GPUs (tensor_model_parallel_size x ",
           "data_parallel_size) than --gpus gives (", o.gpus.size(), "): ", join(too_big, "; "),
           ". Give more GPUs, or make those points smaller");
  }
  return ps;
}

// --rerun (changed) and --rerun diverged: the marked points' directories go, and they run
// afresh; under --dry-run only says so.
void discard_rerun_points(std::vector<PointState>& ps, const fs::path& root, bool dry_run) {
  for (auto& p : ps) {
    if (p.discard.empty()) continue;
    if (dry_run) {
      std::cout << "  --rerun discards " << p.dir.string() << " (" << p.discard << ")\n";
      continue;
    }
    remove_point_dir(root, p.dir);
    p.state = PointStatus::kPending;
    p.reason.clear();
    p.wall_s = 0;
    p.progress = {};
  }
}

// --dry-run: lists the points with their swept values and checks each that has still to
// run with train --check; 2 when one cannot run.
int dry_run(const Sweep& sweep, const RunOptions& o, const fs::path& root, const std::vector<PointState>& ps) {
  const auto n_selected = std::count_if(ps.begin(), ps.end(), [](const PointState& p) { return p.state != PointStatus::kSkipped; });
  std::cout << sweep.name << ": " << sweep.points.size() << " points"
            << (static_cast<size_t>(n_selected) == ps.size()
                    ? ""
                    : ", " + std::to_string(n_selected) + " selected by --only")
            << " (runs in " << root.string() << ")\n";
  int bad = 0;
  std::map<std::string, std::string> first_with;  // an error -> the first point it was printed for
  // A sweep sized for a cluster ("cluster" in its file) has its data and memory there: its
  // points are checked where they run (train --check), not on this machine; here, that each
  // fits a job of the cluster's GPUs (one rank each).
  const std::optional<Cluster> cluster = sweep_cluster(sweep);
  for (const auto& p : ps) {
    if (p.state == PointStatus::kSkipped) continue;
    json diff = json::object();
    for (const auto& k : p.point->swept)
      if (p.point->config.contains(k)) diff[k] = p.point->config[k];
    for (const char* k : {"lr", "train_iters", "seed"})
      if (p.point->config.contains(k)) diff[k] = p.point->config[k];
    std::cout << "  " << p.point->id << "  " << (p.state == PointStatus::kDone ? "[done] " : "") << diff.dump() << "\n";
    if (!o.train_binary.empty() && p.state != PointStatus::kDone && o.ranks == 0) {  // --ranks: checked in point_states
      std::string error;
      if (!cluster)
        error = check_point(o.train_binary, *p.point, o.mpirun);
      else if (const std::string why = layout_problem(p.point->config, cluster->ranks()); !why.empty())
        error = "as a job of " + std::to_string(cluster->ranks()) + " ranks (the cluster's " +
                std::to_string(cluster->nodes) + " x " + std::to_string(cluster->gpus_per_node) + " GPUs): " + why;
      if (!error.empty()) {
        ++bad;
        const auto [at, first] = first_with.emplace(error, p.point->id);
        std::cout << "    cannot run: " << (first ? error : "as " + at->second + " above") << "\n";
      }
    }
  }
  std::cout << std::flush;
  if (bad) {
    std::cout << "> " << bad << " point(s) cannot run (above); fix the sweep file" << std::endl;
    return 2;
  }
  if (o.ranks > 0)
    std::cout << "> every point fits a job of " << o.ranks << " ranks (--ranks); data and memory are checked by "
              << "train where the points run (a point that cannot run fails with train's error)" << std::endl;
  else if (cluster)
    std::cout << "> sized for " << sweep.spec["cluster"].dump() << ": every point fits a job of its "
              << cluster->ranks() << " GPUs; data and memory are not checked on this machine: "
              << "run train --check --config <point.json> where it runs" << std::endl;
  else if (!o.train_binary.empty())
    std::cout << "> every point checked (train --check: plugin and hyperparameters, data, memory)" << std::endl;
  return 0;
}

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
      : sweep_(sweep), o_(o), root_(std::move(root)), ps_(ps), placer_(o.gpus) {
    threads_ = o.threads ? o.threads : sweep.threads;
    if (!threads_) threads_ = 1;
    jobs_ = o.jobs ? o.jobs : sweep.jobs;
    if (!jobs_) jobs_ = o.gpus.empty() ? std::max(1, available_cpus() / threads_) : static_cast<int>(o.gpus.size());
  }

  int run();

 private:
  void save_state() { write_file_atomic(root_ / "sweep.json", state_json(ps_, sweep_).dump(2) + "\n"); }
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
    work_total_ += p.train_iters * p.global_batch;
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
  int failed = 0, diverged = 0;
  for (const auto& p : ps_) failed += p.state == PointStatus::kFailed, diverged += p.state == PointStatus::kDiverged;
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
  } else if (code == train::kExitStoppedBySignal || p.stopping) {
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
  const auto lines = table_lines(ps_, elapsed, eta);
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
  if (o.rerun_diverged && std::none_of(ps.begin(), ps.end(), [](const PointState& p) { return !p.discard.empty(); }))
    std::cout << "> warning: --rerun diverged: no point " << (o.only.empty() ? "" : "selected by --only ")
              << "has diverged, so none is run again" << std::endl;
  discard_rerun_points(ps, root, o.dry_run);
  if (const std::string note = noise_scale_note(sweep); !note.empty()) std::cout << "> " << note << std::endl;
  if (o.dry_run) return dry_run(sweep, o, root, ps);
  return Scheduler(sweep, o, root, ps).run();
}

int export_points(const Sweep& sweep, const fs::path& runs_dir, int ranks, bool dry_run) {
  const fs::path root = runs_dir / sweep.name;
  if (ranks > 0) {
    std::vector<const Point*> points;
    for (const auto& p : sweep.points) points.push_back(&p);
    check_layouts(sweep, points, ranks, "--ranks; launchers/slurm/submit.sh: --nodes x --ntasks-per-node");
  }
  // not while a sweep run runs these points; a Slurm array's tasks hold only their points' locks
  std::optional<DirLock> lock;
  if (!dry_run)
    lock.emplace(root, "sweep export",
                 "it is running these points here; export once it has ended (Ctrl-C stops its points at a checkpoint)");
  // refused, naming the keys, where a point ran (or was exported) with another configuration
  std::vector<PointState> ps =
      point_states(sweep, RunOptions{}, root, "Remove those points' directories to run them again, or give the sweep a new name");
  if (dry_run) {  // checked as above; nothing written, not even the directory
    std::cout << root.string() << "/points.txt: " << sweep.points.size() << " points (--dry-run: nothing written)"
              << std::endl;
    return 0;
  }
  std::string ids;
  for (const auto& p : ps) {
    make_point_dir(p.dir);
    write_file_atomic(p.dir / "point.json", launch_config(*p.point).dump(2) + "\n");
    ids += p.point->id + "\n";
  }
  // the state sweep run keeps, so that status, plot and report read an exported sweep too:
  // each point pending until its DONE or DIVERGED says otherwise
  write_file_atomic(root / "sweep.json", state_json(ps, sweep).dump(2) + "\n");
  write_file_atomic(root / "points.txt", ids);
  std::cout << root.string() << "/points.txt: " << sweep.points.size() << " points" << std::endl;
  return 0;
}

int print_cluster(const Sweep& sweep) {
  if (const auto c = sweep_cluster(sweep))
    std::cout << c->nodes << " " << c->gpus_per_node << " " << c->instance_type << std::endl;
  return 0;
}

int finish_point(const fs::path& point_dir, int exit_status, double wall_s) {
  const fs::path dir = point_dir.filename().empty() ? point_dir.parent_path() : point_dir;
  const fs::path root = dir.parent_path();
  const json state = read_sweep_state(root);
  const std::string id = dir.filename().string();
  const json* entry = nullptr;
  for (const auto& p : state["points"])
    if (p["id"] == id) entry = &p;
  check(entry != nullptr, dir.string(), ": no point '", id, "' in ", (root / "sweep.json").string(),
        "; give a point directory of an exported sweep (runs/<name>/<id>)");
  const fs::path log = dir / "stdout.log";
  check(fs::exists(log), log.string(), ": no such file; a launcher appends train's output to it (what sweep status ",
        "reads, and what says that train has finished the point)");
  if (exit_status == train::kExitStoppedBySignal) {
    std::cout << id << ": stopped at a checkpoint; it resumes from there when run again" << std::endl;
    return 0;
  }
  if (exit_status == train::kExitDiverged && fs::exists(dir / "DIVERGED")) {
    std::cout << id << ": diverged, " << divergence_reason(dir) << " (a result)" << std::endl;
    return 0;
  }
  if (exit_status != 0) {  // as sweep run says it: the error in full once, then the lines before it
    // a shell's status: 128 + N where signal N ended the program
    const int status = exit_status > 128 && exit_status < 160 ? exit_status - 128 : (exit_status & 0xff) << 8;
    const std::string reason = failure_reason(log, status);
    mark_failed(dir, reason);
    std::cout << id << ": failed: " << reason << "\n  last lines of " << log.string() << ":\n";
    for (const auto& line : last_log_lines(log, 5, reason)) std::cout << "    " << line << "\n";
    std::cout << std::flush;
    return 1;
  }
  const int64_t iters = entry->value("train_iters", int64_t{0});
  const Progress progress = parse_progress(log);
  check(iters == 0 || progress.iteration >= iters, dir.string(), ": train has not finished this point (", log.string(),
        " ends at iteration ", progress.iteration, " of ", iters, "); run it to the end first");
  const std::string keep = state.value("checkpoints", std::string("final"));
  json record = {{"iteration", progress.iteration}, {"lm_loss", progress.loss}};
  if (wall_s > 0) record["wall_s"] = wall_s;
  const int64_t freed = mark_done(dir, keep, record);
  std::cout << id << ": done" << (freed > 0 ? " (" + std::to_string(freed / 1000000) + " MB of checkpoints freed)" : "")
            << std::endl;
  return 0;
}

}  // namespace megabatch::sweeps
