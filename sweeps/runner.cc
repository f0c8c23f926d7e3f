#include "sweeps/runner.h"

#include "sweeps/placement.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "core/io/checkpoint.h"
#include "core/train/exit_status.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/strings.h"

namespace megabatch::sweeps {
namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop(int) { g_stop = 1; }

void write_atomic(const fs::path& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tail(const fs::path& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff from = size > static_cast<std::streamoff>(bytes) ? size - static_cast<std::streamoff>(bytes) : 0;
  in.seekg(from);
  std::string s(static_cast<size_t>(size - from), '\0');
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  return s;
}

// The mark of a point directory made by the sweep tool: nothing without it is deleted.
constexpr const char* kPointMark = ".megabatch-point";

void make_point_dir(const fs::path& dir) {
  fs::create_directories(dir);
  if (!fs::exists(fs::symlink_status(dir / kPointMark))) write_atomic(dir / kPointMark, "made by megabatch sweep\n");
}

// Removes a point directory (--rerun): only a real directory (not a symlink) directly in
// the sweep's run directory, carrying the mark; remove_all does not follow the symlinks
// inside it. Anything else is an error that says why.
void remove_point_dir(const fs::path& root, const fs::path& dir) {
  const std::string name = dir.filename().string();
  check(dir.parent_path() == root && !name.empty() && name != "." && name != "..", "not removing ", dir.string(),
        ": not a point directory of ", root.string());
  const auto st = fs::symlink_status(dir);
  if (st.type() == fs::file_type::not_found) return;
  check(st.type() == fs::file_type::directory, "not removing ", dir.string(),
        ": it is a symlink or not a directory; the sweep tool deletes only what it made (remove it yourself)");
  check(fs::symlink_status(dir / kPointMark).type() == fs::file_type::regular, "not removing ", dir.string(),
        ": it has no ", kPointMark, " mark, so the sweep tool did not make it (remove it yourself, or give the sweep a new name)");
  fs::remove_all(dir);
}

}  // namespace

namespace {

// How many of dir's newest checkpoints policy `keep` leaves; -1 when it touches none ("all",
// or dir is not a directory the run made: a symlink, or missing).
int checkpoints_kept(const fs::path& dir, const std::string& keep) {
  if (keep == "all" || fs::symlink_status(dir).type() != fs::file_type::directory) return -1;
  return keep == "final" ? 1 : 0;
}

}  // namespace

int64_t prune_checkpoints(const fs::path& dir, const std::string& keep) {
  const int k = checkpoints_kept(dir, keep);
  return k < 0 ? 0 : io::remove_old_checkpoints(dir, k);
}

namespace {

// Keys that cannot change a point's results: where plugins are searched, threads, where
// and how often checkpoints are written, extra outputs.
const std::set<std::string> kResultNeutral = {"plugin_path", "threads", "tensorboard_dir", "skip_memory_check",
                                              "save_interval", "keep_checkpoints", "overlap_grad_reduce"};

// The keys whose values differ between the configuration the point in `dir` ran with
// (its point.json) and `config`, as "key: old -> new"; empty when it has not run or only
// result-neutral keys differ.
std::vector<std::string> config_changes(const fs::path& dir, const json& config) {
  if (!fs::exists(dir / "point.json")) return {};
  json old;
  try {
    old = json::parse(read_text(dir / "point.json"));
  } catch (const std::exception&) {
    return {"point.json unreadable"};
  }
  std::vector<std::string> out;
  auto text = [](const json& o, const std::string& k) { return o.contains(k) ? o[k].dump() : std::string("unset"); };
  std::set<std::string> keys;
  for (const auto& [k, v] : old.items()) keys.insert(k);
  for (const auto& [k, v] : config.items()) keys.insert(k);
  for (const auto& k : keys) {
    if (kResultNeutral.count(k)) continue;
    if (old.contains(k) && config.contains(k) && old[k] == config[k]) continue;
    out.push_back(k + ": " + text(old, k) + " -> " + text(config, k));
  }
  return out;
}

bool ran_with_other_config(const fs::path& dir, const json& config) { return !config_changes(dir, config).empty(); }

// train --check of a point's configuration (plugin and its hyperparameters, data files,
// memory), from a temporary copy of it; "" when fine, else train's error line(s).
std::string check_point(const fs::path& train, const Point& point) {
  char path[] = "/tmp/megabatch-check-XXXXXX";
  const int fd = mkstemp(path);
  check(fd >= 0, "cannot make a temporary file to check point ", point.id, ": ", std::strerror(errno));
  const std::string text = point.config.dump();
  const bool wrote = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  std::string out;
  if (wrote) {
    const std::string cmd = shell_quote(train.string()) + " --config " + shell_quote(path) + " --check --threads 1 2>&1";
    if (std::FILE* pipe = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
      const int rc = ::pclose(pipe);
      ::unlink(path);
      if (WIFEXITED(rc) && WEXITSTATUS(rc) == 0) return "";
      std::string errors;
      for_each_line(out, [&](std::string_view line, size_t) {
        if (line.find("error") != std::string_view::npos) errors += (errors.empty() ? "" : "; ") + std::string(line);
      });
      return errors.empty() ? "train --check failed: " + out : errors;
    }
  }
  ::unlink(path);
  return "could not run train --check";
}

// Progress from a point's log: the last iteration line's iteration and lm loss.
struct Progress {
  int64_t iteration = 0;
  double loss = 0;
  bool has_loss = false;
  double valid_loss = 0;
  bool has_valid = false;
};

Progress parse_progress(const fs::path& log) {
  Progress p;
  const std::string t = tail(log, 16384);
  // Megatron's line: " [date time] iteration      100/     320 | ... | lm loss: 7.1E+00 | ..."
  const std::string mark = "] iteration ";
  size_t at = t.rfind(mark);
  while (at != std::string::npos) {
    const size_t eol = t.find('\n', at);
    const std::string line = t.substr(at, eol == std::string::npos ? std::string::npos : eol - at);
    const size_t slash = line.find('/');
    const size_t loss = line.find("lm loss: ");
    if (slash != std::string::npos && loss != std::string::npos && eol != std::string::npos) {
      p.iteration = std::atoll(line.substr(mark.size(), slash - mark.size()).c_str());
      p.loss = std::atof(line.c_str() + loss + 9);
      p.has_loss = true;
      break;
    }
    if (at == 0) break;
    at = t.rfind(mark, at - 1);
  }
  // the result: the evaluation after training on the validation set (not the test set's line after it)
  size_t v = t.rfind("on validation set | lm loss value: ");
  if (v != std::string::npos) v += std::strlen("on validation set | ");
  if (v != std::string::npos) {
    p.valid_loss = std::atof(t.c_str() + v + 15);
    p.has_valid = true;
  }
  return p;
}

// Why a point failed, from its log: the last line that says "error".
std::string failure_reason(const fs::path& log, int status) {
  std::string t = tail(log, 8192);
  std::string reason;
  for_each_line(t, [&](std::string_view line, size_t) {
    if (line.find("error") != std::string_view::npos) reason = std::string(line);
  });
  if (!reason.empty()) return reason;
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "exit status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

std::string divergence_reason(const fs::path& dir) {
  try {
    const json d = json::parse(read_text(dir / "DIVERGED"));
    return "iteration " + std::to_string(d.value("iteration", int64_t{0})) + ": " + d.value("reason", std::string("?"));
  } catch (const std::exception&) {
    return "diverged (DIVERGED unreadable)";
  }
}

struct PointState {
  const Point* point = nullptr;
  fs::path dir;
  std::string state = "pending";  // pending, running, done, diverged, failed, interrupted, skipped
  std::string reason;
  std::string discard;  // why --rerun discards the point's directory ("": kept)
  int attempts = 0;
  double wall_s = 0;  // over every attempt and invocation
  int64_t train_iters = 0, global_batch = 0;
  pid_t pid = -1;
  Clock::time_point started;
  Progress progress;
  int ranks = 1;          // processes (and with --gpus, GPUs) the point needs
  std::vector<int> gpus;  // the GPUs it holds while running
};

// A point's end as its directory records it: DONE (done) or DIVERGED (diverged, with the
// reason); otherwise the state is left as it is.
void read_finished_state(PointState& p) {
  if (fs::exists(p.dir / "DONE")) {
    p.state = "done";
  } else if (fs::exists(p.dir / "DIVERGED")) {
    p.state = "diverged";
    p.reason = divergence_reason(p.dir);
  }
}

int64_t iters_of(const json& c) {
  if (c.contains("train_iters")) return c["train_iters"].get<int64_t>();
  const int64_t B = c.contains("global_batch_size") ? c["global_batch_size"].get<int64_t>() : 1;
  return c.contains("train_samples") ? c["train_samples"].get<int64_t>() / B : 0;
}

// Samples of a point's work that are behind it: all of them once it is done or diverged
// (a diverged point stops early: nothing of it is left to do).
int64_t work_of(const PointState& p) {
  if (p.state == "done" || p.state == "diverged") return p.train_iters * p.global_batch;
  return p.progress.iteration * p.global_batch;
}

json state_json(const std::vector<PointState>& ps, const Sweep& s) {
  json points = json::array();
  for (const auto& p : ps)
    points.push_back({{"id", p.point->id}, {"state", p.state}, {"reason", p.reason}, {"attempts", p.attempts},
                      {"wall_s", p.wall_s}, {"train_iters", p.train_iters}, {"global_batch_size", p.global_batch},
                      {"iteration", p.progress.iteration}, {"ranks", p.ranks}, {"gpus", p.gpus},
                      {"config", p.point->config}});
  return {{"name", s.name}, {"file", fs::absolute(s.file).string()}, {"sweep_pid", static_cast<int64_t>(getpid())},
          {"points", points}};
}

std::string fmt_duration(double s) {
  char buf[32];
  if (s < 0 || !std::isfinite(s)) return "-";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600), static_cast<long long>(t % 3600 / 60));
  else
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  return buf;
}

// elapsed < 0: a status report, where `eta` holds the points' total wall time instead.
std::vector<std::string> table_lines(const std::vector<PointState>& ps, double elapsed, double eta) {
  int done = 0, running = 0, failed = 0, pending = 0, diverged = 0;
  for (const auto& p : ps) {
    done += p.state == "done";
    diverged += p.state == "diverged";
    running += p.state == "running";
    failed += p.state == "failed";
    pending += p.state == "pending" || p.state == "interrupted";
  }
  std::vector<std::string> out;
  char buf[512];
  if (elapsed >= 0)
    std::snprintf(buf, sizeof buf, "sweep: %d done, %d diverged, %d running, %d failed, %d waiting | elapsed %s | ETA %s",
                  done, diverged, running, failed, pending, fmt_duration(elapsed).c_str(), fmt_duration(eta).c_str());
  else
    std::snprintf(buf, sizeof buf, "sweep: %d done, %d diverged, %d running, %d failed, %d waiting | point time %s", done,
                  diverged, running, failed, pending, fmt_duration(eta).c_str());
  out.push_back(buf);
  size_t w = 5;
  for (const auto& p : ps) w = std::max(w, p.point->id.size());
  for (const auto& p : ps) {
    if (p.state == "skipped") continue;
    std::string detail;
    if (p.progress.has_loss) {
      std::snprintf(buf, sizeof buf, "iter %lld/%lld  lm loss %.4f", static_cast<long long>(p.progress.iteration),
                    static_cast<long long>(p.train_iters), p.progress.loss);
      detail = buf;
    }
    if (p.progress.has_valid && p.state == "done") {
      std::snprintf(buf, sizeof buf, "  final valid loss %.4f", p.progress.valid_loss);
      detail += buf;
    }
    if (p.state == "failed" || p.state == "diverged") detail = p.reason;
    if (!p.gpus.empty()) detail = "gpu " + gpu_list(p.gpus) + "  " + detail;
    std::snprintf(buf, sizeof buf, "  %-*s  %-11s %s", static_cast<int>(w), p.point->id.c_str(), p.state.c_str(),
                  detail.c_str());
    out.push_back(buf);
  }
  return out;
}

// Columns of the terminal on stdout (80 when unknown).
size_t terminal_width() {
  winsize w{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  return 80;
}

// A line of the live table cut to `width` columns (a redrawn line that wraps would break
// the redraw): the end becomes "..." when cut. UTF-8 continuation bytes take no column.
std::string fit_width(const std::string& line, size_t width) {
  std::vector<size_t> starts;  // byte offset of each character
  for (size_t i = 0; i < line.size(); ++i)
    if ((static_cast<unsigned char>(line[i]) & 0xC0) != 0x80) starts.push_back(i);
  if (starts.size() <= width) return line;
  const size_t keep = width > 3 ? width - 3 : width;
  return line.substr(0, starts[keep]) + (width > 3 ? "..." : "");
}

bool selected(const std::string& id, const std::string& only) {
  if (only.empty()) return true;
  return fnmatch(only.c_str(), id.c_str(), 0) == 0 || id.find(only) != std::string::npos;
}

}  // namespace

int run_sweep(const Sweep& sweep, const RunOptions& o) {
  const fs::path root = o.runs_dir / sweep.name;
  // The previous state, if any: configurations that points ran with.
  std::map<std::string, json> previous;
  if (fs::exists(root / "sweep.json")) {
    try {
      const json old = json::parse(read_text(root / "sweep.json"));
      for (const auto& p : old["points"]) previous[p["id"].get<std::string>()] = p;
    } catch (const std::exception& e) {
      fail((root / "sweep.json").string(), ": unreadable (", e.what(), "); move it away to start the sweep afresh");
    }
  }
  std::vector<PointState> ps(sweep.points.size());
  std::vector<std::string> changes;  // "id (key: old -> new, ...)" of points that ran with another configuration
  for (size_t i = 0; i < ps.size(); ++i) {
    PointState& p = ps[i];
    p.point = &sweep.points[i];
    p.dir = root / p.point->id;
    p.train_iters = iters_of(p.point->config);
    p.ranks = ranks_needed(p.point->config);
    p.global_batch = p.point->config.contains("global_batch_size") ? p.point->config["global_batch_size"].get<int64_t>()
                                                                   : p.point->config.value("micro_batch_size", int64_t{8});
    if (!selected(p.point->id, o.only)) {
      p.state = "skipped";
      continue;
    }
    if (auto it = previous.find(p.point->id); it != previous.end()) p.wall_s = it->second.value("wall_s", 0.0);
    if (const auto diff = config_changes(p.dir, p.point->config); !diff.empty()) {
      changes.push_back(p.point->id + " (" + join(diff, ", ") + ")");
      p.discard = "its configuration changed";
    }
    read_finished_state(p);
    if (p.state == "diverged" && o.rerun_diverged) p.discard = p.reason;
    p.progress = parse_progress(p.dir / "stdout.log");
  }
  if (!changes.empty() && !o.rerun_changed)
    fail(sweep.file.string(), ": the configuration of ", changes.size(), " point(s) that already ran differs from ",
         "this file: ", join(changes, "; "), ". Results of two configurations are not mixed (keys that cannot change "
         "results, such as plugin_path and threads, are not compared). Run with --rerun to ",
         "discard those points and run them again, or give the sweep a new name");
  for (auto& p : ps) {  // --rerun (changed) and --rerun diverged
    if (p.discard.empty()) continue;
    if (o.dry_run) {
      std::cout << "  --rerun discards " << p.dir.string() << " (" << p.discard << ")\n";
      continue;
    }
    remove_point_dir(root, p.dir);
    p.state = "pending";
    p.reason.clear();
    p.wall_s = 0;
    p.progress = {};
  }
  if (!o.gpus.empty()) {  // every point must fit on the GPUs it may use
    std::vector<std::string> too_big;
    for (const auto& p : ps)
      if (p.state != "skipped" && static_cast<size_t>(p.ranks) > o.gpus.size())
        too_big.push_back(p.point->id + " needs " + std::to_string(p.ranks));
    if (!too_big.empty())
      fail(sweep.file.string(), ": ", too_big.size(), " point(s) need more GPUs (tensor_model_parallel_size x ",
           "data_parallel_size) than --gpus gives (", o.gpus.size(), "): ", join(too_big, "; "),
           ". Give more GPUs, or make those points smaller");
  }
  if (o.dry_run) {
    std::cout << sweep.name << ": " << sweep.points.size() << " points (runs in " << root.string() << ")\n";
    int bad = 0;
    // A sweep sized for a cluster ("cluster" in its file) has its data and memory there:
    // its points are checked where they run (train --check), not on this machine.
    const bool sized_elsewhere = sweep.spec.contains("cluster");
    for (const auto& p : ps) {
      if (p.state == "skipped") continue;
      json diff = json::object();
      for (const auto& k : p.point->swept)
        if (p.point->config.contains(k)) diff[k] = p.point->config[k];
      for (const char* k : {"lr", "train_iters", "seed"})
        if (p.point->config.contains(k)) diff[k] = p.point->config[k];
      std::cout << "  " << p.point->id << "  " << (p.state == "done" ? "[done] " : "") << diff.dump() << "\n";
      if (!o.train_binary.empty() && p.state != "done" && !sized_elsewhere) {
        const std::string error = check_point(o.train_binary, *p.point);
        if (!error.empty()) {
          ++bad;
          std::cout << "    cannot run: " << error << "\n";
        }
      }
    }
    std::cout << std::flush;
    if (bad) {
      std::cout << "> " << bad << " point(s) cannot run (above); fix the sweep file" << std::endl;
      return 2;
    }
    if (sized_elsewhere)
      std::cout << "> sized for " << sweep.spec["cluster"].dump() << ": data and memory are not checked on this machine; "
                << "run train --check --config <point.json> where it runs" << std::endl;
    else if (!o.train_binary.empty())
      std::cout << "> every point checked (train --check: plugin and hyperparameters, data, memory)" << std::endl;
    return 0;
  }

  fs::create_directories(root);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  int threads = o.threads ? o.threads : sweep.threads;
  if (!threads) threads = 1;
  int jobs = o.jobs ? o.jobs : sweep.jobs;
  if (!jobs) jobs = o.gpus.empty() ? std::max(1, static_cast<int>(cores) / threads) : static_cast<int>(o.gpus.size());
  GpuPlacer placer(o.gpus);
  std::cout << "> sweep " << sweep.name << ": " << sweep.points.size() << " points, " << jobs << " at a time, "
            << threads << " thread(s) each" << (o.gpus.empty() ? "" : " on GPUs " + gpu_list(o.gpus))
            << "; runs in " << root.string() << std::endl;

  g_stop = 0;
  auto old_int = std::signal(SIGINT, on_stop);
  auto old_term = std::signal(SIGTERM, on_stop);
  auto save_state = [&] { write_atomic(root / "sweep.json", state_json(ps, sweep).dump(2) + "\n"); };
  save_state();

  const auto t0 = Clock::now();
  int64_t work_done_at_start = 0, work_total = 0;
  for (const auto& p : ps) {
    if (p.state == "skipped") continue;
    work_total += p.train_iters * p.global_batch;
    work_done_at_start += work_of(p);
  }
  size_t printed = 0;
  auto last_plain = Clock::now();
  auto display = [&](bool force) {
    double work_now = 0;
    bool open = false;  // points still to run or running
    for (const auto& p : ps)
      if (p.state != "skipped") {
        work_now += static_cast<double>(work_of(p));
        open = open || p.state == "running" || p.state == "pending" || p.state == "interrupted" ||
               (p.state == "failed" && p.attempts <= o.retries);
      }
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    const double gained = work_now - static_cast<double>(work_done_at_start);
    const double eta = !open ? 0.0 : gained > 0 ? elapsed * (static_cast<double>(work_total) - work_now) / gained : -1;
    const auto lines = table_lines(ps, elapsed, eta);
    if (o.tty) {
      if (printed) std::cout << "\033[" << printed << "A";
      const size_t width = terminal_width();
      for (const auto& l : lines) std::cout << "\r\033[K" << fit_width(l, width) << "\n";
      printed = lines.size();
      std::cout << std::flush;
    } else if (force || Clock::now() - last_plain > std::chrono::seconds(30)) {
      std::cout << lines.front() << std::endl;
      last_plain = Clock::now();
    }
  };
  auto start_point = [&](PointState& p) {
    make_point_dir(p.dir);
    write_atomic(p.dir / "point.json", p.point->config.dump(2) + "\n");
    const fs::path ckpt = p.dir / "checkpoints";
    const int64_t save_interval = std::max<int64_t>(1, p.train_iters / 10);
    std::vector<std::string> args;
    if (p.ranks > 1) args = {o.mpirun, "-np", std::to_string(p.ranks)};  // one process per rank (and GPU)
    args.insert(args.end(), {o.train_binary.string(), "--config", (p.dir / "point.json").string(),
                                     "--run-dir", p.dir.string(), "--save", ckpt.string(), "--load", ckpt.string(),
                                     "--threads", std::to_string(threads)});
    if (!p.point->config.contains("save_interval")) args.insert(args.end(), {"--save-interval", std::to_string(save_interval)});
    if (!p.point->config.contains("keep_checkpoints")) args.insert(args.end(), {"--keep-checkpoints", "2"});
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
      if (p.ranks > 1) std::printf("> sweep: %d ranks: %s -np %d\n", p.ranks, o.mpirun.c_str(), p.ranks);
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
    p.state = "running";
    p.started = Clock::now();
    ++p.attempts;
    if (!o.tty)
      std::cout << "> start " << p.point->id << " (attempt " << p.attempts << ")"
                << (p.gpus.empty() ? "" : " on GPU" + std::string(p.gpus.size() > 1 ? "s " : " ") + gpu_list(p.gpus))
                << std::endl;
  };

  int failed_total = 0, diverged_total = 0;
  while (true) {
    int running = 0;
    for (auto& p : ps) running += p.state == "running";
    if (!g_stop)
      for (auto& p : ps) {
        if (running >= jobs) break;
        const bool retry = p.state == "failed" && p.attempts <= o.retries;
        if (p.state == "pending" || p.state == "interrupted" || retry) {
          if (!o.gpus.empty()) {
            p.gpus = placer.take(p.ranks);
            if (p.gpus.empty()) continue;  // waits for GPUs; a later, smaller point may start
          }
          try {
            start_point(p);
            ++running;
          } catch (const std::exception& e) {  // its directory unwritable, say: this point fails, the sweep goes on
            p.state = "failed";
            p.attempts = o.retries + 1;  // the file system will not change by retrying at once
            p.reason = std::string("cannot start: ") + e.what();
            placer.give_back(p.gpus);
            p.gpus.clear();
            std::cout << (o.tty ? "" : "> ") << "failed " << p.point->id << ": " << p.reason << std::endl;
            printed = 0;
          }
          save_state();
        }
      }
    if (running == 0) break;
    // reap
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& p : ps) {
        if (p.pid != pid) continue;
        p.pid = -1;
        placer.give_back(p.gpus);
        p.gpus.clear();
        p.wall_s += std::chrono::duration<double>(Clock::now() - p.started).count();
        p.progress = parse_progress(p.dir / "stdout.log");
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
          p.state = "done";
          p.reason.clear();
          prune_checkpoints(p.dir / "checkpoints", sweep.checkpoints);
          write_atomic(p.dir / "DONE", json({{"wall_s", p.wall_s}, {"iteration", p.progress.iteration},
                                             {"lm_loss", p.progress.loss}})
                                               .dump() +
                                           "\n");
          if (!o.tty) std::cout << "> done " << p.point->id << " (" << fmt_duration(p.wall_s) << ")" << std::endl;
        } else if (WIFEXITED(status) && WEXITSTATUS(status) == train::kExitDiverged) {
          p.state = "diverged";
          p.reason = divergence_reason(p.dir);
          std::cout << (o.tty ? "" : "> ") << "diverged " << p.point->id << ": " << p.reason << std::endl;
          printed = 0;
        } else if (WIFEXITED(status) && WEXITSTATUS(status) == train::kExitStoppedBySignal) {
          p.state = "interrupted";
          if (!o.tty) std::cout << "> interrupted " << p.point->id << " (resumable)" << std::endl;
        } else {
          p.state = "failed";
          p.reason = failure_reason(p.dir / "stdout.log", status);
          std::cout << (o.tty ? "" : "> ") << "failed " << p.point->id << ": " << p.reason << "\n  last lines of "
                    << (p.dir / "stdout.log").string() << ":\n";
          std::string t = tail(p.dir / "stdout.log", 1500);
          std::vector<std::string> lines;
          for_each_line(t, [&](std::string_view l, size_t) { lines.emplace_back(l); });
          // the error in full once (above), then what led to it
          std::erase(lines, p.reason);
          for (size_t k = lines.size() > 5 ? lines.size() - 5 : 0; k < lines.size(); ++k)
            std::cout << "    " << lines[k] << "\n";
          std::cout << std::flush;
          printed = 0;
        }
        save_state();
      }
    }
    if (g_stop) {  // forward the stop: every running point checkpoints and exits 3
      for (auto& p : ps)
        if (p.state == "running" && p.pid > 0) ::kill(p.pid, SIGTERM);
    }
    for (auto& p : ps)
      if (p.state == "running") p.progress = parse_progress(p.dir / "stdout.log");
    display(false);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  for (const auto& p : ps) failed_total += p.state == "failed", diverged_total += p.state == "diverged";
  save_state();
  display(true);
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);
  if (g_stop) {
    std::cout << "> stopped; every point is resumable: run the same command again" << std::endl;
    return 130;
  }
  if (diverged_total)
    std::cout << "> " << diverged_total << " point(s) diverged (a result, not retried; --rerun diverged runs them again)"
              << std::endl;
  if (failed_total) {
    std::cout << "> " << failed_total << " point(s) failed; their logs are in " << root.string()
              << "/<id>/stdout.log (rerun to retry them, or --retries N)" << std::endl;
    return 1;
  }
  std::cout << "> all points done; plot with: sweep plot " << root.string() << std::endl;
  return 0;
}

