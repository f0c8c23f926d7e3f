// What a sweep writes and what reads it back: status and prune, CSV and TensorBoard exports
// (read by readers that share no code with megabatch), export-points for the cluster launchers,
// the state file damaged by hand, commands that find nothing to do, and the analysis Python
// (found, and several sweeps plotted and analyzed side by side).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "core/util/strings.h"
#include "tests/e2e/sweep_fixture.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace fs = std::filesystem;
namespace mb = megabatch;
using megabatch::testing::Sweep;

// sweep.json edited by hand or damaged: every command that reads it names the file and the
// field instead of meeting a library error ("internal error", a Python traceback) later.
// Commands that find nothing to do say so and exit non-zero (each exited 0 before, as if it
// had done its work): a --only that matches no point, exports and the analysis of a sweep
// whose points have no metrics yet (nothing written); --rerun diverged when none diverged
// is a warning (the sweep goes on with its other points). A sweep file with a key twice is
// refused naming the key (a second "grid" dropped the first).
TEST_F(Sweep, CommandsThatFindNothingToDoSaySo) {
  mb::testing::TempDir tmp;
  const auto file = write_sweep(tmp.path(), "idle", 16, R"("lamb", "adamw")");
  const fs::path runs = tmp / "runs", dir = runs / "idle";
  auto r = run_sweep(file, runs, " --only 'sgd-*'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("sweep: error: --only 'sgd-*' matches none of the 4 points of " + file.string() +
                          " (ids such as lamb-bs4-lr0.002-s3, lamb-bs8-lr0.00283-s3, "),
            std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir)) << "nothing was started";
  r = run_sweep(file, runs, " --rerun diverged --dry-run --only lamb-bs4");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> warning: --rerun diverged: no point selected by --only has diverged, so none is run again"),
            std::string::npos) << r.output;
  // the sweep's directory as `sweep export` leaves it for other launchers: every point
  // pending, none with metrics
  ASSERT_EQ(mb::testing::run_command(sweep("export-points " + file.string() + " --runs-dir " + runs.string())).exit_code, 0);
  for (const std::string& command : {"export " + dir.string() + " --csv " + (tmp / "x.csv").string(),
                                     "export " + dir.string() + " --tensorboard " + (tmp / "tb").string()}) {
    r = mb::testing::run_command(sweep(command));
    EXPECT_EQ(r.exit_code, 2) << command << "\n" << r.output;
    EXPECT_NE(r.output.find("sweep: error: " + dir.string() + ": none of its 4 point(s) has metrics yet (no metrics.h5): "
                            "nothing to export; run the sweep first"),
              std::string::npos) << r.output;
  }
  EXPECT_FALSE(fs::exists(tmp / "x.csv"));
  EXPECT_FALSE(fs::exists(tmp / "tb"));
  r = mb::testing::run_command(sweep("analyze " + dir.string()));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("sweep analyze: no point of " + dir.string() + " has metrics yet; run the sweep first"),
            std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "analysis.json"));
  // a key given twice
  mb::testing::write_text(tmp / "twice.json", R"({"name": "twice", "base": {"lr": 0.1}, "grid": {"optimizer": ["lamb"]},
 "grid": {"seed": [1, 2]}})");
  r = run_sweep(tmp / "twice.json", runs, " --dry-run");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find((tmp / "twice.json").string() + ": not valid JSON (the key \"grid\" appears twice in one object; "
                          "give each key once)"),
            std::string::npos) << r.output;
}

