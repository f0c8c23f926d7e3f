// Running a sweep end to end: a miniature sweep (tiny GPT, two optimizers, two batch sizes, a
// fixed sample budget) runs, plots and reports; a sweep killed with SIGKILL in the middle of a
// point and run again completes with metrics identical to the uninterrupted sweep; Ctrl-C stops
// points of one and of two ranks at checkpoints they go on from; a second run of a running sweep
// is refused; a failing, unwritable or diverged point leaves the others alone; --rerun deletes
// only what the sweep made; the live table fits the terminal.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "core/util/dir_lock.h"
#include "tests/e2e/sweep_fixture.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace fs = std::filesystem;
namespace mb = megabatch;
using megabatch::testing::kIds;
using megabatch::testing::losses;
using megabatch::testing::Sweep;

TEST_F(Sweep, RunsPlotsAndReportsAMiniatureSweep) {
  mb::testing::TempDir tmp;
  const auto file = write_sweep(tmp.path(), "mini", 48, R"("lamb", "adamw")");
  const fs::path runs = tmp / "runs", dir = runs / "mini";
  auto r = mb::testing::run_command(sweep("run " + file.string() + " --dry-run --runs-dir " + runs.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& id : kIds) EXPECT_NE(r.output.find(id), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir)) << "--dry-run runs nothing";

  r = run_sweep(file, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> sweep mini: 4 points, 2 at a time, 1 thread(s) each;"), std::string::npos) << r.output;
  for (const auto& id : kIds) {
    for (const char* f : {"point.json", "config.json", "metrics.h5", "stdout.log", "DONE"})
      EXPECT_TRUE(fs::exists(dir / id / f)) << id << "/" << f;
    EXPECT_TRUE(fs::exists(dir / id / "checkpoints" / "latest_checkpointed_iteration.txt")) << id;
    // the sample budget: 48 samples at batch 4 or 8
    EXPECT_EQ(losses(dir / id / "metrics.h5").size(), id.find("bs4") != std::string::npos ? 12u : 6u) << id;
  }
  r = mb::testing::run_command(sweep("status " + dir.string()));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("4 done, 0 diverged, 0 running, 0 failed"), std::string::npos) << r.output;

  r = mb::testing::run_command(sweep("plot " + dir.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* fig : {"loss_vs_iteration", "loss_vs_samples", "scaling", "lr_schedule", "trust_ratio"})
    for (const char* ext : {".png", ".svg"}) {
      const fs::path p = dir / "figures" / (std::string(fig) + ext);
      ASSERT_TRUE(fs::exists(p)) << p;
      EXPECT_GT(fs::file_size(p), 10000u) << p << " looks empty";
    }
  r = mb::testing::run_command(sweep("report " + dir.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir / "report.html");
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& id : kIds) EXPECT_NE(html.find(id), std::string::npos) << id;
  size_t images = 0;
  for (size_t at = html.find("<img src='data:image/png;base64,"); at != std::string::npos;
       at = html.find("<img src='data:image/png;base64,", at + 1))
    ++images;
  EXPECT_GE(images, 5u);
  EXPECT_EQ(html.find("src='http"), std::string::npos) << "the report must read offline";

  // Running it again skips every finished point.
  r = run_sweep(file, runs);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("> start"), std::string::npos) << r.output;

  // keys that cannot change results are not compared: another plugin path and threads (where
  // this process may use 2 CPUs) run as before
  const auto neutral = write_sweep(tmp.path(), "mini", 48, R"("lamb", "adamw")", R"(, "plugin_path": ["/nonexistent"])");
  r = run_sweep(neutral, runs, " --threads " + std::to_string(mb::testing::test_threads()));  // 1 in the file
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("> start"), std::string::npos) << r.output;

  // A changed configuration is refused, then rerun on request.
  const auto changed = write_sweep(tmp.path(), "mini", 48, R"("lamb", "adamw")", R"(, "weight_decay": 0.05)");
  r = run_sweep(changed, runs);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("differs from this file"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("lamb-bs4-lr0.002-s3 (weight_decay: unset -> 0.05)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--rerun"), std::string::npos) << r.output;
  r = run_sweep(changed, runs, " --rerun --only 'lamb-bs8*'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> start lamb-bs8"), std::string::npos) << r.output;
}

