// sweep: run a sweep file's points (with resume), show their status, plot and report.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "core/device/runtime.h"
#include "core/util/args.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/strings.h"
#include "sweeps/export.h"
#include "sweeps/placement.h"
#include "sweeps/run_dir.h"
#include "sweeps/handoff.h"
#include "sweeps/runner.h"
#include "sweeps/status.h"
#include "sweeps/sweep.h"

namespace mb = megabatch;
namespace fs = std::filesystem;

namespace {

const char* kUsage =
    "usage: sweep run FILE.json [--dry-run] [--only PATTERN] [--retries N] [--jobs N] [--threads N] [--gpus all|0,1,...] [--rerun [changed|diverged|damaged]]\n"
    "                           [--ranks N] [--runs-dir DIR]\n"
    "       sweep status DIR      the table of a sweep's points (DIR = runs/<name>)\n"
    "       sweep export-points FILE.json [--runs-dir DIR] [--ranks N] [--cluster] [--dry-run] [--rerun [changed|diverged|damaged]]\n"
    "                             points.txt and point.json files for other launchers (--ranks: each point checked to\n"
    "                             fit a job of N ranks; --rerun: as sweep run's, the points' directories discarded)\n"
    "       sweep export DIR [--csv FILE] [--tensorboard OUT]  a sweep's metrics as one long CSV table\n"
    "                             (point, axes, step, samples, metric, value) and TensorBoard event files\n"
    "       sweep plot DIR [DIR...]   figures (PNG and SVG) in DIR/figures (several sweeps: overlaid, in\n"
    "                             the first DIR's figures-overlay)\n"
    "       sweep analyze DIR [DIR...] [--targets L1,L2]  the critical batch size: steps and samples to target\n"
    "                             losses, the S-E frontier fit, B_crit against the gradient noise scale (several\n"
    "                             sweeps: side by side, in the first DIR's figures-overlay)\n"
    "       sweep report DIR      DIR/report.html: result table, critical batch size, diverged points, figures\n"
    "       sweep prune DIR       delete all but the final checkpoint of finished points (also diverged ones')\n"
    "       sweep finish DIR/ID [--exit-status N] [--wall-s S]  for launchers (launchers/slurm/point.sbatch): what\n"
    "                             sweep run does when an exported point's train ends: done (its checkpoints pruned\n"
    "                             as the sweep says, DONE written), diverged, or failed (FAILED, its error)\n"
    "analysis runs in $MEGABATCH_PYTHON, else the first python3 on PATH with numpy, h5py and matplotlib\n"
    "\n"
    "examples:\n"
    "  sweep run experiments/lamb_bsz.json            # the default sweep; run it again to resume\n"
    "  sweep run experiments/lamb_bsz.json --dry-run  # list the points\n"
    "  sweep run experiments/lamb_bsz.json --only 'lamb-*'\n"
    "  sweep status runs/lamb_bsz && sweep plot runs/lamb_bsz && sweep report runs/lamb_bsz\n";

// This program's directory (the current one where it cannot be read).
fs::path self_dir() {
  const fs::path d = megabatch::program_dir();
  return d.empty() ? fs::path(".") : d;
}

// analysis/<script>: next to an installed sweep (share/megabatch/analysis), else the source tree's.
fs::path analysis_script(const std::string& name) {
  const fs::path installed = self_dir().parent_path() / "share" / "megabatch" / "analysis" / name;
  if (fs::exists(installed)) return installed;
  return fs::path(MEGABATCH_SOURCE_DIR) / "analysis" / name;
}

// The Python that runs analysis/: $MEGABATCH_PYTHON, else the first python3 on PATH that
// imports numpy, h5py and matplotlib, else /usr/bin/python3 (Debian's, which setup.sh equips).
std::string find_python() {
  auto works = [](const std::string& py) {
    const std::string cmd = mb::shell_quote(py) + " -c 'import numpy, h5py, matplotlib' >/dev/null 2>&1";
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
  };
  if (const char* env = std::getenv("MEGABATCH_PYTHON"); env && *env) {
    mb::check(works(env), "MEGABATCH_PYTHON=", env, ": cannot import numpy, h5py and matplotlib with it; point it at a "
              "Python 3 that has them (Debian: apt-get install python3-h5py python3-matplotlib)");
    return env;
  }
  std::vector<std::string> tried;
  if (const char* path = std::getenv("PATH")) {
    std::string dirs = path;
    size_t at = 0;
    while (at <= dirs.size()) {
      const size_t end = std::min(dirs.find(':', at), dirs.size());
      const fs::path cand = fs::path(dirs.substr(at, end - at).empty() ? "." : dirs.substr(at, end - at)) / "python3";
      at = end + 1;
      if (::access(cand.c_str(), X_OK) != 0 || std::find(tried.begin(), tried.end(), cand.string()) != tried.end()) continue;
      tried.push_back(cand.string());
      if (works(cand.string())) return cand.string();
    }
  }
  if (std::find(tried.begin(), tried.end(), "/usr/bin/python3") == tried.end()) {
    tried.push_back("/usr/bin/python3");
    if (works("/usr/bin/python3")) return "/usr/bin/python3";
  }
  mb::fail("no Python 3 that imports numpy, h5py and matplotlib (tried ", tried.empty() ? "none" : mb::join(tried, ", "),
           "); install them (setup.sh does: python3-h5py python3-matplotlib) or set MEGABATCH_PYTHON");
}

int run_python(const std::string& script, const std::vector<std::string>& args) {
  const fs::path s = analysis_script(script);
  mb::check(fs::exists(s), s.string(), ": the analysis script is missing");
  std::string cmd = mb::shell_quote(find_python()) + " " + mb::shell_quote(s.string());
  for (const auto& a : args) {
    cmd.push_back(' ');
    cmd.append(mb::shell_quote(a));
  }
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
}

// A sweep's directory whose sweep.json reads back with every field the tools use of the
// right type (read_sweep_state), checked here for the Python analysis too, so that a
// damaged file is named the same way by every command, not met as a traceback in report.py.
void check_sweep_dir(const std::string& dir) {
  mb::check(fs::exists(fs::path(dir) / "sweep.json"), dir, "/sweep.json: no sweep here (sweep run writes runs/<name>/)");
  mb::sweeps::read_sweep_state(dir);
}

// The sweep directories `cmd` was given, each checked (check_sweep_dir); an option among them
// (a mistyped one: `--target-loss`) is named as an option that `cmd` does not take, not looked
// for as a directory. `takes`: what it takes, for the message.
void check_sweep_dirs(const std::string& cmd, const std::vector<std::string>& dirs, const std::string& takes) {
  for (const std::string& d : dirs)
    mb::check(d.rfind("-", 0) != 0, "sweep ", cmd, ": unknown option ", d, "; it takes ", takes, "\n", kUsage);
  for (const std::string& d : dirs) check_sweep_dir(d);
}

// `sweep CMD --help`: its usage (the whole page), status 0.
bool asks_help(int argc, char** argv) {
  for (int i = 2; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") return true;
  return false;
}

// sweep finish DIR/ID: what sweep run does when a point's train ends, for launchers.
int finish(int argc, char** argv) {
  mb::ArgParser f("sweep finish", kUsage);
  f.option("exit-status", "N", "train's exit status (as the shell gives it: 128 + N for signal N)", "0");
  f.option("wall-s", "S", "the point's wall time over its attempts, as its launcher measured it", "0");
  if (!f.parse(argc, argv, 2)) return 0;
  mb::check(f.positional().size() == 1, "sweep finish: give the point's directory (runs/<name>/<id>)\n", kUsage);
  mb::check(f.get_double("wall-s") >= 0, "sweep finish: --wall-s: expected seconds >= 0, got ", f.get("wall-s"));
  mb::check(f.get_int("exit-status") >= 0 && f.get_int("exit-status") <= 255,
            "sweep finish: --exit-status: expected 0 to 255, got ", f.get("exit-status"));
  return mb::sweeps::finish_point(f.positional()[0], static_cast<int>(f.get_int("exit-status")), f.get_double("wall-s"));
}

// The one positional argument of `cmd` ("sweep run"), `what` it is ("sweep file"), or an error
// that names what was given instead. `argv` for the hint on --rerun, which takes a word only
// when it is one of its choices (so `--rerun foo` leaves foo a second file).
std::string one_positional(const mb::ArgParser& a, const std::string& cmd, const std::string& what, int argc,
                           char** argv) {
  const auto& given = a.positional();
  if (given.size() == 1) return given[0];
  std::string why = cmd + ": give one " + what;
  if (!given.empty()) why += ", got " + std::to_string(given.size()) + ": " + mb::join(given, " ");
  for (int i = 2; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--rerun" && std::find(given.begin(), given.end(), argv[i + 1]) != given.end())
      why +=
          std::string(" (--rerun takes changed, diverged, damaged or nothing; '") + argv[i + 1] + "' is none of them)";
  mb::fail(why, "\n", kUsage);
}

// sweep export DIR: a sweep's metrics as one long CSV table and TensorBoard event files.
int export_metrics(int argc, char** argv) {
  mb::ArgParser e("sweep export", kUsage);
  e.option("csv", "FILE", "one long table: point, axes, step, samples, metric, value", "");
  e.option("tensorboard", "DIR", "TensorBoard event files, one run per point", "");
  if (!e.parse(argc, argv, 2)) return 0;
  const std::string dir = one_positional(e, "sweep export", "sweep directory (runs/<name>)", argc, argv);
  mb::check(fs::is_directory(dir), "sweep export: ", dir, ": no such sweep directory (runs/<name>)",
            fs::is_regular_file(dir) ? "; to write a sweep file's points for launchers, use sweep export-points " + dir
                                     : std::string());
  mb::check(!e.get("csv").empty() || !e.get("tensorboard").empty(),
            "sweep export DIR: say what to write: --csv FILE and/or --tensorboard DIR\n", kUsage);
  check_sweep_dir(dir);
  if (!e.get("csv").empty()) mb::sweeps::export_csv(dir, e.get("csv"));
  if (!e.get("tensorboard").empty()) mb::sweeps::export_tensorboard(dir, e.get("tensorboard"));
  return 0;
}

// --rerun [changed|diverged|damaged], of sweep run and export-points: the points whose
// directories go before they run (or are exported) again.
void rerun_option(mb::ArgParser& a) {
  a.optional_choice("rerun", {"changed", "diverged", "damaged"}, "changed",
                    "changed (also a bare --rerun): discard and rerun points whose configuration changed; "
                    "diverged: discard and rerun the points that diverged; damaged: discard and rerun finished "
                    "points whose metrics.h5 does not read");
}

// What --rerun asks for, in `o`.
void read_rerun(const mb::ArgParser& a, mb::sweeps::RunOptions& o) {
  const std::string rerun = a.has("rerun") ? a.get("rerun") : "";
  o.rerun_changed = rerun == "changed";
  o.rerun_diverged = rerun == "diverged";
  o.rerun_damaged = rerun == "damaged";
}

// sweep export-points FILE.json: points.txt and point.json files for other launchers.
int export_points(int argc, char** argv, const std::string& name) {
  mb::ArgParser e("sweep " + name, kUsage);
  e.option("runs-dir", "DIR", "where runs/<name>/ goes", "runs");
  e.option("max-points", "N", "refuse a sweep of more points than this", std::to_string(mb::sweeps::kDefaultMaxPoints));
  e.option("ranks", "N", "refuse points that cannot run as a job of N ranks (TP x DP, DP = N / TP)", "0");
  e.flag("cluster", "print the nodes, GPUs per node and instance type the file's \"cluster\" names; write nothing");
  e.flag("dry-run", "check the points and say what would be written; write nothing");
  rerun_option(e);
  if (!e.parse(argc, argv, 2)) return 0;
  const std::string file = one_positional(e, "sweep " + name, "sweep file", argc, argv);
  mb::check(e.get_int("max-points") >= 1, "--max-points: must be >= 1, got ", e.get_int("max-points"));
  mb::check(e.get_int("ranks") >= 0 && e.get_int("ranks") <= 1000000, "--ranks: expected a whole number >= 1, got ",
            e.get("ranks"));
  const auto sweep = mb::sweeps::load_sweep(file, static_cast<size_t>(e.get_int("max-points")), e.get("runs-dir"));
  if (e.has("cluster")) return mb::sweeps::print_cluster(sweep);
  mb::sweeps::RunOptions o;
  o.runs_dir = e.get("runs-dir");
  o.ranks = static_cast<int>(e.get_int("ranks"));
  o.dry_run = e.has("dry-run");
  read_rerun(e, o);
  return mb::sweeps::export_points(sweep, o);
}

// sweep run's options, declared.
void run_options(mb::ArgParser& a) {
  a.flag("dry-run", "list the points and exit");
  a.option("only", "PATTERN", "run only points whose id matches this glob (or contains it)", "");
  a.option("retries", "N", "retry failed points up to N times", "0");
  a.option("jobs", "N", "points run at once (default: cores / threads)", "0");
  a.option("threads", "N", "threads per point (default: the file's, else 1)", "0");
  a.option("gpus", "all|0,1,...", "run points concurrently on these GPUs, each on TP x DP of its own "
           "(CUDA_VISIBLE_DEVICES; default jobs: one per GPU)", "");
  rerun_option(a);
  a.option("ranks", "N", "run every point as a job of N ranks under $MEGABATCH_MPIRUN (DP = N / TP; "
           "launchers/ec2/launch.sh --sweep: the hostfile's nodes x GPUs)", "0");
  a.option("runs-dir", "DIR", "where runs/<name>/ goes", "runs");
  a.option("max-points", "N", "refuse a sweep of more points than this", std::to_string(mb::sweeps::kDefaultMaxPoints));
}

// sweep run FILE.json: every point of the sweep, resuming what an earlier run left.
int run_sweep(int argc, char** argv) {
  mb::ArgParser a("sweep run", kUsage);
  run_options(a);
  if (!a.parse(argc, argv, 2)) return 0;
  const std::string file = one_positional(a, "sweep run", "sweep file", argc, argv);
  mb::check(a.get_int("ranks") >= 0 && a.get_int("ranks") <= 1000000, "--ranks: expected a whole number >= 1, got ",
            a.get("ranks"));
  mb::check(a.get_int("ranks") == 0 || a.get("gpus").empty(),
            "sweep run: --ranks and --gpus: give one (--ranks: each point on the whole cluster, one after another; "
            "--gpus: points side by side on one node's GPUs)");
  mb::check(a.get_int("jobs") >= 0, "--jobs: must be >= 1 (or 0: cores / threads), got ", a.get_int("jobs"));
  mb::check(a.get_int("threads") >= 0, "--threads: must be >= 1 (or 0: the file's), got ", a.get_int("threads"));
  mb::check(a.get_int("retries") >= 0 && a.get_int("retries") <= 100, "--retries: must be in [0, 100], got ", a.get_int("retries"));
  mb::check(a.get_int("max-points") >= 1, "--max-points: must be >= 1, got ", a.get_int("max-points"));
  const auto sweep = mb::sweeps::load_sweep(file, static_cast<size_t>(a.get_int("max-points")), a.get("runs-dir"));
  mb::sweeps::RunOptions o;
  o.runs_dir = a.get("runs-dir");
  o.train_binary = self_dir() / "train";
  mb::check(fs::exists(o.train_binary), o.train_binary.string(), ": the train program is missing (build it)");
  o.jobs = static_cast<int>(a.get_int("jobs"));
  o.threads = static_cast<int>(a.get_int("threads"));
  o.retries = static_cast<int>(a.get_int("retries"));
  o.ranks = static_cast<int>(a.get_int("ranks"));
  o.only = a.get("only");
  o.dry_run = a.has("dry-run");
  read_rerun(a, o);
  o.tty = isatty(STDOUT_FILENO) != 0;
  if (!a.get("gpus").empty()) o.gpus = mb::sweeps::parse_gpus(a.get("gpus"), mb::runtime::cuda_device_count());
  if (const char* m = std::getenv("MEGABATCH_MPIRUN"); m && *m) o.mpirun = m;
  if (const char* l = std::getenv("MEGABATCH_SWEEP_COMMAND"); l && *l) o.launcher = l;
  return mb::sweeps::run_sweep(sweep, o);
}

int run(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  const bool dirs_only = cmd == "status" || cmd == "report" || cmd == "prune" || cmd == "plot" || cmd == "analyze";
  if (dirs_only && asks_help(argc, argv)) {
    std::cout << kUsage;
    return 0;
  }
  if (cmd == "status" || cmd == "report" || cmd == "prune") {
    mb::check(argc == 3, "sweep ", cmd, ": give the sweep's directory (runs/<name>)\n", kUsage);
    check_sweep_dirs(cmd, {argv[2]}, "a sweep's directory alone");
    if (cmd == "status") return mb::sweeps::print_status(argv[2]);
    if (cmd == "prune") return mb::sweeps::prune_sweep(argv[2]);
    return run_python("report.py", {argv[2]});
  }
  if (cmd == "plot") {
    mb::check(argc >= 3, "sweep plot: give one or more sweep directories (runs/<name>)\n", kUsage);
    std::vector<std::string> dirs(argv + 2, argv + argc);
    check_sweep_dirs(cmd, dirs, "sweep directories alone");
    return run_python("plot.py", dirs);
  }
  if (cmd == "analyze") {  // DIR [DIR ...] [--targets L1,L2]
    std::vector<std::string> args(argv + 2, argv + argc);
    const auto targets = std::find(args.begin(), args.end(), "--targets");
    const bool targets_last = targets == args.end() || targets + 2 == args.end();
    const auto dirs_end = targets == args.end() ? args.end() : targets;
    mb::check(dirs_end != args.begin() && targets_last,
              "sweep analyze: give one or more sweep directories and optionally --targets L1,L2,...\n", kUsage);
    check_sweep_dirs(cmd, std::vector<std::string>(args.begin(), dirs_end),
                     "sweep directories and --targets L1,L2,...");
    return run_python("critical_batch.py", args);
  }
  if (cmd == "finish") return finish(argc, argv);
  if (cmd == "export-points") return export_points(argc, argv, cmd);
  if (cmd == "export" && argc >= 3 && fs::is_regular_file(argv[2])) {  // the form export-points replaced
    std::cerr << "sweep: note: `sweep export FILE.json` is `sweep export-points FILE.json` now; the old form still "
                 "works for a while"
              << std::endl;
    return export_points(argc, argv, "export-points");
  }
  if (cmd == "export") return export_metrics(argc, argv);
  mb::check(cmd == "run", "unknown command '", cmd,
            "'; commands: run, status, plot, analyze, report, prune, export, export-points, finish\n", kUsage);
  return run_sweep(argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const mb::Error& e) {
    std::cerr << "sweep: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "sweep: internal error: " << e.what() << std::endl;
    return 2;
  }
}