int export_points(const Sweep& sweep, const fs::path& runs_dir) {
  const fs::path root = runs_dir / sweep.name;
  std::string ids;
  for (const auto& p : sweep.points) {
    const fs::path dir = root / p.id;
    check(!ran_with_other_config(dir, p.config), (dir / "point.json").string(),
          ": this point already ran with another configuration; give the sweep a new name or remove ", dir.string());
    make_point_dir(dir);
    write_atomic(dir / "point.json", p.config.dump(2) + "\n");
    ids += p.id + "\n";
  }
  write_atomic(root / "points.txt", ids);
  std::cout << root.string() << "/points.txt: " << sweep.points.size() << " points" << std::endl;
  return 0;
}

namespace {

// Bytes of regular files under `dir`, not following symlinks; and of those under */checkpoints/.
std::pair<int64_t, int64_t> disk_usage(const fs::path& dir) {
  int64_t total = 0, ckpt = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->symlink_status(ec).type() != fs::file_type::regular) continue;
    const auto size = static_cast<int64_t>(it->file_size(ec));
    if (ec) continue;
    total += size;
    if (it->path().parent_path().filename() == "checkpoints") ckpt += size;
  }
  return {total, ckpt};
}

std::string fmt_bytes(int64_t b) {
  char buf[32];
  const double v = static_cast<double>(b);
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.1f MB", v / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f kB", v / 1e3);
  return buf;
}

