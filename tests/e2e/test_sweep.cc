// The sweep tool end to end: a miniature sweep (tiny GPT, two optimizers, two batch sizes,
// a fixed sample budget) runs, plots and reports; a sweep killed with SIGKILL in the middle
// of a point and run again completes with metrics identical to the uninterrupted sweep;
// Ctrl-C stops points of one and of two ranks at checkpoints they go on from;
// a failing point leaves the others alone; invalid points are refused before anything
// runs; a changed configuration is not mixed with old results; a second sweep starts its
// points from the first's checkpoints.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <tuple>

#include "core/util/strings.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace fs = std::filesystem;
namespace mb = megabatch;

namespace {

class Sweep : public ::testing::Test {
 public:
  // A sweep file: tiny GPT, lamb and adamw, batch sizes 4 and 8, `budget` samples each.
  static fs::path write_sweep(const fs::path& dir, const std::string& name, int budget, const std::string& optimizers,
                              const std::string& extra_base = "") {
    const fs::path file = dir / (name + ".json");
    mb::testing::write_text(file, R"({
  "name": ")" + name + R"(",
  "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "seq_length": 16,
           "micro_batch_size": 4, "lr": 0.002, "log_interval": 1, "eval_interval": 1000, "eval_iters": 2,
           "data_path": [")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("],
           "hidden_dropout": 0.1, "attention_dropout": 0.1)" + extra_base + R"(},
  "grid": {"optimizer": [)" + optimizers + R"(]},
  "zip": {"global_batch_size": [4, 8]},
  "seeds": [3],
  "derive": {"lr_scaling": {"rule": "sqrt", "ref_batch": 4}, "sample_budget": )" + std::to_string(budget) + R"(},
  "jobs": 2, "threads": 1
})");
    return file;
  }
  // A sweep file of one tiny GPT logging every iteration: `base` adds to its base, `rest` is
  // the file's other keys (grid, threads, jobs).
  static fs::path write_tiny_sweep(const fs::path& dir, const std::string& name, const std::string& base,
                                   const std::string& rest) {
    const fs::path file = dir / (name + ".json");
    mb::testing::write_text(file, R"({"name": ")" + name + R"(",
  "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "seq_length": 16, "micro_batch_size": 2,
           "lr": 0.001, "log_interval": 1, "eval_iters": 0, )" + base + R"(,
           "data_path": [")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("]},
  )" + rest + "}");
    return file;
  }
  // Shell: wait (up to five minutes on a loaded machine) until the log shows the third iteration.
  static std::string wait_for_third(const std::string& log) {
    return mb::testing::wait_for_line(log, "iteration  *[3-9]/");
  }
  static std::string sweep(const std::string& args) { return mb::testing::bin_dir() + "/sweep " + args; }
  // sweep run FILE --runs-dir RUNS [extra flags]
  static mb::testing::CommandResult run_sweep(const fs::path& file, const fs::path& runs, const std::string& extra = "") {
    return mb::testing::run_command(sweep("run " + file.string() + " --runs-dir " + runs.string() + extra));
  }
};

std::vector<double> losses(const fs::path& metrics) {
  mb::testing::H5File f(metrics.string(), mb::testing::H5File::kRead);
  return f.read<double>("train/lm_loss");
}

const std::vector<std::string> kIds = {"lamb-bs4-lr0.002-s3", "lamb-bs8-lr0.00283-s3", "adamw-bs4-lr0.002-s3",
                                       "adamw-bs8-lr0.00283-s3"};

}  // namespace

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