TEST_F(Sweep, KilledSweepResumesToTheMetricsOfAnUninterruptedOne) {
  mb::testing::TempDir tmp;
  const auto file = write_sweep(tmp.path(), "killme", 160, R"("lamb", "adamw")");
  const fs::path ref_runs = tmp / "ref", runs = tmp / "runs", dir = runs / "killme";
  auto r = mb::testing::run_command(sweep("run " + file.string() + " --runs-dir " + ref_runs.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Once the first point is past iteration 4 of 40 (checkpoints every 4), pause its train
  // (SIGSTOP: however fast the machine, it goes no further) and SIGKILL the sweep, which takes
  // the paused train with it (PR_SET_PDEATHSIG); then wait until that train is gone.
  const std::string log = (dir / kIds[0] / "stdout.log").string();
  std::string point = (dir / kIds[0] / "point.json").string();
  point.insert(point.size() - 5, "[").insert(point.size() - 4, "]");  // "point[.]json": matches train's line, not this shell's
  const std::string first_train = "-f '" + point + "'";
  r = mb::testing::run_command("(" + sweep("run " + file.string() + " --runs-dir " + runs.string()) + " > " +
                               (tmp / "sweep.log").string() + " 2>&1 & echo $! > " + (tmp / "pid").string() +
                               "); for i in $(seq 30000); do grep -q 'iteration  *[5-9]/' " + log +
                               " 2>/dev/null && break; sleep 0.01; done; pkill -STOP " + first_train + "; kill -9 $(cat " +
                               (tmp / "pid").string() + "); for i in $(seq 6000); do pgrep " + first_train +
                               " >/dev/null || break; sleep 0.05; done; pgrep " + first_train +
                               " >/dev/null && echo still running; grep -c 'iteration  *[0-9]*/' " + log);
  ASSERT_GE(std::atoi(r.output.c_str()), 5) << r.output;
  EXPECT_EQ(r.output.find("still running"), std::string::npos) << "the killed sweep's train went on: " << r.output;
  EXPECT_FALSE(fs::exists(dir / kIds[0] / "DONE")) << "the kill came too late to test anything";
  r = run_sweep(file, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("> loaded " + (dir / kIds[0] / "checkpoints" / "iter_").string()), std::string::npos)
      << "the killed point resumed from its checkpoint, not from scratch:\n" << text;
  for (const auto& id : kIds) {
    ASSERT_TRUE(fs::exists(dir / id / "DONE")) << id;
    EXPECT_EQ(losses(dir / id / "metrics.h5"), losses(ref_runs / "killme" / id / "metrics.h5")) << id;
  }
}

// Ctrl-C to a sweep whose points run at once, one a process of its own, one two MPI ranks
// under mpirun: each finishes its iteration, writes a checkpoint and is "interrupted" (where
// mpirun, sent SIGTERM, ended its job itself and the point "failed"); run again, both go on
// from their checkpoints to a metrics file with every iteration once. The one-process point
// is paused (SIGSTOP) from its third iteration until mpirun's ranks reach theirs, so that on
// a loaded machine it cannot finish before the Ctrl-C.
TEST_F(Sweep, CtrlCStopsEveryPointAtACheckpointAndARunAgainGoesOn) {
  mb::testing::TempDir tmp;
  const fs::path runs = tmp / "runs", dir = runs / "stopme";
  const fs::path file = write_tiny_sweep(tmp.path(), "stopme", R"("global_batch_size": 4, "train_iters": 100, "save_interval": 1000)",
                                         R"("grid": {"data_parallel_size": [1, 2]}, "threads": 1, "jobs": 2)");
  const std::string run = mb::testing::mpi_env() + sweep("run " + file.string() + " --runs-dir " + runs.string());
  const std::string log1 = (dir / "dps1" / "stdout.log").string(), log2 = (dir / "dps2" / "stdout.log").string();
  // "dps[1]": a pattern that matches the point's train process, not this shell's command line
  const std::string dps1_train = "-f '" + (dir / "dps[1]" / "point.json").string() + "'";
  auto r = mb::testing::run_command(run + " > " + (tmp / "sweep.log").string() + " 2>&1 & pid=$!; " + wait_for_third(log1) +
                                    "pkill -STOP " + dps1_train + " && echo paused; " + wait_for_third(log2) +
                                    "pkill -CONT " + dps1_train + "; kill -INT $pid; wait $pid; echo exit=$?; cat " +
                                    (tmp / "sweep.log").string());
  ASSERT_NE(r.output.find("paused"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exit=130"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> interrupted dps1 (resumable)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> interrupted dps2 (resumable)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("> failed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" 0 failed, "), std::string::npos) << r.output;
  std::smatch m;
  for (const auto& log : {log1, log2}) {
    const std::string text = mb::testing::read_text(log);
    ASSERT_TRUE(std::regex_search(text, m, std::regex("stopped by signal (10|15) after iteration (\\d+)"))) << text;
    const int stopped = std::stoi(m[2]);
    ASSERT_LT(stopped, 100) << "the stop came too late to test anything";
    char name[32];
    std::snprintf(name, sizeof name, "iter_%07d.h5", stopped);
    EXPECT_TRUE(fs::exists(fs::path(log).parent_path() / "checkpoints" / name)) << text;
  }
  r = mb::testing::run_command(run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* id : {"dps1", "dps2"}) {
    const std::string text = mb::testing::read_text(dir / id / "stdout.log");
    EXPECT_NE(text.find("> loaded " + (dir / id / "checkpoints" / "iter_").string()), std::string::npos) << text;
    mb::testing::H5File f((dir / id / "metrics.h5").string(), mb::testing::H5File::kRead);
    const auto it = f.read<double>("train/iteration");
    ASSERT_EQ(it.size(), 100u) << id << ": every iteration once, none twice";
    for (size_t i = 0; i < it.size(); ++i) ASSERT_EQ(it[i], static_cast<double>(i + 1)) << id;
  }
}

// One sweep run per sweep directory: while a sweep runs, running it again (even for other
// points) or pruning it is refused naming the first, and touches nothing; --dry-run still
// lists. The lock goes with the first sweep.
TEST_F(Sweep, ASecondSweepRunOfARunningSweepIsRefusedNamingIt) {
  mb::testing::TempDir tmp;
  const fs::path runs = tmp / "runs", dir = runs / "long";
  const fs::path file =
      write_tiny_sweep(tmp.path(), "long", R"("global_batch_size": 2, "train_iters": 1000000, "save_interval": 1000000)",
                       R"("grid": {"optimizer": ["adamw", "lamb"]}, "threads": 1, "jobs": 1)");
  auto r = mb::testing::run_command(sweep("run " + file.string() + " --runs-dir " + runs.string() + " --only adamw") +
                                    " > " + (tmp / "first.log").string() + " 2>&1 & pid=$!; echo pid=$pid; " +
                                    wait_for_third((dir / "adamw" / "stdout.log").string()) +
                                    "kill -0 $pid && echo running");
  ASSERT_NE(r.output.find("running"), std::string::npos) << r.output << mb::testing::read_text(tmp / "first.log");
  const std::string pid = r.output.substr(4, r.output.find('\n') - 4);
  const std::string state = mb::testing::read_text(dir / "sweep.json");
  const std::string lock_free = "flock -n " + (dir / ".megabatch.lock").string() + " -c 'echo free'";

  // (not refused, it would run its point for good: stopped after 300 s to fail, not hang)
  const auto second = mb::testing::run_command("timeout -s INT 300 " + sweep("run " + file.string() + " --runs-dir " +
                                                                              runs.string() + " --only lamb"));
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_NE(second.output.find("sweep: error: " + dir.string() + " is in use by sweep run (pid " + pid + " on host "),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("follow this one with `sweep status " + dir.string() + "`"), std::string::npos)
      << second.output;
  EXPECT_FALSE(fs::exists(dir / "lamb")) << "the refused sweep started nothing";
  EXPECT_EQ(mb::testing::read_text(dir / "sweep.json"), state) << "nor wrote the state";
  EXPECT_EQ(run_sweep(file, runs, " --only lamb --dry-run").exit_code, 0) << "a dry run writes nothing: not refused";
  // prune neither: a point the running sweep starts again would lose what it resumes from
  const auto prune = mb::testing::run_command(sweep("prune " + dir.string()));
  EXPECT_EQ(prune.exit_code, 2) << prune.output;
  EXPECT_NE(prune.output.find("sweep: error: " + dir.string() + " is in use by sweep run (pid " + pid + " on host "),
            std::string::npos)
      << prune.output;
  EXPECT_NE(prune.output.find("prune once it has ended"), std::string::npos) << prune.output;
  EXPECT_NE(mb::testing::run_command(lock_free).exit_code, 0) << "the running sweep holds the lock";

  r = mb::testing::run_command("kill -INT " + pid + "; while [ -e /proc/" + pid + " ] && [ \"$(cut -d' ' -f3 /proc/" +
                               pid + "/stat)\" != Z ]; do sleep 0.05; done; " + lock_free);
  EXPECT_EQ(r.output, "free\n") << "the lock ends with the sweep";
}

TEST_F(Sweep, AFailingPointIsMarkedWithItsReasonAndTheOthersComplete) {
  mb::testing::TempDir tmp;
  const auto file = write_sweep(tmp.path(), "broken", 32, R"("adamw", "no_such_plugin")");
  const fs::path runs = tmp / "runs";
  const auto r = run_sweep(file, runs);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("failed no_such_plugin-bs4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("unknown optimizer plugin 'no_such_plugin'"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(runs / "broken" / "adamw-bs4-lr0.002-s3" / "DONE"));
  EXPECT_TRUE(fs::exists(runs / "broken" / "adamw-bs8-lr0.00283-s3" / "DONE"));
  const auto st = mb::testing::run_command(sweep("status " + (runs / "broken").string()));
  EXPECT_NE(st.output.find("2 done, 0 diverged, 0 running, 2 failed"), std::string::npos) << st.output;
  // the recorded reason (sweep.json), not only the log lines printed when the point failed
  EXPECT_NE(st.output.find("failed      train: error: unknown optimizer plugin 'no_such_plugin'"), std::string::npos)
      << st.output;
}

// --rerun deletes only point directories the sweep tool made (marked), never through a
// symlink, and --dry-run deletes nothing.
TEST_F(Sweep, RerunDeletesOnlyWhatTheSweepToolMade) {
  mb::testing::TempDir tmp;
  const auto file = write_sweep(tmp.path(), "mine", 16, R"("adamw")");
  const fs::path runs = tmp / "runs", root = runs / "mine", outside = tmp / "outside";
  fs::create_directories(outside);
  mb::testing::write_text(outside / "precious.txt", "keep");
  mb::testing::write_text(outside / "point.json", "{\"lr\": 1}");  // looks like a point that ran otherwise
  const std::string changed = "{\"lr\": 1}";
  // 1. a directory with a point's name that the tool did not make
  fs::create_directories(root / "adamw-bs4-lr0.002-s3");
  mb::testing::write_text(root / "adamw-bs4-lr0.002-s3" / "point.json", changed);
  mb::testing::write_text(root / "adamw-bs4-lr0.002-s3" / "thesis.tex", "mine");
  // 2. a symlink with a point's name, to a directory elsewhere
  fs::create_directories(root);
  fs::create_directory_symlink(outside, root / "adamw-bs8-lr0.00283-s3");
  auto r = run_sweep(file, runs, " --rerun");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("not removing"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(root / "adamw-bs4-lr0.002-s3" / "thesis.tex"));
  EXPECT_EQ(mb::testing::read_text(outside / "precious.txt"), "keep");
  // 3. a point the tool made, holding a symlink to the outside: the point goes, the outside stays
  fs::remove_all(root);
  r = run_sweep(file, runs, " --only bs4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> sweep mine: 2 points (1 to run), "), std::string::npos) << r.output;
  const fs::path made = root / "adamw-bs4-lr0.002-s3";
  ASSERT_TRUE(fs::exists(made / ".megabatch-point"));
  fs::create_directory_symlink(outside, made / "link");
  mb::testing::write_text(made / "point.json", changed);
  r = run_sweep(file, runs, " --only bs4 --rerun --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("mine: 2 points, 1 selected by --only (runs in "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--rerun discards"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(made / "link")) << "--dry-run deletes nothing";
  r = run_sweep(file, runs, " --only bs4 --rerun");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(fs::symlink_status(made / "link"))) << "the old point directory was replaced";
  EXPECT_EQ(mb::testing::read_text(outside / "precious.txt"), "keep");
  EXPECT_TRUE(fs::exists(outside / "point.json"));
}

// A point whose directory cannot be written fails with why; the other points run.
TEST_F(Sweep, AReadOnlyPointDirectoryFailsThatPointNotTheSweep) {
  if (::geteuid() == 0) {
    // root writes through mode bits: make the directory immutable-looking with a read-only bind mount instead
    mb::testing::TempDir tmp;
    const auto file = write_sweep(tmp.path(), "ro", 16, R"("adamw")");
    const fs::path runs = tmp / "runs", locked = runs / "ro" / "adamw-bs4-lr0.002-s3";
    fs::create_directories(locked);
    const auto r = mb::testing::run_command("unshare -m sh -c 'mount --bind " + locked.string() + " " + locked.string() +
                                            " && mount -o remount,bind,ro " + locked.string() + " && " +
                                            sweep("run " + file.string() + " --runs-dir " + runs.string()) + "'");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("failed adamw-bs4-lr0.002-s3: cannot start: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("Read-only file system"), std::string::npos) << r.output;
    EXPECT_TRUE(fs::exists(runs / "ro" / "adamw-bs8-lr0.00283-s3" / "DONE")) << "the other point ran:\n" << r.output;
    return;
  }
  mb::testing::TempDir tmp;
  const auto file = write_sweep(tmp.path(), "ro", 16, R"("adamw")");
  const fs::path runs = tmp / "runs", locked = runs / "ro" / "adamw-bs4-lr0.002-s3";
  fs::create_directories(locked);
  fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
  const auto r = run_sweep(file, runs);
  fs::permissions(locked, fs::perms::owner_all);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("failed adamw-bs4-lr0.002-s3: cannot start: "), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(runs / "ro" / "adamw-bs8-lr0.00283-s3" / "DONE")) << r.output;
}

namespace {
// A sweep file of two points of a tiny GPT, `name`: dl100 finishes, dl5 diverges at iteration 2
// (its loss stays above 5 for two log intervals).
void write_diverging_sweep(const fs::path& file, const std::string& name, int train_iters) {
  mb::testing::write_text(file, R"({"name": ")" + name + R"(",
  "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "seq_length": 16, "micro_batch_size": 4,
           "global_batch_size": 4, "train_iters": )" +
                                    std::to_string(train_iters) + R"(, "lr": 0.001,
           "log_interval": 1, "eval_interval": 1000, "eval_iters": 1, "divergence_intervals": 2,
           "data_path": [")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() +
                                    R"("]},
  "grid": {"divergence_loss": [100, 5]}, "threads": 1, "jobs": 2})");
}
}  // namespace