// The directories of finished (done or diverged) points that the sweep tool made, never
// through a symlink: what sweep prune may thin out. A running point keeps its checkpoints.
std::vector<fs::path> finished_point_dirs(const fs::path& dir, const json& sweep) {
  std::vector<fs::path> out;
  for (const auto& p : sweep["points"]) {
    const fs::path pd = dir / p["id"].get<std::string>();
    if (fs::symlink_status(pd).type() != fs::file_type::directory ||
        fs::symlink_status(pd / kPointMark).type() != fs::file_type::regular)
      continue;
    if (fs::exists(pd / "DONE") || fs::exists(pd / "DIVERGED")) out.push_back(pd);
  }
  return out;
}

}  // namespace

int prune_sweep(const fs::path& dir) {
  const json s = json::parse(read_text(dir / "sweep.json"));
  const auto before = disk_usage(dir);
  int64_t freed = 0;
  int pruned = 0;
  for (const auto& pd : finished_point_dirs(dir, s)) {
    const int64_t f = prune_checkpoints(pd / "checkpoints", "final");
    freed += f;
    pruned += f > 0;
  }
  std::cout << dir.string() << ": freed " << fmt_bytes(freed) << " in " << pruned << " point(s); "
            << fmt_bytes(before.first - freed) << " left (finished points keep their final checkpoint)" << std::endl;
  return 0;
}

