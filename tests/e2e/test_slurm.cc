// A real Slurm cluster on this machine (tests/slurm/start_slurm.sh: munged, slurmctld and
// slurmd from Debian's slurm-wlm): launchers/slurm/submit.sh runs a tiny sweep as a job array
// whose tasks each run 2 MPI ranks through srun --mpi=pmix, each point checkpointed and
// marked done as sweep run does it; a task sent USR1 (as Slurm does before a time limit,
// --signal=B:USR1@120) checkpoints, requeues itself and resumes from its checkpoint to a
// complete, gap-free metrics file; and a point killed outright, as when its node is lost,
// resumes from its last periodic checkpoint when submitted again; a point that srun cannot
// start is failed with srun's error; a result lost afterwards runs again on request.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/util/strings.h"
#include "sweeps/slurm_queue.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace fs = std::filesystem;
namespace mb = megabatch;

namespace {

class Slurm : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    const auto r = mb::testing::run_command(mb::testing::source_dir() + "/tests/slurm/start_slurm.sh");
    ASSERT_EQ(r.exit_code, 0) << "could not start the local Slurm cluster:\n" << r.output;
  }
  static fs::path write_sweep(const fs::path& dir, const std::string& name, const std::string& budget,
                              const std::string& extra_base = "") {
    const fs::path file = dir / (name + ".json");
    mb::testing::write_text(file, R"({"name": ")" + name + R"(",
 "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "seq_length": 16,
          "micro_batch_size": 2, "lr": 0.002, "log_interval": 1, "eval_iters": 0, "threads": 1,
          "data_path": [")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("])" +
                                       extra_base + R"(},
 "zip": {"global_batch_size": [4, 8]}, "derive": {"sample_budget": )" + budget + "}}");
    return file;
  }
  // Shell: submit.sh with this build's programs (its default is the checkout's build/bin,
  // another build than this test's where the tests run from another build directory)
  static std::string submit_sh() {
    return "MEGABATCH_BIN=" + mb::testing::bin_dir() + " " + mb::testing::source_dir() + "/launchers/slurm/submit.sh ";
  }
  // submit.sh's job id ("Submitted batch job N"); `extra`: more of its options
  static std::string submit(const fs::path& file, const fs::path& runs, const std::string& extra = "") {
    const auto r =
        mb::testing::run_command(submit_sh() + mb::shell_quote(file.string()) +
                                 " --nodes 1 --ntasks-per-node 2 --runs-dir " + mb::shell_quote(runs.string()) + extra);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const size_t at = r.output.rfind("Submitted batch job ");
    EXPECT_NE(at, std::string::npos) << r.output;
    return at == std::string::npos ? "" : std::to_string(std::atoll(r.output.c_str() + at + 20));
  }
  // Shell: SIGSTOP to the ranks of one point, matched by train's own command line (srun's,
  // which names point.json too, starts with srun): however fast the machine, they go no
  // further until continued.
  static std::string pause_ranks(const fs::path& point_dir) {
    return "pkill -STOP -f " + ranks_pattern(point_dir) + " && echo paused " + point_dir.filename().string() + "; ";
  }
  // Shell: waits until every paused rank of the point has a SIGTERM pending (sent by Slurm or
  // by point.sbatch's trap) or has been continued by Slurm, then continues them: they handle
  // it at the end of the iteration they were in.
  static std::string continue_after_term(const fs::path& point_dir) {
    const std::string p = ranks_pattern(point_dir);
    return "for i in $(seq 15000); do w=0; for r in $(pgrep -f " + p + "); do "
           "s=$(awk '$1 == \"State:\" {print $2}' /proc/$r/status 2>/dev/null); "
           "m=$(awk '$1 == \"ShdPnd:\" {print $2}' /proc/$r/status 2>/dev/null); "
           "[ \"$s\" = T ] && [ $(( 0x${m:-0} & 0x4000 )) = 0 ] && w=1; done; [ $w = 0 ] && break; sleep 0.02; done; "
           "pkill -CONT -f " + p + "; ";
  }
  static std::string ranks_pattern(const fs::path& point_dir) {
    return "'^" + mb::testing::bin_dir() + "/train .*" + (point_dir / "point.json").string() + "'";
  }
  static bool wait_until_gone(const std::string& job, int seconds) {
    for (int i = 0; i < seconds * 2; ++i) {
      if (mb::testing::run_command("squeue -h -j " + job).output.empty()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    mb::testing::run_command("scancel " + job);
    return false;
  }
};

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

// A runs directory whose path holds a comma, a space, a quote and a $: everything the tasks
// receive survives, as submit.sh writes it to a file that point.sbatch sources (sbatch
// --export=VAR=value,... split it at the comma, and every task failed while submit.sh exited
// 0), and the points finish; sweep status finds the array's tasks by that directory.
TEST_F(Slurm, ARunsDirectoryWithACommaAQuoteASpaceAndADollarWorks) {
  mb::testing::TempDir tmp;
  const fs::path runs = tmp / "runs, it's $HOME";
  const auto job = submit(write_sweep(tmp.path(), "odd", "32"), runs);
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(wait_until_gone(job, 600)) << "the array did not finish in 10 minutes";
  for (const char* id : {"bs4", "bs8"}) {
    const fs::path dir = runs / "odd" / id;
    ASSERT_TRUE(fs::exists(dir / "DONE")) << id << ":\n" << read(dir / "stdout.log");
    mb::testing::H5File f((dir / "metrics.h5").string(), mb::testing::H5File::kRead);
    EXPECT_EQ(f.read<double>("train/iteration").size(), std::string(id) == "bs4" ? 8u : 4u) << id;
  }
  const auto status = mb::testing::run_command(mb::testing::bin_dir() + "/sweep status " +
                                               mb::shell_quote((runs / "odd").string()));
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_NE(status.output.find("2 done"), std::string::npos) << status.output;
}

// An exported sweep as a job array: each point runs as 2 MPI ranks, checkpointed and marked
// done as sweep run does it; a result lost afterwards runs again on request, alone.
TEST_F(Slurm, JobArrayRunsEveryPointWithTwoMpiRanks) {
  mb::testing::TempDir tmp;
  const auto job = submit(write_sweep(tmp.path(), "tiny", "32"), tmp / "runs");
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(wait_until_gone(job, 600)) << "the array did not finish in 10 minutes";
  for (const char* id : {"bs4", "bs8"}) {
    const fs::path dir = tmp / "runs" / "tiny" / id;
    ASSERT_TRUE(fs::exists(dir / "DONE")) << id << ":\n" << read(dir / "stdout.log");
    EXPECT_NE(read(dir / "config.json").find("\"world_size\": 2"), std::string::npos) << id << " ran as 2 ranks";
    mb::testing::H5File f((dir / "metrics.h5").string(), mb::testing::H5File::kRead);
    const size_t iters = std::string(id) == "bs4" ? 8 : 4;
    EXPECT_EQ(f.read<double>("train/lm_loss").size(), iters) << id;
    // as under sweep run: a checkpoint every tenth of the iterations (here every one, the
    // newest two kept), and once done only the final one, as the sweep's "checkpoints" says
    EXPECT_NE(read(dir / "stdout.log").find("saved checkpoint at iteration        1 "), std::string::npos) << id;
    std::vector<std::string> kept;
    for (const auto& e : fs::directory_iterator(dir / "checkpoints"))
      if (e.path().extension() == ".h5") kept.push_back(e.path().filename().string());
    std::sort(kept.begin(), kept.end());
    EXPECT_EQ(kept, std::vector<std::string>{"iter_000000" + std::to_string(iters) + ".h5"}) << id;
    EXPECT_NE(read(dir / "DONE").find("\"iteration\":" + std::to_string(iters)), std::string::npos) << read(dir / "DONE");
  }
  // sweep status reads the exported sweep as one that sweep run ran
  const std::string status = mb::testing::bin_dir() + "/sweep status " + (tmp / "runs" / "tiny").string();
  auto r = mb::testing::run_command(status);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("sweep: 2 done, 0 diverged, 0 running, 0 failed, 0 waiting"), std::string::npos) << r.output;

  // bs8's result lost afterwards (its metrics.h5 cut short): status says so and how to run it
  // again; submitted with --rerun damaged, only bs8 runs again, afresh, to a readable result
  // (before: its task said "done already" and left it lost)
  const fs::path bs4 = tmp / "runs" / "tiny" / "bs4", bs8 = tmp / "runs" / "tiny" / "bs8";
  const std::string bytes = read(bs8 / "metrics.h5"), bs4_log = read(bs4 / "stdout.log");
  mb::testing::write_text(bs8 / "metrics.h5", bytes.substr(0, bytes.size() / 2));
  r = mb::testing::run_command(status);
  EXPECT_NE(r.output.find("1 result(s) lost (metrics.h5 unreadable; export or submit the sweep again with --rerun "
                          "damaged)"),
            std::string::npos)
      << r.output;
  const auto again = submit(write_sweep(tmp.path(), "tiny", "32"), tmp / "runs", " --rerun damaged");
  ASSERT_TRUE(wait_until_gone(again, 600)) << "the array did not finish in 10 minutes";
  ASSERT_TRUE(fs::exists(bs8 / "DONE")) << read(bs8 / "stdout.log");
  EXPECT_EQ(read(bs8 / "stdout.log").find("> loaded"), std::string::npos) << "afresh: " << read(bs8 / "stdout.log");
  mb::testing::H5File f((bs8 / "metrics.h5").string(), mb::testing::H5File::kRead);
  EXPECT_EQ(f.read<double>("train/lm_loss").size(), 4u);
  EXPECT_EQ(read(bs4 / "stdout.log"), bs4_log) << "bs4's result stood: not run again";
  r = mb::testing::run_command(status);
  EXPECT_NE(r.output.find("sweep: 2 done, 0 diverged, 0 running, 0 failed, 0 waiting | "), std::string::npos)
      << r.output;
}

