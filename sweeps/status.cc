#include "sweeps/status.h"

#include <signal.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "core/util/dir_lock.h"
#include "sweeps/run_dir.h"
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
    ps[i].state = j.value("state", "pending");
    ps[i].reason = j.value("reason", "");
    ps[i].train_iters = j.value("train_iters", int64_t{0});
    ps[i].progress = parse_progress(ps[i].dir / "stdout.log");
    if (ps[i].state != "running" || fs::exists(ps[i].dir / "DONE")) read_finished_state(ps[i]);
    else if (!live) ps[i].state = "interrupted";  // its sweep is gone
    // a point of an exported sweep that its launcher (a Slurm array task) has started: running
    // there, or stopped until it is submitted again; this machine cannot tell which
    if (ps[i].state == "pending" && ps[i].progress.iteration > 0) ps[i].state = "started";
  }
  double wall = 0;  // sweep run's record, else (an exported sweep) what its launcher put in DONE
  for (size_t i = 0; i < ps.size(); ++i) {
    const double w = s["points"][i].value("wall_s", 0.0);
    wall += w > 0 ? w : done_wall_s(ps[i].dir);
  }
  // "-" where no time was recorded (an exported sweep's points: their launcher keeps it)
  for (const auto& l : table_lines(ps, -1, wall > 0 ? wall : -1)) std::cout << l << "\n";
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
