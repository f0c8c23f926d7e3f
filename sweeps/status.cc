#include "sweeps/status.h"

#include <signal.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "core/util/dir_lock.h"
#include "core/util/files.h"
#include "sweeps/run_dir.h"
#include "sweeps/slurm_queue.h"
#include "sweeps/sweep_state.h"
#include "sweeps/table.h"

namespace megabatch::sweeps {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string fmt_bytes(int64_t b) {
  char buf[32];
  const double v = static_cast<double>(b);
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.1f MB", v / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f kB", v / 1e3);
  return buf;
}

// Whether the task that wrote `out` ran the point as it is now: after its point.json was
// written (a point exported again since, as --rerun does, waits for its next task), or
// without one.
bool ran_since_export(const fs::path& out, const fs::path& point_dir) {
  std::error_code ec, ec2;
  const auto exported_at = fs::last_write_time(point_dir / "point.json", ec);
  const auto ran_at = fs::last_write_time(out, ec2);
  return ec || (!ec2 && ran_at >= exported_at);
}

// An exported sweep submitted to Slurm (launchers/slurm/submit.sh): what its queue says of
// each point (task i runs line i+1 of points.txt). A queued or running task's point is so
// named, with its job; a point whose task ran (point.sbatch's output, megabatch-<job>_<i>.out,
// is in the sweep's directory) but is in none now has stopped (scancel, a lost node). One that
// its task left before train logged an iteration (point.sbatch's own refusals: no slurm.env,
// no point.json) is stopped too, with the task's last line, not waiting with nothing to run
// it. A point another launcher started (EKS) stays "started".
void apply_slurm_queue(const fs::path& dir, std::vector<PointState>& ps) {
  const auto queue = slurm_queue(dir);
  if (!queue) return;  // no Slurm here: "started" stays as it is
  std::map<int, std::pair<int64_t, std::string>> ran;  // by task index: the latest job's output file
  static const std::regex task_output(R"(megabatch-(\d{1,18})_(\d{1,9})\.out)");
  std::smatch m;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, task_output)) continue;
    auto& latest = ran[std::stoi(m[2])];
    if (const int64_t job = std::stoll(m[1]); job >= latest.first) latest = {job, name};
  }
  std::map<std::string, int> index_of;
  int index = 0;
  for_each_line(read_file(dir / "points.txt", "the sweep's points"),
                [&](std::string_view id, size_t) { index_of[std::string(id)] = index++; });
  for (auto& p : ps) {
    const auto at = index_of.find(p.point->id);
    if (p.state == PointStatus::kDone || p.state == PointStatus::kDiverged || at == index_of.end()) continue;
    const auto out = ran.find(at->second);
    if (const auto it = queue->find(at->second); it != queue->end()) {
      p.state = it->second.state;
      p.slurm_job = it->second.job;
    } else if (p.state == PointStatus::kStarted && out != ran.end()) {
      p.state = PointStatus::kStopped;  // resumes from its checkpoint when the sweep is submitted again
    } else if (p.state == PointStatus::kPending && out != ran.end() &&
               ran_since_export(dir / out->second.second, p.dir)) {
      p.state = PointStatus::kStopped;
      const auto said = last_log_lines(dir / out->second.second, 1, "");
      p.reason = "its task ended before training (" + out->second.second +
                 "): " + (said.empty() ? std::string("it printed nothing") : said[0]);
    }
  }
}

}  // namespace