// A point killed outright (SIGKILL to its ranks, as when its node is lost: no signal to
// checkpoint on) has lost no more than its checkpoint interval, a tenth of its iterations:
// submitted again, it resumes from its last periodic checkpoint and finishes with every
// iteration once. Before, a Slurm point wrote no checkpoint until it ended and started over.
// sweep status shows it running, with its Slurm job, while it runs and "failed", with the
// reason, once its task has ended so (before: "no sweep here").
TEST_F(Slurm, APointKilledOutrightIsFailedAndResumesFromItsLastPeriodicCheckpoint) {
  mb::testing::TempDir tmp;
  const fs::path file = write_sweep(tmp.path(), "kill", "800");  // bs4: 200 iterations, a checkpoint every 20
  const auto job = submit(file, tmp / "runs");
  ASSERT_FALSE(job.empty());
  const fs::path dir = tmp / "runs" / "kill" / "bs4", log = dir / "stdout.log";
  // past iteration 50 of 200, its ranks paused (they go no further, however fast the
  // machine), sweep status while it runs, then SIGKILL to the ranks
  const std::string status = mb::testing::bin_dir() + "/sweep status " + (tmp / "runs" / "kill").string();
  auto r = mb::testing::run_command(mb::testing::wait_for_line(log.string(), "iteration  *[5-9][0-9]/") +
                                    pause_ranks(dir) + status + "; pkill -KILL -f " + ranks_pattern(dir) +
                                    " && echo killed");
  ASSERT_NE(r.output.find("killed"), std::string::npos) << r.output << read(log);
  EXPECT_NE(r.output.find("bs4    running     slurm job " + job + "_0  iter "), std::string::npos)
      << "running under Slurm, as its queue says:\n" << r.output;
  ASSERT_TRUE(wait_until_gone(job, 600)) << read(log);
  ASSERT_FALSE(fs::exists(dir / "DONE")) << read(log);
  // the task recorded the failure (sweep finish --exit-status): status shows it with its reason
  r = mb::testing::run_command(status);
  EXPECT_NE(r.output.find("1 failed"), std::string::npos) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("bs4 +failed +.*(Killed|signal 9)"))) << r.output;

  const auto again = submit(file, tmp / "runs");
  ASSERT_TRUE(wait_until_gone(again, 600)) << read(log);
  const std::string text = read(log);
  ASSERT_TRUE(fs::exists(dir / "DONE")) << text;
  EXPECT_FALSE(fs::exists(dir / "FAILED")) << "the attempt that finished it replaced the failed one's record";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex("> loaded \\S+/iter_0*(\\d+)\\.h5"))) << text;
  EXPECT_GE(std::stoi(m[1]), 40) << "killed after iteration 50, it lost at most the 20 of its checkpoint interval";
  mb::testing::H5File f((dir / "metrics.h5").string(), mb::testing::H5File::kRead);
  const auto it = f.read<double>("train/iteration");
  ASSERT_EQ(it.size(), 200u) << "every iteration once, none twice";
  for (size_t i = 0; i < it.size(); ++i) ASSERT_EQ(it[i], static_cast<double>(i + 1));
  // the wall time of both attempts, as point.sbatch measured them, for status and report
  const auto done = nlohmann::json::parse(read(dir / "DONE"));
  EXPECT_GE(done.value("wall_s", 0.0), 2.0) << done;
}