int print_status(const fs::path& dir) {
  const fs::path file = dir / "sweep.json";
  check(fs::exists(file), file.string(), ": no sweep here (sweep run writes runs/<name>/sweep.json)");
  const json s = json::parse(read_text(file));
  std::vector<Point> points;
  for (const auto& p : s["points"]) points.push_back({p["id"].get<std::string>(), p["config"], {}});
  std::vector<PointState> ps(points.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    const auto& j = s["points"][i];
    ps[i].point = &points[i];
    ps[i].dir = dir / points[i].id;
    ps[i].state = j.value("state", "pending");
    ps[i].reason = j.value("reason", "");
    ps[i].train_iters = j.value("train_iters", int64_t{0});
    ps[i].progress = parse_progress(ps[i].dir / "stdout.log");
    const pid_t owner = static_cast<pid_t>(s.value("sweep_pid", int64_t{0}));
    const bool live = owner > 0 && ::kill(owner, 0) == 0;
    if (ps[i].state != "running" || fs::exists(ps[i].dir / "DONE")) read_finished_state(ps[i]);
    else if (!live) ps[i].state = "interrupted";  // its sweep is gone
  }
  double wall = 0;
  for (const auto& p : s["points"]) wall += p.value("wall_s", 0.0);
  for (const auto& l : table_lines(ps, -1, wall)) std::cout << l << "\n";
  const auto [total, ckpt] = disk_usage(dir);
  int64_t prunable = 0;
  for (const auto& pd : finished_point_dirs(dir, s))  // what prune_sweep's prune_checkpoints(.., "final") frees
    if (const int k = checkpoints_kept(pd / "checkpoints", "final"); k >= 0)
      prunable += io::old_checkpoint_bytes(pd / "checkpoints", k);
  std::cout << "disk: " << fmt_bytes(total) << " in " << dir.string() << " (checkpoints " << fmt_bytes(ckpt) << "; "
            << (prunable > 0 ? "sweep prune " + dir.string() + " frees " + fmt_bytes(prunable) +
                                   " of them, keeping each finished point's final checkpoint)"
                             : "none that sweep prune would free)")
            << "\n";
  return 0;
}

}  // namespace megabatch::sweeps