// A diverged point is a result: marked DIVERGED with its iteration and reason, counted by
// status, not retried by a plain re-run (the sweep exits 0), rerun by --rerun diverged.
TEST_F(Sweep, ADivergedPointIsAStateNotAFailure) {
  mb::testing::TempDir tmp;
  const fs::path file = tmp / "div.json", runs = tmp / "runs", dir = runs / "div";
  write_diverging_sweep(file, "div", 12);
  auto r = run_sweep(file, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("diverged dl5: iteration 2: lm loss above 5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 point(s) diverged"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("0 waiting | elapsed 0m0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| ETA 0m00s\n"), std::string::npos) << "the ETA ends at zero: " << r.output;
  EXPECT_TRUE(fs::exists(dir / "dl100" / "DONE"));
  EXPECT_FALSE(fs::exists(dir / "dl5" / "DONE"));
  r = mb::testing::run_command(sweep("status " + dir.string()));
  EXPECT_NE(r.output.find("1 done, 1 diverged, 0 running, 0 failed, 0 waiting"), std::string::npos) << r.output;
  r = run_sweep(file, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("> start"), std::string::npos) << "nothing to rerun: " << r.output;
  r = run_sweep(file, runs, " --rerun diverged");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> start dl5 (attempt 1)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("> start dl100"), std::string::npos) << r.output;
}