// A diverged point (train's exit status 4) is a result under Slurm too: the task ends
// (not requeued, not failed) and leaves DIVERGED, no DONE; a new submission skips it.
TEST_F(Slurm, ADivergedPointEndsItsTaskWithDivergedNotDone) {
  mb::testing::TempDir tmp;
  const auto job = submit(write_sweep(tmp.path(), "div", "32", R"(, "divergence_loss": 5, "divergence_intervals": 2)"),
                          tmp / "runs");
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(wait_until_gone(job, 600)) << "the array did not finish in 10 minutes";
  for (const char* id : {"bs4", "bs8"}) {
    const fs::path dir = tmp / "runs" / "div" / id;
    EXPECT_TRUE(fs::exists(dir / "DIVERGED")) << id << ":\n" << read(dir / "stdout.log");
    EXPECT_FALSE(fs::exists(dir / "DONE")) << id;
    EXPECT_NE(read(dir / "DIVERGED").find("\"iteration\":2"), std::string::npos) << read(dir / "DIVERGED");
  }
  // submitted again, the tasks see DIVERGED and do not run the points again
  const std::string log_before = read(tmp / "runs" / "div" / "bs4" / "stdout.log");
  const auto again = submit(write_sweep(tmp.path(), "div", "32", R"(, "divergence_loss": 5, "divergence_intervals": 2)"),
                            tmp / "runs");
  ASSERT_TRUE(wait_until_gone(again, 600));
  EXPECT_EQ(read(tmp / "runs" / "div" / "bs4" / "stdout.log"), log_before);
  EXPECT_TRUE(fs::exists(tmp / "runs" / "div" / "bs4" / "DIVERGED"));
}

