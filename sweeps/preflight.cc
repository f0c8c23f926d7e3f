#include "sweeps/preflight.h"

#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <list>
#include <map>

#include "core/util/dir_lock.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/strings.h"
#include "sweeps/placement.h"
#include "sweeps/run_dir.h"
#include "sweeps/sweep_state.h"

namespace megabatch::sweeps {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
// What train --check said of a point: its error line(s) ("" when it can run) and its warnings.
struct PointCheck {
  std::string error;
  std::vector<std::string> warnings;  // "> warning: ..." lines, without the "> warning: "
};

// train --check of a point's configuration (plugin and its hyperparameters, data files,
// memory), from a temporary copy of it, as the point will run: with --save and --load, and
// a point of more than one rank under `mpirun -np` (its layout checked, its memory per rank).
PointCheck check_point(const fs::path& train, const Point& point, const std::string& mpirun) {
  char path[] = "/tmp/megabatch-check-XXXXXX";
  const int fd = mkstemp(path);
  check(fd >= 0, "cannot make a temporary file to check point ", point.id, ": ", std::strerror(errno));
  const std::string text = point.config.dump();
  const bool wrote = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  std::optional<CommandOutput> r;
  if (wrote) {
    const int ranks = ranks_needed(point.config);
    // with a --save and --load as the sweep gives every point (its checkpoints/), which --check
    // takes as options only: it creates and reads nothing there
    const std::string checkpoints = shell_quote(std::string(path) + ".checkpoints");
    r = read_command((ranks > 1 ? shell_quote(mpirun) + " -np " + std::to_string(ranks) + " " : std::string()) +
                     shell_quote(train.string()) + " --config " + shell_quote(path) + " --save " + checkpoints +
                     " --load " + checkpoints + " --check --threads 1 2>&1");
  }
  ::unlink(path);
  if (!r) return {"could not run train --check", {}};
  // "train: error: ..." or, from each rank of an MPI check, "train (rank N): error: ...":
  // each message once (the ranks of a job mostly say the same), mpirun's own lines left out
  std::vector<std::string> messages, warnings;
  for_each_line(r->text, [&](std::string_view line, size_t) {
    constexpr std::string_view kWarning = "> warning: ";
    if (line.substr(0, kWarning.size()) == kWarning) {
      const std::string said(line.substr(kWarning.size()));
      if (std::find(warnings.begin(), warnings.end(), said) == warnings.end()) warnings.push_back(said);
      return;
    }
    const size_t at = line.find("error: ");
    if (line.substr(0, 5) != "train" || at == std::string_view::npos) return;
    const std::string said(line.substr(at));
    if (std::find(messages.begin(), messages.end(), said) == messages.end()) messages.push_back(said);
  });
  if (r->status == 0) return {"", warnings};
  return {messages.empty() ? "train --check failed: " + r->text : "train: " + join(messages, "; "), warnings};
}

bool selected(const std::string& id, const std::string& only) {
  if (only.empty()) return true;
  return fnmatch(only.c_str(), id.c_str(), 0) == 0 || id.find(only) != std::string::npos;
}

}  // namespace

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
    p.samples = samples_of(p.point->config);
    p.ranks = o.ranks > 0 ? o.ranks : ranks_needed(p.point->config);
    p.global_batch = global_batch_of(p.point->config);
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
    p.damaged = unreadable_result(p);
    if (!p.damaged.empty() && o.rerun_damaged) p.discard = "result lost: " + p.damaged;
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

void discard_rerun_points(std::vector<PointState>& ps, const fs::path& root, const RunOptions& o) {
  auto none = [&](auto marked) { return std::none_of(ps.begin(), ps.end(), marked); };
  const std::string selected_ones = o.only.empty() ? "" : "selected by --only ";
  if (o.rerun_diverged && none([](const PointState& p) { return !p.discard.empty(); }))
    std::cout << "> warning: --rerun diverged: no point " << selected_ones << "has diverged, so none is run again"
              << std::endl;
  if (o.rerun_damaged && none([](const PointState& p) { return !p.damaged.empty(); }))
    std::cout << "> warning: --rerun damaged: the metrics.h5 of every finished point " << selected_ones
              << "reads, so none is run again" << std::endl;
  // Every marked point's lock first: one that a train still runs (a launcher's, Slurm or EKS,
  // holds its lock) refuses the discard at once, naming it, before any point has gone.
  std::list<DirLock> locks;
  for (const auto& p : ps)
    if (!o.dry_run && !p.discard.empty() && fs::symlink_status(p.dir).type() == fs::file_type::directory)
      locks.emplace_back(p.dir, "sweep (discarding the point)",
                         "not removing it while it runs; stop it first (scancel its job, or delete its MPIJob), or "
                         "wait for it to end",
                         0);
  for (auto& p : ps) {
    if (p.discard.empty()) continue;
    if (o.dry_run) {
      std::cout << "  --rerun discards " << p.dir.string() << " (" << p.discard << ")\n";
      continue;
    }
    remove_point_dir(root, p.dir);
    std::cout << "> --rerun: discarded " << p.dir.string() << " (" << p.discard << ")" << std::endl;
    p.state = PointStatus::kPending;
    p.reason.clear();
    p.damaged.clear();
    p.wall_s = 0;
    p.progress = {};
  }
  for (const auto& p : ps)  // left as they are: skipped as finished, their results lost
    if (!p.damaged.empty() && p.discard.empty())
      std::cout << "> warning: " << p.point->id << " finished, but its result is lost: " << p.damaged
                << "; --rerun damaged discards the point and runs it again" << std::endl;
}

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
    for (const char* k : {"lr", "train_iters", "train_samples", "seed"})
      if (p.point->config.contains(k)) diff[k] = p.point->config[k];
    std::cout << "  " << p.point->id << "  " << (p.state == PointStatus::kDone ? "[done] " : "") << diff.dump() << "\n";
    if (!o.train_binary.empty() && p.state != PointStatus::kDone && o.ranks == 0) {  // --ranks: checked in point_states
      std::string error;
      if (!cluster) {
        PointCheck said = check_point(o.train_binary, *p.point, o.mpirun);
        error = said.error;
        for (const std::string& w : said.warnings) {  // the point runs, perhaps not as meant
          const auto [at, first] = first_with.emplace("warning: " + w, p.point->id);
          std::cout << "    warning: " << (first ? w : "as " + at->second + " above") << "\n";
        }
      } else if (const std::string why = layout_problem(p.point->config, cluster->ranks()); !why.empty())
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
              << "run train --check --config POINT/point.json --save POINT/checkpoints where it runs" << std::endl;
  else if (!o.train_binary.empty())
    std::cout << "> every point checked (train --check: plugin and hyperparameters, data, memory)" << std::endl;
  return 0;
}

}  // namespace megabatch::sweeps