// A finished point whose metrics.h5 was lost or damaged afterwards (a cut-short copy, a
// deleted file) has lost its result: sweep status and sweep run name it and why (before:
// both called it done, and sweep run exited 0 with "all points done"), sweep run exits 1
// without running it, and --rerun damaged runs it again — the diverged one too — to the same
// losses as before.
TEST_F(Sweep, AFinishedPointWhoseMetricsAreLostIsSaidAndRerunOnRequest) {
  mb::testing::TempDir tmp;
  const fs::path file = tmp / "lost.json", runs = tmp / "runs", dir = runs / "lost";
  write_diverging_sweep(file, "lost", 8);
  auto r = run_sweep(file, runs, " --rerun damaged");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> warning: --rerun damaged: the metrics.h5 of every finished point reads, so none is run "
                          "again"),
            std::string::npos)
      << r.output;
  const fs::path done = dir / "dl100" / "metrics.h5", diverged = dir / "dl5" / "metrics.h5";
  const auto done_losses = losses(done), diverged_losses = losses(diverged);
  ASSERT_EQ(done_losses.size(), 8u);
  ASSERT_FALSE(diverged_losses.empty());
  // dl100's file cut short, dl5's gone
  const std::string bytes = mb::testing::read_text(done);
  mb::testing::write_text(done, bytes.substr(0, bytes.size() / 2));
  fs::remove(diverged);
  const std::string done_why = done.string() + ": cut short: " + std::to_string(bytes.size() / 2) + " of its " +
                               std::to_string(bytes.size()) + " bytes are there",
                    diverged_why = diverged.string() + ": missing";

  r = mb::testing::run_command(sweep("status " + dir.string()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("1 done, 1 diverged, 0 running, 0 failed, 0 waiting, 2 result(s) lost (metrics.h5 "
                          "unreadable; sweep run --rerun damaged)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("result lost: " + done_why), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("result lost: " + diverged_why), std::string::npos) << r.output;

  r = run_sweep(file, runs);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output.find("> start"), std::string::npos) << "run again only on request: " << r.output;
  for (const auto& [id, why] : {std::pair{"dl100", done_why}, std::pair{"dl5", diverged_why}})
    EXPECT_NE(r.output.find(std::string("> warning: ") + id + " finished, but its result is lost: " + why +
                            "; --rerun damaged discards the point and runs it again"),
              std::string::npos)
        << r.output;
  EXPECT_NE(r.output.find("> 2 finished point(s) have no readable metrics.h5 (named above): their results are lost; "
                          "sweep run --rerun damaged runs them again"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("all points done"), std::string::npos) << r.output;

  r = run_sweep(file, runs, " --rerun damaged --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--rerun discards " + (dir / "dl100").string() + " (result lost: " + done_why + ")"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(dir / "dl100" / "DONE")) << "--dry-run discards nothing";

  r = run_sweep(file, runs, " --rerun damaged");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> start dl100 (attempt 1)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> start dl5 (attempt 1)"), std::string::npos) << r.output;
  EXPECT_EQ(losses(done), done_losses);
  EXPECT_EQ(losses(diverged), diverged_losses);
  r = mb::testing::run_command(sweep("status " + dir.string()));
  EXPECT_NE(r.output.find("1 done, 1 diverged, 0 running, 0 failed, 0 waiting | "), std::string::npos) << r.output;

  // an export meeting a lost result (the second point's, cut short, then gone) names it and
  // what to do, and writes nothing, not even the first point's events (before: a finished
  // point's missing file was counted as "without metrics yet")
  const std::string cut = mb::testing::read_text(diverged);
  mb::testing::write_text(diverged, cut.substr(0, cut.size() / 2));
  for (const std::string& why :
       {": cut short: " + std::to_string(cut.size() / 2) + " of its " + std::to_string(cut.size()) + " bytes are there",
        std::string(": missing")}) {
    if (why == ": missing") fs::remove(diverged);
    for (const std::string& to : {" --csv " + (tmp / "x.csv").string(), " --tensorboard " + (tmp / "tb").string()}) {
      r = mb::testing::run_command(sweep("export " + dir.string() + to));
      EXPECT_EQ(r.exit_code, 2) << r.output;
      EXPECT_NE(r.output.find("sweep: error: " + diverged.string() + why +
                              "; this point's result is lost. `sweep run` of the sweep's file with --rerun damaged "
                              "runs it again; or move the file away, and the export leaves the point out"),
                std::string::npos)
          << r.output;
    }
    EXPECT_FALSE(fs::exists(tmp / "x.csv"));
    EXPECT_FALSE(fs::exists(tmp / "tb"));
  }
}

// A sweep whose points a launcher runs (sweep export-points: Slurm, EKS) has the same remedy:
// export-points names each lost result, sweep status points at exporting again, and
// export-points --rerun damaged discards those points (the diverged one too), so that their
// tasks run them afresh (before: the launchers skipped them as done, with no way but removing
// directories by hand). A point whose train still holds its lock (running under its launcher)
// is never discarded: refused at once, naming the holder, with nothing discarded.
TEST_F(Sweep, AnExportedSweepsLostResultsAreNamedAndDiscardedOnRequest) {
  mb::testing::TempDir tmp;
  const fs::path file = tmp / "lostx.json", runs = tmp / "runs", dir = runs / "lostx";
  write_diverging_sweep(file, "lostx", 8);
  ASSERT_EQ(run_sweep(file, runs).exit_code, 0);
  const std::string export_points = sweep("export-points " + file.string() + " --runs-dir " + runs.string());
  auto r = mb::testing::run_command(export_points);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path done = dir / "dl100" / "metrics.h5", diverged = dir / "dl5" / "metrics.h5";
  const std::string bytes = mb::testing::read_text(done);
  mb::testing::write_text(done, bytes.substr(0, bytes.size() / 2));
  fs::remove(diverged);

  r = mb::testing::run_command(sweep("status " + dir.string()));
  EXPECT_NE(r.output.find("1 done, 1 diverged, 0 running, 0 failed, 0 waiting, 2 result(s) lost (metrics.h5 "
                          "unreadable; export or submit the sweep again with --rerun damaged)"),
            std::string::npos)
      << r.output;
  r = mb::testing::run_command(export_points);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> warning: dl5 finished, but its result is lost: " + diverged.string() +
                          ": missing; --rerun damaged discards the point and runs it again"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(dir / "dl5" / "DIVERGED")) << "discarded only on request";

  {  // dl100 running under its launcher: its train's lock refuses the discard of every point
    const mb::DirLock running(dir / "dl100", "train", "");
    r = mb::testing::run_command(export_points + " --rerun damaged");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find((dir / "dl100").string() + " is in use by train (pid " + std::to_string(getpid())),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("not removing it while it runs"), std::string::npos) << r.output;
    EXPECT_TRUE(fs::exists(dir / "dl100" / "DONE")) << r.output;
  }
  r = mb::testing::run_command(export_points + " --rerun damaged --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("  --rerun discards " + (dir / "dl100").string() + " (result lost: " + done.string() +
                          ": cut short: "),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(dir / "dl100" / "DONE")) << "--dry-run discards nothing";

  r = mb::testing::run_command(export_points + " --rerun damaged");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* id : {"dl100", "dl5"}) {
    EXPECT_NE(r.output.find("> --rerun: discarded " + (dir / id).string() + " (result lost: "), std::string::npos)
        << r.output;
    EXPECT_FALSE(fs::exists(dir / id / "DONE") || fs::exists(dir / id / "DIVERGED")) << id;
    EXPECT_FALSE(fs::exists(dir / id / "stdout.log")) << id << ": its task starts it afresh";
    const auto point = nlohmann::json::parse(mb::testing::read_text(dir / id / "point.json"));
    EXPECT_EQ(point.value("train_iters", 0), 8) << id << ": exported again, for its task";
  }
  r = mb::testing::run_command(sweep("status " + dir.string()));
  EXPECT_NE(r.output.find("sweep: 0 done, 0 diverged, 0 running, 0 failed, 2 waiting | "), std::string::npos)
      << r.output;
}