TEST_F(Sweep, InvalidPointsAreRefusedBeforeAnythingRuns) {
  mb::testing::TempDir tmp;
  const auto file = write_sweep(tmp.path(), "bad", 32, R"("adamw")", R"(, "hiden_size": 64)");
  auto r = mb::testing::run_command(sweep("run " + file.string() + " --runs-dir " + (tmp / "runs").string()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("point adamw-bs4-lr0.002-s3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("hiden_size"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("hidden_size"), std::string::npos) << "the nearest valid name: " << r.output;
  EXPECT_FALSE(fs::exists(tmp / "runs"));
  // a budget that a batch size does not divide
  const auto odd = write_sweep(tmp.path(), "odd", 30, R"("adamw")");
  r = mb::testing::run_command(sweep("run " + odd.string() + " --runs-dir " + (tmp / "runs").string()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("sample budget 30 is not a multiple of global_batch_size 4"), std::string::npos) << r.output;
  // refused by what they would have done, each named with its point:
  // - a decay in iterations beside a warmup in samples, which makes a point of a sample budget
  //   count samples (its train_samples): the run would ignore the decay's count;
  // - a train_iters the sample budget replaced;
  // - keys the sweep sets for each point, and loading options that would act on the point's
  //   own checkpoints: a point meant to fine-tune from another run's trained from scratch;
  // - an exit_interval: each point stopped early and was marked done;
  // - train's lr_scaling in a point as well as derive.lr_scaling: lr scaled twice
  for (const auto& [name, extra, message] :
       {std::tuple{"mixed", R"(, "lr_warmup_samples": 16, "lr_decay_iters": 6)",
                   "lr_decay_iters counts iterations, but this run counts samples (train_samples, from "
                   "derive.sample_budget, as lr_warmup_samples counts samples), which would ignore it; give "
                   "lr_decay_samples instead"},
        std::tuple{"length", R"(, "train_iters": 100)",
                   "train_iters 100 would be replaced by derive.sample_budget (32 samples / global batch 4 = 8 "
                   "iterations)"},
        std::tuple{"owned", R"(, "finetune": true)",
                   "finetune would apply to the point's own checkpoints when it resumes"},
        std::tuple{"owned", R"(, "load": "/pretrained/ckpt")", "load is the sweep's to set"},
        std::tuple{"owned", R"(, "run_dir": "elsewhere")", "run_dir is the sweep's to set"},
        std::tuple{"early", R"(, "exit_interval": 2)",
                   "exit_interval 2 would stop the point before its end, and the sweep would take it for finished"},
        std::tuple{"twice", R"(, "lr_scaling": "sqrt", "lr_scaling_ref_batch": 4)",
                   "lr_scaling \"sqrt\" and derive.lr_scaling both scale lr with the batch, so it would be scaled "
                   "twice"}}) {
    const auto refused = write_sweep(tmp.path(), name, 32, R"("adamw")", extra);
    r = mb::testing::run_command(sweep("run " + refused.string() + " --runs-dir " + (tmp / "runs").string()));
    EXPECT_EQ(r.exit_code, 2) << extra;
    EXPECT_NE(r.output.find(std::string(name) + ".json: point adamw-bs4-lr0.002-s3: " + message), std::string::npos)
        << r.output;
  }
  // batch sizes the derived values would divide by (0: a division by zero, found by the
  // fuzz preset), a number beyond a double's range, a seed that is not one
  const std::string text = mb::testing::read_text(odd);
  using Edits = std::vector<std::pair<std::string, std::string>>;
  const std::vector<std::pair<Edits, std::string>> cases = {
      {{{R"("global_batch_size": [4, 8])", R"("global_batch_size": [0, 8])"}},
       "point adamw-bs0-lr0.002-s3: global_batch_size: expected an integer >= 1, got 0"},
      {{{R"("global_batch_size": [4, 8])", R"("global_batch_size": ["4", 8])"}},
       "global_batch_size: expected an integer >= 1, got \"4\""},
      {{{R"("lr": 0.002)", R"("lr": 1e999)"}}, "case.json: not valid JSON (number overflow parsing '1e999')"},
      {{{R"("seeds": [3],)", ""}, {R"("eval_iters": 2,)", R"("eval_iters": 2, "seed": "3",)"}},
       "case.json: base.seed: expected an integer >= 0, got \"3\""},
  };
  for (const auto& [edits, message] : cases) {
    std::string changed = text;
    for (const auto& [from, to] : edits) {
      ASSERT_NE(changed.find(from), std::string::npos) << from;
      changed.replace(changed.find(from), from.size(), to);
    }
    mb::testing::write_text(tmp / "case.json", changed);
    r = mb::testing::run_command(sweep("run " + (tmp / "case.json").string() + " --runs-dir " + (tmp / "runs").string()));
    EXPECT_EQ(r.exit_code, 2) << message << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << message << "\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(tmp / "runs"));
}

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

// Swept strings never steer where points go: a path contributes its last component, other
// characters become '_', ids are length-limited; nothing is created outside runs/<name>/.
TEST_F(Sweep, PointIdsAreFileNamesOfTheirOwn) {
  mb::testing::TempDir tmp;
  const std::string data = (mb::testing::brown_data() / "brown_gpt2_text_document").string();
  const fs::path file = tmp / "ids.json";
  mb::testing::write_text(file, R"({"name": "ids",
  "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "seq_length": 16, "micro_batch_size": 2,
           "global_batch_size": 2, "lr": 0.002, "train_iters": 1, "eval_iters": 0, "data_path": [")" + data + R"("]},
  "grid": {"optimizer": ["../../../escape", "..", "a b\u0001c", ")" + std::string(200, 'x') + R"("],
           "tokenizer_type": ["GPT2BPETokenizer"]}})");
  const fs::path runs = tmp / "nested" / "runs";
  auto r = run_sweep(file, runs, " --jobs 1");
  EXPECT_EQ(r.exit_code, 1) << "the optimizers do not exist: " << r.output;
  std::vector<std::string> made;
  for (const auto& e : fs::directory_iterator(runs / "ids"))
    if (e.is_directory()) made.push_back(e.path().filename().string());
  std::sort(made.begin(), made.end());
  ASSERT_EQ(made.size(), 4u) << r.output;
  EXPECT_EQ(made[0], "_.-ttGPT2BPETokenizer");
  EXPECT_EQ(made[1], "a_b_c-ttGPT2BPETokenizer");
  EXPECT_EQ(made[2], "escape-ttGPT2BPETokenizer");
  EXPECT_EQ(made[3].size(), 120u);
  EXPECT_EQ(made[3].substr(0, 10), "xxxxxxxxxx");
  std::vector<std::string> outside;
  for (const auto& e : fs::recursive_directory_iterator(tmp.path()))
    if (e.path().filename().string().find("escape") != std::string::npos) outside.push_back(e.path().string());
  EXPECT_EQ(outside, std::vector<std::string>{(runs / "ids" / "escape-ttGPT2BPETokenizer").string()});
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

// Sweep-level numbers: jobs and threads in files and flags, seeds, and a point limit that
// refuses a runaway grid before it is expanded.
TEST_F(Sweep, SweepNumbersAndSizeAreChecked) {
  mb::testing::TempDir tmp;
  const auto file = write_sweep(tmp.path(), "n", 32, R"("adamw")");
  auto r = mb::testing::run_command(sweep("run " + file.string() + " --dry-run --jobs -1"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--jobs: must be >= 1"), std::string::npos) << r.output;
  // more threads per point than this machine's CPUs: every point's train would refuse them
  // (train --threads 100000 ended in a segmentation fault)
  r = mb::testing::run_command(sweep("run " + file.string() + " --dry-run --threads 4096"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--threads: 4096 is more than the "), std::string::npos) << r.output;
  std::string text = mb::testing::read_text(file);  // its "threads": 1 made 4096 (a second key would be refused)
  ASSERT_NE(text.find("\"threads\": 1"), std::string::npos);
  mb::testing::write_text(tmp / "t.json", text.replace(text.find("\"threads\": 1"), 12, "\"threads\": 4096"));
  r = mb::testing::run_command(sweep("run " + (tmp / "t.json").string() + " --dry-run"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find((tmp / "t.json").string() + ": threads: 4096 is more than the "), std::string::npos)
      << r.output;
  r = mb::testing::run_command(sweep("run " + file.string() + " --dry-run --max-points 1"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("the sweep has 2 points (grid x zip groups x seeds), more than the limit of 1; raise it with --max-points N"), std::string::npos)
      << r.output;
  std::string big = "[";
  for (int i = 0; i < 1000; ++i) big += (i ? "," : "") + std::to_string(i + 1);
  big += "]";
  mb::testing::write_text(tmp / "huge.json", R"({"name": "huge", "base": {"lr": 0.001, "train_iters": 1},
    "grid": {"num_layers": )" + big + R"(, "hidden_size": )" + big + R"(, "seq_length": )" + big + R"(}})");
  r = mb::testing::run_command(sweep("run " + (tmp / "huge.json").string() + " --dry-run"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("the sweep has 1000000000 points (grid x zip groups x seeds), more than the limit of 10000"),
            std::string::npos) << r.output;
  mb::testing::write_text(tmp / "j.json", R"({"name": "j", "base": {"lr": 0.001, "train_iters": 1}, "jobs": 1.5})");
  r = mb::testing::run_command(sweep("run " + (tmp / "j.json").string() + " --dry-run"));
  EXPECT_NE(r.output.find("jobs: expected an integer in [1, 4096], got 1.5"), std::string::npos) << r.output;
  mb::testing::write_text(tmp / "s.json", R"({"name": "s", "base": {"lr": 0.001, "train_iters": 1}, "seeds": [-1]})");
  r = mb::testing::run_command(sweep("run " + (tmp / "s.json").string() + " --dry-run"));
  EXPECT_NE(r.output.find("seeds: -1 is not an integer >= 0"), std::string::npos) << r.output;
}

// The dry run says what a point's run would: a validation split that holds nothing, with
// --eval-iters given, is refused (train --check passed it, and every point then failed at
// its start); with the default --eval-iters it is a warning, said in full once and by
// reference for the points after.
TEST_F(Sweep, DryRunRefusesAndWarnsOfAnEmptyValidationSplitAsThePointsWould) {
  mb::testing::TempDir tmp;
  auto write = [&](const std::string& name, const std::string& eval) {
    const fs::path f = tmp / (name + ".json");
    mb::testing::write_text(f, R"({"name": ")" + name + R"(", "base": {"num_layers": 1, "hidden_size": 32,
      "num_attention_heads": 2, "seq_length": 16, "micro_batch_size": 2, "train_iters": 2, "lr": 0.001,
      "split": "100,0,0", )" + eval +
                                   R"("data_path": [")" +
                                   (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("]},
      "seeds": [1, 2]})");
    return f;
  };
  const std::string data = (mb::testing::brown_data() / "brown_gpt2_text_document").string();
  const std::string why = "the validation split of --split '100,0,0' holds no document of " + data + "'s 500";
  auto r = run_sweep(write("asked", R"("eval_iters": 3, )"), tmp / "runs", " --dry-run");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("    cannot run: train: error: --eval-iters asks for validation, but " + why),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("> 2 point(s) cannot run (above)"), std::string::npos) << r.output;
  r = run_sweep(write("default", ""), tmp / "runs", " --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string warned = "    warning: no validation loss will be logged: " + why;
  const size_t first = r.output.find(warned);
  EXPECT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(warned, first + 1), std::string::npos) << "said once: " << r.output;
  EXPECT_NE(r.output.find("    warning: as s1 above"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> every point checked"), std::string::npos) << r.output;
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

// Local sweeps are checked point by point (train --check) from a directory whose data/ holds
// the Brown corpus, as after the README's first command; cluster sweeps only expand here.
TEST(SweepFiles, EveryShippedSweepExpandsAndValidates) {
  mb::testing::TempDir cwd;
  fs::create_directory_symlink(mb::testing::brown_data(), cwd / "data");
  size_t files = 0;
  for (const fs::path& dir : {fs::path(mb::testing::source_dir()) / "experiments",
                             fs::path(mb::testing::source_dir()) / "experiments" / "paper"})
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() != ".json") continue;
      ++files;
      const auto r = mb::testing::run_command("cd " + cwd.path().string() + " && " + mb::testing::bin_dir() + "/sweep run " +
                                              e.path().string() + " --dry-run");
      EXPECT_EQ(r.exit_code, 0) << e.path() << "\n" << r.output;
      EXPECT_NE(r.output.find(" points (runs in "), std::string::npos) << r.output;
      EXPECT_TRUE(r.output.find("> every point checked") != std::string::npos ||
                  r.output.find("> sized for {") != std::string::npos) << r.output;
      EXPECT_EQ(r.output.find("log the noise scale averaged by 0.99 a step"), std::string::npos)
          << "a shipped sweep averages B_simple alike at every batch size: " << r.output;
    }
  EXPECT_GE(files, 7u);
}

// The shipped phase 2 names phase 1's points by their ids, under the runs directory given.
TEST(SweepFiles, BertLargePhaseTwoStartsFromEachPhaseOnePoint) {
  const fs::path paper = fs::path(mb::testing::source_dir()) / "experiments" / "paper";
  auto dry_run = [&](const char* file) {
    const auto r = mb::testing::run_command(mb::testing::bin_dir() + "/sweep run " + (paper / file).string() +
                                            " --dry-run --runs-dir /nonexistent");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  const std::string first = dry_run("bert_large_lamb.json"), second = dry_run("bert_large_lamb_phase2.json");
  const std::regex id("\n  (bs[0-9]+-[^ ]+)  [{]");
  int ids = 0;
  for (auto it = std::sregex_iterator(first.begin(), first.end(), id); it != std::sregex_iterator(); ++it, ++ids) {
    const std::string named =
        "\"pretrained_checkpoint\":\"/nonexistent/bert_large_lamb/" + (*it)[1].str() + "/checkpoints\"";
    EXPECT_NE(second.find(named), std::string::npos) << named << "\n" << second;
  }
  EXPECT_EQ(ids, 3) << first;
}

// A diverged point is a result: marked DIVERGED with its iteration and reason, counted by
// status, not retried by a plain re-run (the sweep exits 0), rerun by --rerun diverged.
TEST_F(Sweep, ADivergedPointIsAStateNotAFailure) {
  mb::testing::TempDir tmp;
  const fs::path file = tmp / "div.json", runs = tmp / "runs", dir = runs / "div";
  mb::testing::write_text(file, R"({"name": "div",
  "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "seq_length": 16, "micro_batch_size": 4,
           "global_batch_size": 4, "train_iters": 12, "lr": 0.001, "log_interval": 1, "eval_interval": 1000,
           "eval_iters": 1, "divergence_intervals": 2,
           "data_path": [")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("]},
  "grid": {"divergence_loss": [100, 5]}, "threads": 1, "jobs": 2})");
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
// the files); prune frees exactly that, each point keeps its newest checkpoint, and status
// then has nothing left to free.
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
  r = mb::testing::run_command(sweep("prune " + dir.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NEAR(bytes_after(r.output, "freed "), old_bytes, 0.051e6) << r.output;
  EXPECT_NE(r.output.find("in 2 point(s)"), std::string::npos) << r.output;
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(checkpoints(dir / ids[i]), std::vector<fs::path>{newest[i]}) << ids[i];
  r = mb::testing::run_command(sweep("status " + dir.string()));
  EXPECT_NE(r.output.find("none that sweep prune would free"), std::string::npos) << r.output;
}

// The random axis: count draws, uniform or log-uniform within the bounds, the same points
// for the same seed (ids and values), others for another seed; bad specs name the key.
TEST_F(Sweep, RandomAxisIsReproducibleBySeed) {
  mb::testing::TempDir tmp;
  auto write = [&](int seed, const std::string& params) {
    const fs::path f = tmp / ("r" + std::to_string(seed) + ".json");
    mb::testing::write_text(f, R"({"name": "rnd", "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
      "seq_length": 16, "micro_batch_size": 4, "global_batch_size": 4, "train_iters": 4, "lr": 0.001,
      "data_path": [")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("]},
      "random": {"count": 24, "seed": )" + std::to_string(seed) + R"(, "params": )" + params + "}}");
    return f;
  };
  const std::string params = R"({"lr": {"log_uniform": [1e-4, 1e-2]}, "weight_decay": {"uniform": [0, 0.1]},
                                  "num_layers": {"uniform": [1, 3]}})";
  auto dry = [&](const fs::path& f) {
    return mb::testing::run_command(sweep("run " + f.string() + " --dry-run --runs-dir " + (tmp / "runs").string()));
  };
  const auto a = dry(write(5, params)), b = dry(write(5, params)), c = dry(write(6, params));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_NE(a.output, c.output);
  const std::regex point(R"re("lr":([0-9.e-]+),"num_layers":(\d+),.*"weight_decay":([0-9.e-]+))re");
  int n = 0, below_1e3 = 0, layers3 = 0;
  for (auto it = std::sregex_iterator(a.output.begin(), a.output.end(), point); it != std::sregex_iterator(); ++it, ++n) {
    const double lr = std::stod((*it)[1]), wd = std::stod((*it)[3]);
    const int layers = std::stoi((*it)[2]);
    EXPECT_TRUE(lr >= 1e-4 && lr <= 1e-2) << lr;
    EXPECT_TRUE(wd >= 0 && wd <= 0.1) << wd;
    EXPECT_TRUE(layers >= 1 && layers <= 3) << layers;
    below_1e3 += lr < 1e-3;
    layers3 += layers == 3;
  }
  EXPECT_EQ(n, 24) << a.output;
  EXPECT_GT(below_1e3, 4) << "log-uniform: about half of the draws lie below the geometric middle 1e-3";
  EXPECT_LT(below_1e3, 20);
  EXPECT_GT(layers3, 0) << "integer bounds draw integers up to the upper bound";
  const auto bad = dry(write(5, R"({"lr": {"log_uniform": [0, 1e-2]}})"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("random.params.lr: log_uniform needs lo > 0"), std::string::npos) << bad.output;
  const fs::path bad_seed = tmp / "badseed.json";
  mb::testing::write_text(bad_seed, R"({"name": "rnd", "base": {"lr": 0.001, "train_iters": 4},
                                        "random": {"count": 2, "seed": 1.5, "params": {"lr": {"uniform": [0, 1]}}}})");
  const auto bs = dry(bad_seed);
  EXPECT_EQ(bs.exit_code, 2);
  EXPECT_NE(bs.output.find("random.seed: expected an integer >= 0, got 1.5"), std::string::npos) << bs.output;
}

// A null unsets a key (JSON merge patch): a file that includes the default sweep can compare
// an optimizer that lacks one of its hyperparameters. Here the included file sets clip_grad,
// adamw's beta2 and a grid; the including one drops clip_grad from the base (the points run
// at train's default), drops the grid, and gives sgd, which has no beta2, no optimizer_params.
TEST_F(Sweep, ANullUnsetsAKeyOfAnIncludedFileOrOfOnePoint) {
  mb::testing::TempDir tmp;
  mb::testing::write_text(tmp / "inc.json", R"({"name": "inc", "base": {"num_layers": 1, "hidden_size": 32,
    "num_attention_heads": 2, "seq_length": 16, "micro_batch_size": 2, "train_iters": 2, "lr": 0.001, "eval_iters": 0,
    "clip_grad": 0.5, "optimizer_params": {"beta2": 0.95},
    "data_path": [")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("]},
    "grid": {"optimizer": ["adamw", "lamb"]}})");
  mb::testing::write_text(tmp / "top.json", R"({"include": "inc.json", "name": "top", "grid": null,
    "base": {"clip_grad": null},
    "zip": {"optimizer": ["adamw", "sgd"], "optimizer_params": [{"beta2": 0.9}, null]}})");
  const auto r = run_sweep(tmp / "top.json", tmp / "runs");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path root = tmp / "runs" / "top";
  std::vector<std::string> points;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory()) points.push_back(e.path().filename().string());
  std::sort(points.begin(), points.end());
  EXPECT_EQ(points, (std::vector<std::string>{"adamw", "sgd"})) << "two points, from the zip alone";
  const auto adamw = nlohmann::json::parse(mb::testing::read_text(root / "adamw" / "point.json"));
  const auto sgd = nlohmann::json::parse(mb::testing::read_text(root / "sgd" / "point.json"));
  EXPECT_FALSE(adamw.contains("clip_grad")) << adamw;
  EXPECT_EQ(adamw["optimizer_params"], nlohmann::json({{"beta2", 0.9}}));
  EXPECT_FALSE(sgd.contains("optimizer_params")) << sgd;
  const auto resolved = nlohmann::json::parse(mb::testing::read_text(root / "sgd" / "config.json"));
  EXPECT_EQ(resolved["clip_grad"], 1.0) << "train's default, as if clip_grad had never been given";
}

// sweep export-points (for launchers/slurm and eks) leaves what sweep run would: each
// point.json with the checkpoint schedule sweep run gives it (a checkpoint every tenth of its
// iterations: a lost node costs no more), and the sweep's state, which status reads (before,
// "no sweep here"); exported again with a changed value, the refusal names the key. The old
// name of the command (sweep export FILE.json) still works, and says its new name.
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
  EXPECT_NE(r.output.find("Remove those points' directories"), std::string::npos) << r.output;
}

// The derived lr and train_iters divide by the point's global batch, which a point without
// global_batch_size has as micro_batch_size x data_parallel_size; derive writes it into the
// point, so that the run trains at the batch its values were derived for. Before, they divided
// by micro_batch_size alone: at DP 2 each point trained on twice its sample budget, at an lr
// scaled for half its batch (and a cluster job, whose DP comes from its ranks, likewise).
TEST_F(Sweep, DerivedValuesDivideByTheGlobalBatchTheyWriteIntoThePoint) {
  mb::testing::TempDir tmp;
  const fs::path runs = tmp / "runs";
  const fs::path file = write_tiny_sweep(
      tmp.path(), "dp", R"("data_parallel_size": 2)",
      R"("zip": {"micro_batch_size": [2, 4]}, "derive": {"lr_scaling": {"rule": "linear", "ref_batch": 4},
                           "sample_budget": 64})");
  const auto r = mb::testing::run_command(sweep("export-points " + file.string() + " --runs-dir " + runs.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<nlohmann::json> points;
  for (const auto& e : fs::directory_iterator(runs / "dp"))
    if (fs::exists(e.path() / "point.json"))
      points.push_back(nlohmann::json::parse(mb::testing::read_text(e.path() / "point.json")));
  ASSERT_EQ(points.size(), 2u) << r.output;
  for (const auto& point : points) {
    const int64_t micro = point.at("micro_batch_size").get<int64_t>(), global = 2 * micro;
    EXPECT_EQ(point.value("global_batch_size", 0), global) << point;
    EXPECT_EQ(point.value("train_iters", 0), 64 / global) << point;
    EXPECT_DOUBLE_EQ(point.value("lr", 0.0), 0.001 * static_cast<double>(global) / 4) << point;
  }
}

// A ramped batch is counted in samples (Megatron refuses a ramp in a run of iterations): the
// sample budget is each point's train_samples, and the point's iterations are Megatron's count
// of the ramp. Ramp 4 4 32 over a budget of 64: to 8, nine steps (4 x 8, then one of 8 at 32
// samples) and three of 8; to 16 (stages of 32 / 3 samples), 4, 4, 4, 8, 8, 12 to 40 samples,
// then one of 16.
TEST_F(Sweep, ARampedBatchTrainsOnTheSampleBudgetInMegatronsIterations) {
  mb::testing::TempDir tmp;
  const fs::path runs = tmp / "runs";
  const fs::path file = write_tiny_sweep(tmp.path(), "ramp", R"("rampup_batch_size": [4, 4, 32])",
                                         R"("zip": {"global_batch_size": [8, 16]}, "derive": {"sample_budget": 64},
                                            "threads": 1)");
  const auto r = run_sweep(file, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto state = nlohmann::json::parse(mb::testing::read_text(runs / "ramp" / "sweep.json"));
  std::map<std::string, int64_t> iterations;
  for (const auto& p : state.at("points"))
    iterations[p.at("id").get<std::string>()] = p.at("train_iters").get<int64_t>();
  EXPECT_EQ(iterations, (std::map<std::string, int64_t>{{"bs8", 12}, {"bs16", 7}})) << state.dump();
  const std::map<std::string, std::vector<double>> batches = {{"bs8", {4, 4, 4, 4, 4, 4, 4, 4, 8, 8, 8, 8}},
                                                              {"bs16", {4, 4, 4, 8, 8, 12, 16}}};
  for (const auto& [id, batch] : batches) {
    const auto point = nlohmann::json::parse(mb::testing::read_text(runs / "ramp" / id / "point.json"));
    EXPECT_EQ(point.value("train_samples", 0), 64) << point;
    EXPECT_FALSE(point.contains("train_iters")) << point;
    mb::testing::H5File f((runs / "ramp" / id / "metrics.h5").string(), mb::testing::H5File::kRead);
    EXPECT_EQ(f.read<double>("train/global_batch_size"), batch) << id;
  }
  // at DP 2, a ramp whose batches are not whole micro-batches on each rank is refused by the
  // dry run (micro batch 2 x DP 2 = 4: a start of 2 is not)
  const fs::path odd =
      write_tiny_sweep(tmp.path(), "odd", R"("rampup_batch_size": [2, 2, 32], "data_parallel_size": 2)",
                       R"("zip": {"global_batch_size": [8]}, "derive": {"sample_budget": 64})");
  const auto o = mb::testing::run_command(mb::testing::mpi_env() +
                                          sweep("run " + odd.string() + " --dry-run --runs-dir " + runs.string()));
  EXPECT_NE(o.exit_code, 0) << o.output;
  EXPECT_NE(o.output.find("must be multiples of micro_batch_size x data-parallel size (2 x 2 = 4)"), std::string::npos)
      << o.output;
}

// A schedule counted in samples (a warmup, decay or WSD decay of so many samples, the same at
// every batch size) makes a point of a sample budget count samples, as train requires: the
// budget is its train_samples. Before, the sweep made every such point count iterations and
// refused the schedule, so a WSD decay over the budget's last samples had to be zipped with
// the batch sizes by hand. The learning rate is then the same function of the samples consumed
// at batch 4 and 8, and the same as at batch 4 with the schedule given in iterations.
TEST_F(Sweep, AScheduleInSamplesMakesTheBudgetsPointsCountSamples) {
  mb::testing::TempDir tmp;
  const fs::path runs = tmp / "runs";
  const std::string schedule = R"("lr_decay_style": "WSD", "lr_wsd_decay_style": "linear", "min_lr": 0.0001)";
  const fs::path in_samples =
      write_tiny_sweep(tmp.path(), "samples", schedule + R"(, "lr_warmup_samples": 16, "lr_wsd_decay_samples": 24)",
                       R"("zip": {"global_batch_size": [4, 8]}, "derive": {"sample_budget": 64}, "threads": 1)");
  auto r = run_sweep(in_samples, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // the reference: batch 4 counted in iterations, 16 / 4 = 4 of warmup, 24 / 4 = 6 of decay
  const fs::path in_iters =
      write_tiny_sweep(tmp.path(), "iters", schedule + R"(, "lr_warmup_iters": 4, "lr_wsd_decay_iters": 6)",
                       R"("zip": {"global_batch_size": [4]}, "derive": {"sample_budget": 64}, "threads": 1)");
  r = run_sweep(in_iters, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // learning rate by consumed samples
  const auto lr_at = [&](const fs::path& point) {
    mb::testing::H5File f((point / "metrics.h5").string(), mb::testing::H5File::kRead);
    const auto samples = f.read<double>("train/consumed_samples"), lr = f.read<double>("train/learning_rate");
    std::map<int64_t, double> out;
    for (size_t i = 0; i < samples.size() && i < lr.size(); ++i) out[static_cast<int64_t>(samples[i])] = lr[i];
    return out;
  };
  for (const char* id : {"bs4", "bs8"}) {
    const auto point = nlohmann::json::parse(mb::testing::read_text(runs / "samples" / id / "point.json"));
    EXPECT_EQ(point.value("train_samples", 0), 64) << point;
    EXPECT_FALSE(point.contains("train_iters")) << point;
  }
  const auto reference = lr_at(runs / "iters" / "bs4"), at4 = lr_at(runs / "samples" / "bs4"),
             at8 = lr_at(runs / "samples" / "bs8");
  ASSERT_EQ(reference.size(), 16u);
  EXPECT_EQ(at4, reference) << "batch 4: the schedule in samples is the schedule in iterations";
  ASSERT_EQ(at8.size(), 8u);
  // a row's learning rate is its step's, of the samples before the step: batch 8's row at c
  // samples is batch 4's at c - 4
  for (const auto& [consumed, lr] : at8)
    EXPECT_EQ(lr, reference.at(consumed - 4)) << "batch 8 at " << consumed << " samples";
  EXPECT_LT(at8.at(64), at8.at(32)) << "the decay ran";
  // each key counted in samples does it alone
  for (const std::string key : {R"("lr_warmup_samples": 16)", R"("lr_decay_samples": 48)",
                                R"("lr_decay_style": "WSD", "lr_wsd_decay_samples": 16)"}) {
    const fs::path one = write_tiny_sweep(tmp.path(), "one", key,
                                          R"("zip": {"global_batch_size": [8]}, "derive": {"sample_budget": 64})");
    const fs::path dir = tmp / ("one" + std::to_string(std::hash<std::string>{}(key)));
    r = mb::testing::run_command(sweep("export-points " + one.string() + " --runs-dir " + dir.string()));
    ASSERT_EQ(r.exit_code, 0) << key << "\n" << r.output;
    const auto point = nlohmann::json::parse(mb::testing::read_text(dir / "one" / "bs8" / "point.json"));
    EXPECT_EQ(point.value("train_samples", 0), 64) << point;
    EXPECT_FALSE(point.contains("train_iters")) << point;
  }
}

// --dry-run runs train --check for every point: a hyperparameter the plugin does not have
// and a missing dataset are reported per point, with the command that makes the default data.
TEST_F(Sweep, DryRunChecksPluginsDataAndMemoryOfEveryPoint) {
  mb::testing::TempDir tmp;
  const fs::path f = tmp / "chk.json";
  mb::testing::write_text(f, R"({"name": "chk", "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
    "seq_length": 16, "micro_batch_size": 4, "global_batch_size": 4, "train_iters": 4, "lr": 0.001,
    "optimizer_params": {"beta2": 0.95}},
    "grid": {"optimizer": ["adamw", "sgd"], "data_path": [[")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() +
                              R"("], [")" + (tmp / "nowhere" / "brown_missing_text_document").string() + R"("]]}})");
  const auto r = mb::testing::run_command(sweep("run " + f.string() + " --dry-run --runs-dir " + (tmp / "runs").string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("plugin 'sgd' has no hyperparameter 'beta2'"), std::string::npos) << r.output;
  // the preprocess beside this train, into the directory the point names
  EXPECT_NE(r.output.find("/preprocess brown --output-dir " + (tmp / "nowhere").string() + "`, run it first"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> 3 point(s) cannot run"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp / "runs" / "chk")) << "a dry run writes nothing";
}

// A second phase: each point starts from the final checkpoint of its batch size's point of an
// earlier sweep (pretrained_checkpoint zipped with the batch), checked by --dry-run before
// that sweep has run and taken when it has.
TEST_F(Sweep, PointsStartFromTheCheckpointsOfAnEarlierSweep) {
  mb::testing::TempDir tmp;
  const fs::path runs = tmp / "runs";
  const auto first = write_tiny_sweep(tmp.path(), "first", R"("train_iters": 2)",
                                      R"("zip": {"global_batch_size": [2, 4]}, "threads": 1)");
  const std::string from2 = (runs / "first" / "bs2" / "checkpoints").string(),
                    from4 = (runs / "first" / "bs4" / "checkpoints").string();
  // the second names the first's checkpoints under whatever --runs-dir it is given
  const auto second = write_tiny_sweep(tmp.path(), "second", R"("train_iters": 3, "optimizer": "adamw")",
                                       R"("zip": {"global_batch_size": [2, 4], "pretrained_checkpoint":
                                           ["{runs_dir}/first/bs2/checkpoints", "{runs_dir}/first/bs4/checkpoints"]},
                                         "threads": 1)");
  auto r = run_sweep(second, runs, " --dry-run");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--pretrained-checkpoint: " + from4 + " holds no checkpoint to start from"),
            std::string::npos)
      << r.output;
  r = run_sweep(first, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_sweep(second, runs, " --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run_sweep(second, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& [id, from, samples] : {std::tuple{"bs2", from2, 4}, std::tuple{"bs4", from4, 8}}) {
    const std::string log = mb::testing::read_text(runs / "second" / id / "stdout.log");
    EXPECT_NE(log.find("> loaded the model from " + from + "/iter_0000002.h5 (iteration 2, " + std::to_string(samples) +
                       " samples); starting at iteration 0"),
              std::string::npos)
        << log;
  }
  // a grid of them at one batch size: each point named for the run whose weights it starts
  // from, not for the checkpoints/ directory they all end in
  const auto grid =
      write_tiny_sweep(tmp.path(), "grid", R"("train_iters": 3, "global_batch_size": 2)",
                       R"("grid": {"pretrained_checkpoint": [")" + from2 + R"(", ")" + from4 + R"("]}, "threads": 1)");
  r = run_sweep(grid, runs, " --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("  from-bs2  {"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  from-bs4  {"), std::string::npos) << r.output;
}

// A blend (data_path's weights and prefixes) as an axis: each point named by its items.
TEST_F(Sweep, ABlendAxisNamesEachPointByItsWeightsAndDatasets) {
  mb::testing::TempDir tmp;
  const std::string data = (mb::testing::brown_data() / "brown_gpt2_text_document").string();
  const auto file = write_tiny_sweep(
      tmp.path(), "blend", R"("train_iters": 2, "global_batch_size": 2)",
      R"("grid": {"data_path": [[")" + data + R"("], ["1", ")" + data + R"(", "3", ")" + data + R"("]]})");
  const auto r = run_sweep(file, tmp / "runs", " --dry-run");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("  dpbrown_gpt2_text_document  {"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  dp1+brown_gpt2_text_document+3+brown_gpt2_text_document  {"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("data_path: " + data + " is given twice; give it once, with the sum of its weights"),
            std::string::npos)
      << "train --check reads the blend: " << r.output;
}

// Points that log the noise scale at several batch sizes with the default decay a step are
// told what it does and which window would average them alike; with a window (or a decay
// chosen on purpose) nothing is said.
TEST_F(Sweep, ANoiseScaleAveragedByStepsAtSeveralBatchSizesIsPointedOut) {
  mb::testing::TempDir tmp;
  const std::string base = R"({"name": "ns", "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
    "seq_length": 16, "micro_batch_size": 4, "train_iters": 4, "lr": 0.001, "log_noise_scale": true, "data_path": [")" +
                           (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("])";
  const std::string axes = R"(}, "grid": {"global_batch_size": [8, 32]}})";
  const std::vector<std::pair<std::string, bool>> cases = {
      {"", true}, {R"(, "noise_scale_window": 32)", false}, {R"(, "noise_scale_ema": 0.9)", false}};
  for (const auto& [extra, noted] : cases) {
    mb::testing::write_text(tmp / "ns.json", base + extra + axes);
    const auto r = mb::testing::run_command(sweep("run " + (tmp / "ns.json").string() + " --dry-run --runs-dir " + (tmp / "runs").string()));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const std::string note = "> note: points at global batch 8 to 32 log the noise scale averaged by 0.99 a step (100 steps: 800 "
                             "samples at batch 8, 3200 at 32), so their B_simple at the same loss is not averaged alike; "
                             "\"noise_scale_window\": 32 in base (the largest batch) averages every point over the same samples";
    EXPECT_EQ(r.output.find(note) != std::string::npos, noted) << extra << "\n" << r.output;
  }
}

// A point of more than one rank is checked as it will run, under mpirun -np TP x DP: a TP 2
// point passes (one process said it "needs 2 processes"), a DP 2 point whose global batch is
// no multiple of micro batch x DP is refused with that, once per distinct error.
TEST_F(Sweep, DryRunChecksMultiRankPointsUnderMpirun) {
  mb::testing::TempDir tmp;
  const fs::path f = tmp / "ranks.json";
  mb::testing::write_text(f, R"({"name": "ranks", "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
    "seq_length": 16, "micro_batch_size": 2, "global_batch_size": 6, "train_iters": 4, "lr": 0.001,
    "data_path": [")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("]},
    "grid": {"tensor_model_parallel_size": [1, 2], "data_parallel_size": [1, 2]}})");
  const auto r = mb::testing::run_command(
      mb::testing::mpi_env() + sweep("run " + f.string() + " --dry-run --runs-dir " + (tmp / "runs").string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output.find("needs 2 processes"), std::string::npos) << r.output;
  const std::string said = "cannot run: train: error: global_batch_size (6) must be a multiple of micro_batch_size x "
                           "data-parallel size (2 x 2)\n";
  const size_t first = r.output.find(said);
  ASSERT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(said, first + 1), std::string::npos) << "said once:\n" << r.output;
  EXPECT_NE(r.output.find("cannot run: as "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> 2 point(s) cannot run"), std::string::npos) << r.output;
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