int print_status(const fs::path& dir) {
  const json s = read_sweep_state(dir);
  std::vector<Point> points;
  for (const auto& p : s["points"]) points.push_back({p["id"].get<std::string>(), p.value("config", json::object()), {}});
  const pid_t owner = static_cast<pid_t>(s.value("sweep_pid", int64_t{0}));
  const bool live = owner > 0 && ::kill(owner, 0) == 0;  // the sweep that wrote the state still runs
  std::vector<PointState> ps(points.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    const auto& j = s["points"][i];
    ps[i].point = &points[i];
    ps[i].dir = dir / points[i].id;
    ps[i].state = parse_status(j.value("state", "pending"), (dir / "sweep.json").string());
    ps[i].reason = j.value("reason", "");
    ps[i].train_iters = j.value("train_iters", int64_t{0});
    ps[i].progress = parse_progress(ps[i].dir / "stdout.log");
    if (ps[i].state != PointStatus::kRunning || fs::exists(ps[i].dir / "DONE")) read_finished_state(ps[i]);
    else if (!live) ps[i].state = PointStatus::kInterrupted;  // its sweep is gone
    // a point of an exported sweep that its launcher has started: running there, or stopped
    // until it is submitted again (below, where Slurm's queue tells which)
    if (ps[i].state == PointStatus::kPending && ps[i].progress.iteration > 0) ps[i].state = PointStatus::kStarted;
    ps[i].damaged = unreadable_result(ps[i]);
  }
  const bool launched = exported(dir);  // its points run by a launcher
  if (launched) apply_slurm_queue(dir, ps);
  double wall = 0;  // sweep run's record, else (an exported sweep) what its launcher put in DONE
  for (size_t i = 0; i < ps.size(); ++i) {
    const double w = s["points"][i].value("wall_s", 0.0);
    wall += w > 0 ? w : done_wall_s(ps[i].dir);
  }
  // "-" where no time was recorded (an exported sweep's points: their launcher keeps it)
  // launch.sh --sweep's command, where it ran the sweep (a field of another type: none)
  auto launcher = [&](const char* key) {
    const json l = s.value("launcher", json::object());
    return l.is_object() && l.contains(key) && l[key].is_string() ? l[key].get<std::string>() : std::string();
  };
  const std::string rerun_damaged = launched ? "export or submit the sweep again with --rerun damaged"
                                             : run_again(launcher("command"), launcher("cwd"), "--rerun damaged");
  for (const auto& l : table_lines(ps, -1, wall > 0 ? wall : -1, rerun_damaged)) std::cout << l << "\n";
  const DiskUsage used = disk_usage(dir);
  int64_t prunable = 0;  // what prune_sweep frees
  for (const auto& pd : finished_point_dirs(dir, s)) prunable += prunable_checkpoint_bytes(pd / "checkpoints", "final");
  std::cout << "disk: " << fmt_bytes(used.total) << " in " << dir.string() << " (checkpoints "
            << fmt_bytes(used.checkpoints) << "; "
            << (prunable > 0 ? "sweep prune " + dir.string() + " frees " + fmt_bytes(prunable) +
                                   " of them, keeping each finished point's final checkpoint)"
                             : "none that sweep prune would free)")
            << "\n";
  return 0;
}

int prune_sweep(const fs::path& dir) {
  // Not while a sweep run uses the directory: a point it reruns (--rerun diverged) starts
  // again in a directory this read as finished, and would lose the checkpoint it resumes from.
  std::optional<DirLock> lock;
  if (fs::is_directory(dir))
    lock.emplace(dir, "sweep prune",
                 "a running sweep already keeps only the final checkpoint of each point it finishes (unless the "
                 "sweep says \"checkpoints\": \"all\"); prune once it has ended");
  const json s = read_sweep_state(dir);
  const DiskUsage before = disk_usage(dir);
  int64_t freed = 0;
  int pruned = 0;
  for (const auto& pd : finished_point_dirs(dir, s)) {
    const int64_t f = prune_checkpoints(pd / "checkpoints", "final");
    freed += f;
    pruned += f > 0;
  }
  std::cout << dir.string() << ": freed " << fmt_bytes(freed) << " in " << pruned << " point(s); "
            << fmt_bytes(before.total - freed) << " left (finished points keep their final checkpoint)" << std::endl;
  return 0;
}

}  // namespace megabatch::sweeps