// On a terminal the live table is redrawn in place, so none of its lines may wrap: each fits
// the terminal's width (a pseudo-terminal of 60 columns made by script(1)). Lines printed
// once (the start and end messages) may wrap.
TEST_F(Sweep, LiveTableFitsTheTerminalWidth) {
  mb::testing::TempDir tmp;
  const auto file = write_sweep(tmp.path(), "a_sweep_with_a_rather_long_name_for_its_points", 16, R"("lamb")",
                                R"(, "optimizer_params": {"weight_decay": 0.01})");
  const fs::path typescript = tmp / "typescript";
  const auto r = mb::testing::run_command("script -qec \"stty cols 60; " + sweep("run " + file.string() + " --runs-dir " +
                                          (tmp / "runs").string()) + "\" " + typescript.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string text = mb::read_file(typescript);
  text = std::regex_replace(text, std::regex("\x1b\\[[0-9;]*[A-Za-z]"), "");
  size_t longest = 0, lines = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find_first_of("\r\n", at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    if (line.rfind("sweep: ", 0) == 0 || line.rfind("  ", 0) == 0) {  // the table's lines
      longest = std::max(longest, line.size());
      ++lines;
    }
    at = end + 1;
  }
  EXPECT_GT(lines, 2u) << text;
  EXPECT_LE(longest, 60u) << text;
}