// A task whose srun cannot start the point at all (here --container on a cluster without
// pyxis, as with an image that does not start): srun's error is the point's failure, in
// FAILED and sweep status, quotes and backslashes intact. Before, sweep finish could not run
// either, nothing was recorded, and sweep status said "waiting" while nothing ran the point.
// Submitted again without the container, it runs to done.
TEST_F(Slurm, AnSrunThatCannotStartThePointFailsItWithSrunsError) {
  mb::testing::TempDir tmp;
  const fs::path file = write_sweep(tmp.path(), "nostart", "16"), dir = tmp / "runs" / "nostart";
  const auto job = submit(file, tmp / "runs", " --container " + mb::shell_quote(R"(img"\1)"));
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(wait_until_gone(job, 600)) << "the array did not finish in 10 minutes";
  const std::string error = R"(srun: unrecognized option '--container-image=img"\1')";
  for (const char* id : {"bs4", "bs8"}) {
    ASSERT_TRUE(fs::exists(dir / id / "FAILED")) << id << ":\n" << read(dir / id / "stdout.log");
    const auto failed = nlohmann::json::parse(read(dir / id / "FAILED"));
    EXPECT_EQ(failed.value("reason", "").rfind(error + " (train's srun: exit ", 0), 0u) << failed;
  }
  const std::string status = mb::testing::bin_dir() + "/sweep status " + dir.string();
  auto r = mb::testing::run_command(status);
  EXPECT_NE(r.output.find("sweep: 0 done, 0 diverged, 0 running, 2 failed, 0 waiting"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bs4    failed      " + error), std::string::npos) << r.output;

  ASSERT_TRUE(wait_until_gone(submit(file, tmp / "runs"), 600));
  r = mb::testing::run_command(status);
  EXPECT_NE(r.output.find("sweep: 2 done, 0 diverged, 0 running, 0 failed, 0 waiting"), std::string::npos) << r.output;
}

// A task that point.sbatch leaves before train starts (here bs8's directory removed while
// its task waits behind bs4, --max-running 1: "no point 1 in ..."): sweep status calls the
// point stopped, with the task's own line and output file. Before, it said "waiting" while no
// task was left to run it. Exported again, the point waits for its next task (the old
// task's line no longer applies); submitted again, it runs.
TEST_F(Slurm, APointItsTaskCouldNotStartIsStoppedWithTheTasksLine) {
  mb::testing::TempDir tmp;
  const fs::path file = write_sweep(tmp.path(), "gone", "800"), root = tmp / "runs" / "gone";  // bs4: 200 iterations
  const auto job = submit(file, tmp / "runs", " --max-running 1");
  ASSERT_FALSE(job.empty());
  // bs8's task cannot start while bs4's runs, and bs4 cannot end while its ranks are paused
  const auto r = mb::testing::run_command(
      mb::testing::wait_for_line((root / "bs4" / "stdout.log").string(), "iteration  *[1-9][0-9]*/") +
      pause_ranks(root / "bs4") + "rm -r " + (root / "bs8").string() + " && echo removed; pkill -CONT -f " +
      ranks_pattern(root / "bs4"));
  ASSERT_NE(r.output.find("paused bs4"), std::string::npos) << r.output;
  ASSERT_NE(r.output.find("removed"), std::string::npos) << r.output;
  ASSERT_TRUE(wait_until_gone(job, 600)) << "the array did not finish in 10 minutes";
  ASSERT_TRUE(fs::exists(root / "bs4" / "DONE")) << read(root / "bs4" / "stdout.log");
  const std::string status = mb::testing::bin_dir() + "/sweep status " + root.string();
  auto s = mb::testing::run_command(status);
  EXPECT_NE(s.output.find("sweep: 1 done, 0 diverged, 0 running, 0 failed, 0 waiting, 1 stopped (submit the sweep "
                          "again to resume)"),
            std::string::npos)
      << s.output;
  EXPECT_NE(s.output.find("  bs8    stopped     its task ended before training (megabatch-" + job +
                          "_1.out): no point 1 in " + root.string() + "\n"),
            std::string::npos)
      << s.output;

  const auto exported = mb::testing::run_command(mb::testing::bin_dir() + "/sweep export-points " + file.string() +
                                                 " --runs-dir " + (tmp / "runs").string() + " --ranks 2");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  s = mb::testing::run_command(status);
  EXPECT_NE(s.output.find("sweep: 1 done, 0 diverged, 0 running, 0 failed, 1 waiting |"), std::string::npos)
      << s.output;
  ASSERT_TRUE(wait_until_gone(submit(file, tmp / "runs"), 600));
  ASSERT_TRUE(fs::exists(root / "bs8" / "DONE")) << read(root / "bs8" / "stdout.log");
  s = mb::testing::run_command(status);
  EXPECT_NE(s.output.find("sweep: 2 done, 0 diverged, 0 running, 0 failed, 0 waiting |"), std::string::npos)
      << s.output;
}

TEST_F(Slurm, Usr1RequeuesThePointWhichResumesFromItsCheckpoint) {
  mb::testing::TempDir tmp;
  const auto job = submit(write_sweep(tmp.path(), "requeue", "800"), tmp / "runs");  // bs4: 200 iterations
  ASSERT_FALSE(job.empty());
  const fs::path dir = tmp / "runs" / "requeue" / "bs4", log = dir / "stdout.log";
  // USR1 to the batch shell of task 0 once it is past iteration 20, as Slurm sends it
  // 120 s before a time limit, its ranks paused meanwhile (however fast the machine, the
  // point cannot end before the SIGTERM the batch shell sends them); then release the
  // requeued task at once (Slurm otherwise holds a requeued job for about two minutes).
  const auto r = mb::testing::run_command(
      mb::testing::wait_for_line(log.string(), "iteration  *[2-9][0-9]/") + pause_ranks(dir) +
      "scancel --signal=USR1 --batch " + job + "_0; " + continue_after_term(dir) +
      "for i in $(seq 600); do squeue -h -j " + job + "_0 -o %r | grep -q BeginTime && break; sleep 0.5; done; "
      "scontrol update JobId=" + job + "_0 StartTime=now; echo released");
  EXPECT_NE(r.output.find("paused bs4"), std::string::npos) << r.output;
  ASSERT_NE(r.output.find("released"), std::string::npos) << r.output;
  ASSERT_TRUE(wait_until_gone(job, 300)) << read(log);
  const std::string text = read(log);
  ASSERT_TRUE(fs::exists(dir / "DONE")) << text;
  EXPECT_NE(text.find("stopped by signal 15 after iteration"), std::string::npos) << text;
  EXPECT_NE(text.find("> loaded " + (dir / "checkpoints" / "iter_").string()), std::string::npos) << text;
  mb::testing::H5File f((dir / "metrics.h5").string(), mb::testing::H5File::kRead);
  const auto it = f.read<double>("train/iteration");
  ASSERT_EQ(it.size(), 200u) << "every iteration once, none twice";
  for (size_t i = 0; i < it.size(); ++i) ASSERT_EQ(it[i], static_cast<double>(i + 1));
}

// scancel of a running sweep (the user's way to stop it): every running point finishes its
// iteration, checkpoints and ends, and none comes back; submitted again, each resumes from
// its checkpoint; sweep status calls them stopped. Submitted again while it still runs, the
// sweep is refused. Before, point.sbatch requeued a point stopped by scancel's SIGTERM as it
// does one stopped before its time limit (USR1), and the cancelled sweep ran on.
TEST_F(Slurm, ScancelStopsEveryPointAtACheckpointAndNoneComesBack) {
  mb::testing::TempDir tmp;
  const fs::path file = write_sweep(tmp.path(), "cancel", "800");  // bs4: 200 iterations, bs8: 100
  const auto job = submit(file, tmp / "runs");
  ASSERT_FALSE(job.empty());
  const fs::path root = tmp / "runs" / "cancel";
  // submitted again while it runs: refused, naming the job (it would run the points twice)
  const auto twice = mb::testing::run_command(submit_sh() + file.string() +
                                              " --nodes 1 --ntasks-per-node 2 --runs-dir " + (tmp / "runs").string());
  EXPECT_EQ(twice.exit_code, 2) << twice.output;
  EXPECT_NE(twice.output.find("is already queued or running as job " + job + "; "), std::string::npos) << twice.output;
  // each point paused once past iteration 10 (neither can end before the cancel, however
  // fast the machine), then scancel, and the points go on to the SIGTERM it sends
  std::string pause_both, continue_both;
  for (const char* id : {"bs4", "bs8"}) {
    pause_both += mb::testing::wait_for_line((root / id / "stdout.log").string(), "iteration  *[1-9][0-9]/") +
                  pause_ranks(root / id);
    continue_both += continue_after_term(root / id);
  }
  const auto r = mb::testing::run_command(pause_both + "scancel " + job + " && echo cancelled; " + continue_both);
  ASSERT_NE(r.output.find("cancelled"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("paused bs4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("paused bs8"), std::string::npos) << r.output;
  EXPECT_TRUE(wait_until_gone(job, 600)) << "a cancelled task came back:\n" << mb::testing::run_command("squeue").output;
  for (const char* id : {"bs4", "bs8"}) {
    const std::string text = read(root / id / "stdout.log");
    EXPECT_NE(text.find("stopped by signal 15 after iteration"), std::string::npos) << id << ":\n" << text;
    EXPECT_FALSE(fs::exists(root / id / "DONE")) << id;
  }
  // sweep status: started, in no queued task, so stopped until the sweep is submitted again
  const auto status = mb::testing::run_command(mb::testing::bin_dir() + "/sweep status " + root.string());
  EXPECT_NE(status.output.find("2 stopped (submit the sweep again to resume)"), std::string::npos) << status.output;
  const auto again = submit(file, tmp / "runs");
  ASSERT_TRUE(wait_until_gone(again, 600)) << read(root / "bs4" / "stdout.log");
  for (const char* id : {"bs4", "bs8"}) {
    const fs::path dir = root / id;
    const std::string text = read(dir / "stdout.log");
    ASSERT_TRUE(fs::exists(dir / "DONE")) << id << ":\n" << text;
    EXPECT_NE(text.find("> loaded " + (dir / "checkpoints" / "iter_").string()), std::string::npos) << text;
    mb::testing::H5File f((dir / "metrics.h5").string(), mb::testing::H5File::kRead);
    const auto it = f.read<double>("train/iteration");
    ASSERT_EQ(it.size(), std::string(id) == "bs4" ? 200u : 100u) << id << ": every iteration once, none twice";
    for (size_t i = 0; i < it.size(); ++i) ASSERT_EQ(it[i], static_cast<double>(i + 1)) << id;
  }
}

// The README's first command on a new cluster, here on a real one: submit.sh --selftest runs
// launchers/selftest.sh as one job whose layout run is TP 2 x DP 2 under srun --mpi=pmix
// (--device cpu: this cluster has no GPU), and its output file holds the table and the verdict.
TEST_F(Slurm, SelftestRunsTheLayoutUnderSrunAndPasses) {
  mb::testing::TempDir tmp;
  const auto r = mb::testing::run_command(
      submit_sh() + "--selftest --nodes 1 --ntasks-per-node 4 --device cpu --runs-dir " + tmp.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t at = r.output.rfind("Submitted batch job ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string job = std::to_string(std::atoll(r.output.c_str() + at + 20));
  ASSERT_TRUE(wait_until_gone(job, 600));
  const std::string out = read(tmp / ("selftest-" + job + ".out"));
  EXPECT_NE(out.find("selftest: 4 ranks: TP 2 x DP 2 (MPI) against one process"), std::string::npos) << out;
  EXPECT_NE(out.find("selftest: passed"), std::string::npos) << out;
}

// squeue's lines for sweep status: the array tasks whose working directory is the sweep's
// (not another sweep's, not a job that is no array), a pending range expanded, its "%N"
// (most running at once) dropped; RUNNING and COMPLETING run, anything else waits.
TEST(SlurmQueue, ATaskOfTheSweepsArrayIsRunningOrQueuedByItsIndex) {
  mb::testing::TempDir tmp;
  const fs::path dir = tmp / "runs" / "s";
  fs::create_directories(dir);
  const std::string d = dir.string();
  const auto q = megabatch::sweeps::parse_queue("41_0|" + d + "|RUNNING\n41_1|" + d + "/|COMPLETING\n"
                                                 "41_[2-4,7%2]|" + d + "|PENDING\n42_5|" + d + "-other|RUNNING\n"
                                                 "43|" + d + "|RUNNING\n41_6|" + (tmp / "runs" / "." / "s").string() +
                                                 "|REQUEUED\nnot a line\n", dir);
  std::string got;
  for (const auto& [i, t] : q) got += std::to_string(i) + ":" + mb::sweeps::status_name(t.state) + ":" + t.job + " ";
  EXPECT_EQ(got, "0:running:41_0 1:running:41_1 2:queued:41_2 3:queued:41_3 4:queued:41_4 6:queued:41_6 "
                 "7:queued:41_7 ");
}
