#include "sweeps/handoff.h"

#include <iostream>
#include <optional>

#include "core/train/exit_status.h"
#include "core/util/dir_lock.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "sweeps/preflight.h"
#include "sweeps/run_dir.h"
#include "sweeps/sweep_state.h"

namespace megabatch::sweeps {
namespace fs = std::filesystem;
using nlohmann::json;

int export_points(const Sweep& sweep, const RunOptions& o) {
  const fs::path root = o.runs_dir / sweep.name;
  if (o.ranks > 0) {
    std::vector<const Point*> points;
    for (const auto& p : sweep.points) points.push_back(&p);
    check_layouts(sweep, points, o.ranks, "--ranks: nodes x ranks per node");
  }
  // not while a sweep run runs these points; a Slurm array's tasks hold only their points' locks
  std::optional<DirLock> lock;
  if (!o.dry_run)
    lock.emplace(root, "sweep export",
                 "it is running these points here; export once it has ended (Ctrl-C stops its points at a checkpoint)");
  // refused, naming the keys, where a point ran (or was exported) with another configuration,
  // unless --rerun; the layouts are checked above, for every point
  RunOptions states = o;
  states.ranks = 0;
  std::vector<PointState> ps =
      point_states(sweep, states, root,
                   "Export with --rerun to discard those points and run them again, or give the sweep a new name");
  discard_rerun_points(ps, root, o);
  if (o.dry_run) {  // checked as above; nothing written, not even the directory
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
  if (exit_status == train::kExitStopped) {
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