// CSV cells a spreadsheet would run as formulas (text starting with =, +, -, @) are written
// with a leading apostrophe; numbers stay numbers (a negative loss, a negative swept value);
// Python's csv reads the file back cell for cell. Point ids and swept strings are the text
// that reaches the file from a sweep file.
TEST_F(Sweep, CsvTextCellsCannotRunAsFormulasAndNumbersStayNumbers) {
  mb::testing::TempDir tmp;
  const fs::path root = tmp / "runs" / "hostile";
  const std::vector<std::string> ids = {"=HYPERLINK(\"http://x\")", "@SUM(1+1)"};
  nlohmann::json state = {{"name", "hostile"}, {"points", nlohmann::json::array()}};
  state["points"].push_back({{"id", ids[0]}, {"config", {{"global_batch_size", 4}, {"lr", -0.5}, {"note", "+cmd|' /C calc'!A0"}}}});
  state["points"].push_back({{"id", ids[1]}, {"config", {{"global_batch_size", 8}, {"lr", 0.1}, {"note", "-2+3"}}}});
  for (const auto& id : ids) fs::create_directories(root / id);
  mb::testing::write_text(root / "sweep.json", state.dump());
  auto r = mb::testing::run_command(
      "/usr/bin/python3 -c \"import h5py, sys\n"
      "for d in sys.argv[1:]:\n"
      "    with h5py.File(d + '/metrics.h5', 'w') as f:\n"
      "        f['train/iteration'] = [1.0, 2.0]; f['train/lm_loss'] = [-1.5, 2.0]\" " +
      mb::shell_quote((root / ids[0]).string()) + " " + mb::shell_quote((root / ids[1]).string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path csv = tmp / "out.csv";
  r = mb::testing::run_command(sweep("export " + root.string() + " --csv " + csv.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command("/usr/bin/python3 -c \"import csv, sys\n"
                               "rows = list(csv.reader(open(sys.argv[1], newline='')))\n"
                               "print(rows[0]); print(rows[1]); print(rows[-1])\n"
                               "risky = [c for row in rows for c in row if c[:1] in '=+-@']\n"
                               "[float(c) for c in risky]; print('risky cells are all numbers:', len(risky))\" " +
                               csv.string());
  ASSERT_EQ(r.exit_code, 0) << r.output << mb::testing::read_text(csv);
  EXPECT_NE(r.output.find("['point', 'global_batch_size', 'lr', 'note', 'step', 'samples', 'metric', 'value']"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("['\\'=HYPERLINK(\"http://x\")', '4', '-0.5', \"'+cmd|' /C calc'!A0\", '1', '4', 'train/lm_loss', '-1.5']"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[\"'@SUM(1+1)\", '8', '0.1', \"'-2+3\", '2', '16', 'train/lm_loss', '2']"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("risky cells are all numbers: 4"), std::string::npos) << r.output;  // -0.5 and -1.5, twice
}

TEST_F(Sweep, ADamagedStateFileIsNamedWithTheField) {
  mb::testing::TempDir tmp;
  const fs::path root = tmp / "runs" / "s";
  fs::create_directories(root);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"points": [{"id": "a", "wall_s": 1.5}, {"id": "b", "wall_s": "1.5"}]})", "points[1].wall_s is not a number"},
      {R"({"points": [{"id": "a", "state": 5}]})", "points[0].state is not a string"},
      {R"({"points": [{"id": "a", "config": []}]})", "points[0].config is not an object"},
      {R"({"points": [{"id": "a", "config": {"global_batch_size": "8"}}]})",
       "points[0].config.global_batch_size is not an integer >= 1"},
      {R"({"points": [{"id": 7}]})", "points[0] has no \"id\" string"},
      {R"({"points": {}})", "no \"points\" list"},
      {R"({"sweep_pid": "1", "points": []})", "\"sweep_pid\" is not an integer"},
      {R"({"name": 3, "points": []})", "\"name\" is not a string"},
      {R"({"points": [{"id": "a", "wall_s": 1e999}]})", "unreadable (number overflow parsing '1e999')"},
      {R"({"points": [{"id": "a")", "unreadable (parse error at line 1"},
      // nested past any state (a stack overflow in sweep status before)
      {"{\"points\": " + std::string(100000, '[') + std::string(100000, ']') + "}", "unreadable (nested deeper than 64 levels)"},
  };
  for (const auto& [text, message] : cases) {
    mb::testing::write_text(root / "sweep.json", text);
    // every command that reads it: export reads the batch size for its samples column, and
    // report, plot and analyze read it in Python (report.py ended in a TypeError traceback)
    for (const std::string& command :
         {"status " + root.string(), "export " + root.string() + " --csv " + (tmp / "x.csv").string(),
          "report " + root.string(), "plot " + root.string(), "analyze " + root.string()}) {
      const auto r = mb::testing::run_command(sweep(command));
      EXPECT_EQ(r.exit_code, 2) << text << "\n" << r.output;
      EXPECT_NE(r.output.find((root / "sweep.json").string() + ": " + message), std::string::npos) << text << "\n" << r.output;
      EXPECT_NE(r.output.find("move it away to start the sweep afresh"), std::string::npos) << r.output;
    }
  }
}

// Exports read back by readers that share no code with megabatch: the CSV with Python's csv
// module, the TensorBoard event files by tests/tools/read_tfevents.py (its own CRC32C and
// protobuf schema), both against metrics.h5 read with h5py; train --tensorboard-dir writes
// the same scalars while it runs. Disk: a finished point keeps only its final checkpoint,
// status shows the disk used, prune leaves final checkpoints alone.
TEST_F(Sweep, ExportsCsvAndTensorBoardThatIndependentReadersRead) {
  mb::testing::TempDir tmp;
  const auto file = write_sweep(tmp.path(), "exp", 32, R"("lamb")");
  const fs::path runs = tmp / "runs", dir = runs / "exp";
  auto r = run_sweep(file, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& id : {"lamb-bs4-lr0.002-s3", "lamb-bs8-lr0.00283-s3"}) {
    std::vector<std::string> ckpts;
    for (const auto& e : fs::directory_iterator(dir / id / "checkpoints"))
      if (e.path().extension() == ".h5") ckpts.push_back(e.path().filename().string());
    EXPECT_EQ(ckpts.size(), 1u) << id << ": a finished point keeps its final checkpoint only";
  }
  r = mb::testing::run_command(sweep("status " + dir.string()));
  EXPECT_NE(r.output.find("disk: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("none that sweep prune would free"), std::string::npos) << r.output;
  r = mb::testing::run_command(sweep("prune " + dir.string()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("freed 0 kB in 0 point(s)"), std::string::npos) << r.output;

  const fs::path csv = tmp / "exp.csv", tb = tmp / "tb";
  // a mistyped sweep directory is named as such (before: "sweep export: unknown option --csv")
  r = mb::testing::run_command(sweep("export " + dir.string() + "-typo --csv " + csv.string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("sweep export: " + dir.string() + "-typo: no such sweep directory"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(csv));
  r = mb::testing::run_command(sweep("export " + dir.string() + " --csv " + csv.string() + " --tensorboard " + tb.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string tools = mb::testing::source_dir() + "/tests/tools/";
  r = mb::testing::run_command("/usr/bin/python3 " + tools + "check_exports.py " + dir.string() + " " + csv.string() +
                               " " + tb.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("ok: ", 0), 0u) << r.output;
  // LAMB's per-tensor diagnostics (optimizer/trust_ratio, ...: step x tensor) are exported too
  EXPECT_EQ(r.output.find(", 0 of them per tensor"), std::string::npos) << r.output;

  // train --tensorboard-dir: the same scalars, written as the run goes
  const fs::path live = tmp / "live";
  r = mb::testing::run_command(mb::testing::bin_dir() + "/train --num-layers 1 --hidden-size 32 --num-attention-heads 2 "
                               "--seq-length 16 --micro-batch-size 4 --global-batch-size 4 --train-iters 6 --lr 1e-3 "
                               "--log-interval 2 --eval-iters 1 --threads 1 --optimizer lamb --data-path " +
                               (mb::testing::brown_data() / "brown_gpt2_text_document").string() + " --run-dir " +
                               (live / "run").string() + " --tensorboard-dir " + (live / "tb").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string event;
  for (const auto& e : fs::directory_iterator(live / "tb")) event = e.path().string();
  r = mb::testing::run_command("/usr/bin/python3 -c \"import sys, h5py; sys.path.insert(0, '" + tools +
                               "'); import read_tfevents as r\n"
                               "s = r.read('" + event + "')['scalars']\n"
                               "f = h5py.File('" + (live / "run" / "metrics.h5").string() + "', 'r')\n"
                               "loss = [x for x in s if x[0] == 'train/lm_loss']\n"
                               "assert [x[1] for x in loss] == [int(i) for i in f['train/iteration']], loss\n"
                               "assert all(abs(x[2] - v) < 1e-5 * v for x, v in zip(loss, f['train/lm_loss'])), loss\n"
                               "assert [x[2] for x in s if x[0] == 'validation/lm_loss'], s\n"
                               "names = [n.decode() for n in f['optimizer/tensor_names']]\n"
                               "tr = [x for x in s if x[0] == 'optimizer/trust_ratio/' + names[0]]\n"
                               "assert [x[1] for x in tr] == [int(i) for i in f['optimizer/iteration']], tr\n"
                               "ref = f['optimizer/trust_ratio'][:, 0]\n"
                               "assert all(abs(x[2] - v) < 1e-5 * abs(v) for x, v in zip(tr, ref)), tr\n"
                               "print('ok', len(loss), len(tr))\"");
  EXPECT_EQ(r.output, "ok 6 3\n") << r.output;
}

// A sweep that keeps its checkpoints ("checkpoints": "all"): status says how much sweep prune
// would free, the sum of every finished point's checkpoints but its newest (counted here from
// the files), and of those a rewind set aside in checkpoints/earlier/N (before, left out of
// both: another trajectory's checkpoints stayed for good); prune frees exactly that, each point
// keeps its newest checkpoint, never reaching through a symlink, and status then has nothing
// left to free.
TEST_F(Sweep, StatusSaysWhatPruneFreesAndPruneKeepsTheNewestCheckpoint) {
  mb::testing::TempDir tmp;
  const auto file = write_sweep(tmp.path(), "keep", 32, R"("adamw")", R"(, "save_interval": 2)");
  std::string text = mb::testing::read_text(file);
  text.insert(text.rfind('}'), R"(, "checkpoints": "all")");
  mb::testing::write_text(file, text);
  const fs::path runs = tmp / "runs", dir = runs / "keep";
  auto r = run_sweep(file, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto checkpoints = [](const fs::path& d) {  // iter_*.h5 by name (= by iteration)
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(d / "checkpoints"))
      if (e.path().extension() == ".h5") out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
  };
  const std::vector<std::string> ids = {"adamw-bs4-lr0.002-s3", "adamw-bs8-lr0.00283-s3"};
  double old_bytes = 0;
  std::vector<fs::path> newest;
  for (const auto& id : ids) {
    const auto c = checkpoints(dir / id);
    ASSERT_GE(c.size(), 2u) << id << ": checkpoints \"all\" keeps the last two";
    for (size_t i = 0; i + 1 < c.size(); ++i) old_bytes += static_cast<double>(fs::file_size(c[i]));
    newest.push_back(c.back());
  }
  // the first point's run rewound once: its old first checkpoint set aside, as train does it
  // (core/io/checkpoint.h); the second's checkpoints/earlier a symlink to files of elsewhere
  const fs::path aside = dir / ids[0] / "checkpoints" / "earlier" / "1";
  fs::create_directories(aside);
  fs::copy_file(checkpoints(dir / ids[0]).front(), aside / "iter_0000099.h5");
  old_bytes += static_cast<double>(fs::file_size(aside / "iter_0000099.h5"));
  const fs::path elsewhere = tmp / "elsewhere" / "1";
  fs::create_directories(elsewhere);
  fs::copy_file(checkpoints(dir / ids[1]).front(), elsewhere / "iter_0000099.h5");
  fs::create_directory_symlink(tmp / "elsewhere", dir / ids[1] / "checkpoints" / "earlier");
  // "12.3 MB" / "456 kB" after `prefix` in the output, in bytes (printed to 0.1 MB / 1 kB)
  auto bytes_after = [](const std::string& out, const std::string& prefix) {
    const size_t at = out.find(prefix);
    if (at == std::string::npos) return -1.0;
    std::smatch m;
    const std::string rest = out.substr(at + prefix.size());
    if (!std::regex_search(rest, m, std::regex(R"(^([0-9.]+) (kB|MB|GB))"))) return -1.0;
    return std::stod(m[1]) * (m[2] == "kB" ? 1e3 : m[2] == "MB" ? 1e6 : 1e9);
  };
  r = mb::testing::run_command(sweep("status " + dir.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double said = bytes_after(r.output, "sweep prune " + dir.string() + " frees ");
  EXPECT_NEAR(said, old_bytes, 0.051e6) << r.output;
  double all_bytes = old_bytes;  // every checkpoint, those set aside too
  for (const auto& n : newest) all_bytes += static_cast<double>(fs::file_size(n));
  EXPECT_NEAR(bytes_after(r.output, "(checkpoints "), all_bytes, 0.051e6) << r.output;
  r = mb::testing::run_command(sweep("prune " + dir.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NEAR(bytes_after(r.output, "freed "), old_bytes, 0.051e6) << r.output;
  EXPECT_NE(r.output.find("in 2 point(s)"), std::string::npos) << r.output;
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(checkpoints(dir / ids[i]), std::vector<fs::path>{newest[i]}) << ids[i];
  EXPECT_FALSE(fs::exists(dir / ids[0] / "checkpoints" / "earlier")) << "emptied, so removed";
  EXPECT_TRUE(fs::exists(elsewhere / "iter_0000099.h5")) << "not through a symlink";
  EXPECT_TRUE(fs::is_symlink(dir / ids[1] / "checkpoints" / "earlier"));
  r = mb::testing::run_command(sweep("status " + dir.string()));
  EXPECT_NE(r.output.find("none that sweep prune would free"), std::string::npos) << r.output;
}

// A point whose run keeps every fourth iteration's checkpoint for good (--save-retain-interval 4,
// a checkpoint every 2): finished, it keeps those and its newest, as "checkpoints": "final" says
// (the default), and sweep prune leaves them too. The point of 8 iterations keeps 4 and 8 (of 2,
// 4, 6, 8), that of 4 iterations keeps 4.
TEST_F(Sweep, FinishedPointsKeepTheCheckpointsTheirRunRetainsForGood) {
  mb::testing::TempDir tmp;
  const auto file =
      write_sweep(tmp.path(), "retain", 32, R"("adamw")", R"(, "save_interval": 2, "save_retain_interval": 4)");
  const fs::path runs = tmp / "runs", dir = runs / "retain";
  auto r = run_sweep(file, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto checkpoints = [](const fs::path& d) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(d / "checkpoints"))
      if (e.path().extension() == ".h5") out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  };
  const std::vector<std::string> eight = {"iter_0000004.h5", "iter_0000008.h5"}, four = {"iter_0000004.h5"};
  EXPECT_EQ(checkpoints(dir / "adamw-bs4-lr0.002-s3"), eight);
  EXPECT_EQ(checkpoints(dir / "adamw-bs8-lr0.00283-s3"), four);
  r = mb::testing::run_command(sweep("prune " + dir.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(checkpoints(dir / "adamw-bs4-lr0.002-s3"), eight) << r.output;
  EXPECT_EQ(checkpoints(dir / "adamw-bs8-lr0.00283-s3"), four) << r.output;
}

// sweep export-points (for launchers/slurm and eks) leaves what sweep run would: each
// point.json with the checkpoint schedule sweep run gives it (a checkpoint every tenth of its
// iterations: a lost node costs no more), and the sweep's state, which status reads (before,
// "no sweep here"); exported again with a changed value, the refusal names the key, and with
// --rerun the changed points are discarded and exported afresh. The old name of the command
// (sweep export FILE.json) still works, and says its new name.
TEST_F(Sweep, ExportWritesWhatSweepRunWouldAndNamesAChangedKey) {
  mb::testing::TempDir tmp;
  const fs::path runs = tmp / "runs";
  const fs::path file = write_tiny_sweep(tmp.path(), "ex", R"("train_iters": 40)", R"("zip": {"global_batch_size": [2, 4]})");
  auto r = mb::testing::run_command(sweep("export-points " + file.string() + " --runs-dir " + runs.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto point = nlohmann::json::parse(mb::testing::read_text(runs / "ex" / "bs2" / "point.json"));
  EXPECT_EQ(point.value("save_interval", 0), 4) << point;
  EXPECT_EQ(point.value("keep_checkpoints", 0), 2) << point;
  r = mb::testing::run_command(sweep("status " + (runs / "ex").string()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("sweep: 0 done, 0 diverged, 0 running, 0 failed, 2 waiting"), std::string::npos) << r.output;
  const fs::path changed = write_tiny_sweep(tmp.path(), "ex", R"("train_iters": 50)",
                                            R"("zip": {"global_batch_size": [2, 4]})");
  r = mb::testing::run_command(sweep("export " + changed.string() + " --runs-dir " + runs.string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("`sweep export FILE.json` is `sweep export-points FILE.json` now"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("bs2 (train_iters: 40 -> 50)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Export with --rerun to discard those points and run them again"), std::string::npos)
      << r.output;
  EXPECT_EQ(nlohmann::json::parse(mb::testing::read_text(runs / "ex" / "bs2" / "point.json")).value("train_iters", 0),
            40)
      << "refused: untouched";
  // --rerun, as sweep run's: the changed points discarded and exported afresh
  r = mb::testing::run_command(
      sweep("export-points " + changed.string() + " --runs-dir " + runs.string() + " --rerun"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* id : {"bs2", "bs4"}) {
    EXPECT_NE(r.output.find("> --rerun: discarded " + (runs / "ex" / id).string() + " (its configuration changed)"),
              std::string::npos)
        << r.output;
    EXPECT_EQ(nlohmann::json::parse(mb::testing::read_text(runs / "ex" / id / "point.json")).value("train_iters", 0),
              50)
        << id;
  }
}

// sweep --help lists each command under the name the tool takes it by, and all of them: the
// commands of its usage lines are those that an unknown command is told of, and each runs as
// itself (without its arguments it asks for them under its own name, with no note of a
// renamed command).
TEST_F(Sweep, HelpListsEachCommandUnderTheNameTheToolTakes) {
  const auto help = mb::testing::run_command(sweep("--help"));
  ASSERT_EQ(help.exit_code, 0) << help.output;
  std::set<std::string> listed;
  const std::regex usage_line(R"(^(?:usage: | +)sweep ([a-z-]+) )");
  std::istringstream lines(help.output);
  for (std::string line; std::getline(lines, line);)
    if (std::smatch m; std::regex_search(line, m, usage_line)) listed.insert(m[1]);
  const auto unknown = mb::testing::run_command(sweep("frobnicate"));
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  std::smatch m;
  const std::regex told(R"(unknown command 'frobnicate'; commands: ([a-z, -]+))");
  ASSERT_TRUE(std::regex_search(unknown.output, m, told)) << unknown.output;
  std::set<std::string> known;
  std::istringstream names(m[1].str());
  for (std::string name; std::getline(names, name, ',');) known.insert(name.substr(name.find_first_not_of(' ')));
  EXPECT_EQ(listed, known) << help.output;
  for (const std::string& command : listed) {
    const auto r = mb::testing::run_command(sweep(command));
    EXPECT_EQ(r.exit_code, 2) << command << ": " << r.output;
    EXPECT_NE(r.output.find("sweep: error: sweep " + command + ": give "), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("note:"), std::string::npos) << r.output;
  }
  // two where one is taken: both named, and a word after --rerun that is not one of its choices
  // (so taken as a second file) said to be so (before: "give one sweep file", the reason unsaid)
  for (const auto& [args, said] : std::vector<std::pair<std::string, std::string>>{
           {"run a.json --rerun faild",
            "sweep run: give one sweep file, got 2: a.json faild (--rerun takes changed, "
            "diverged, damaged or nothing; 'faild' is none of them)"},
           {"export-points a.json b.json", "sweep export-points: give one sweep file, got 2: a.json b.json\n"},
           {"export runs/a runs/b --csv x.csv",
            "sweep export: give one sweep directory (runs/<name>), got 2: runs/a "
            "runs/b\n"}}) {
    const auto r = mb::testing::run_command(sweep(args));
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find("sweep: error: " + said), std::string::npos) << r.output;
  }
  // the commands that take sweep directories: --help is the usage; a mistyped option is named as
  // one (before: "--target-loss/sweep.json: no sweep here")
  for (const std::string command : {"status", "report", "prune", "plot", "analyze"}) {
    const auto h = mb::testing::run_command(sweep(command + " --help"));
    EXPECT_EQ(h.exit_code, 0) << command << ": " << h.output;
    EXPECT_EQ(h.output.rfind("usage: sweep run", 0), 0u) << command << ": " << h.output;
    const bool many = command == "plot" || command == "analyze";
    const auto r = mb::testing::run_command(sweep(command + (many ? " runs/x" : "") + " --target-loss"));
    EXPECT_EQ(r.exit_code, 2) << command << ": " << r.output;
    EXPECT_NE(r.output.find("sweep: error: sweep " + command + ": unknown option --target-loss; it takes " +
                            (command == "analyze" ? "sweep directories and --targets L1,L2,..."
                             : many               ? "sweep directories alone"
                                                  : "a sweep's directory alone")),
              std::string::npos)
        << r.output;
  }
}

// The analysis Python: $MEGABATCH_PYTHON when set (an unusable one is an error naming it),
// else the first python3 on PATH that has numpy, h5py and matplotlib (one without them is
// passed over); several sweeps plot overlaid and are analyzed side by side.
TEST_F(Sweep, AnalysisPythonIsFoundAndSweepsOverlay) {
  mb::testing::TempDir tmp;
  const auto file = write_sweep(tmp.path(), "py", 16, R"("lamb")");
  const fs::path runs = tmp / "runs", dir = runs / "py";
  auto r = run_sweep(file, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto other = write_sweep(tmp.path(), "py2", 16, R"("adamw")");
  r = run_sweep(other, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  fs::create_directories(tmp / "bin");
  mb::testing::write_text(tmp / "bin" / "python3", "#!/bin/sh\nexit 1\n");  // a python3 without the modules
  fs::permissions(tmp / "bin" / "python3", fs::perms::owner_all);
  r = mb::testing::run_command("PATH=" + (tmp / "bin").string() + ":$PATH " + sweep("plot " + dir.string() + " " +
                                                                                   (runs / "py2").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "figures-overlay" / "scaling.png")) << r.output;
  // the two analyzed side by side: a series each, named by optimizer and sweep; --targets after
  // the directories only
  r = mb::testing::run_command(sweep("analyze " + dir.string() + " " + (runs / "py2").string() + " --targets 10.5"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("adamw, py2 loss 10.500"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("lamb, py loss 10.500"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir / "figures-overlay" / "analysis.json")) << r.output;
  r = mb::testing::run_command(sweep("analyze --targets 10.5 " + dir.string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("sweep analyze: give one or more sweep directories and optionally --targets"),
            std::string::npos)
      << r.output;
  r = mb::testing::run_command("MEGABATCH_PYTHON=" + (tmp / "bin" / "python3").string() + " " + sweep("plot " + dir.string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("MEGABATCH_PYTHON=" + (tmp / "bin" / "python3").string() + ": cannot import numpy, h5py and matplotlib"),
            std::string::npos) << r.output;
}
