// A real Slurm cluster on this machine (tests/slurm/start_slurm.sh: munged, slurmctld and
// slurmd from Debian's slurm-wlm): launchers/slurm/submit.sh runs a tiny sweep as a job array
// whose tasks each run 2 MPI ranks through srun --mpi=pmix; and a task sent USR1 (as Slurm
// does before a time limit, --signal=B:USR1@120) checkpoints, requeues itself and resumes
// from its checkpoint to a complete, gap-free metrics file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

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
          "micro_batch_size": 2, "lr": 0.002, "log_interval": 1, "eval_iters": 0, "threads": 1, "save_interval": 5,
          "data_path": [")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("])" +
                                       extra_base + R"(},
 "zip": {"global_batch_size": [4, 8]}, "derive": {"sample_budget": )" + budget + "}}");
    return file;
  }
  // submit.sh's job id ("Submitted batch job N")
  static std::string submit(const fs::path& file, const fs::path& runs) {
    const auto r = mb::testing::run_command(mb::testing::source_dir() + "/launchers/slurm/submit.sh " + file.string() +
                                            " --nodes 1 --ntasks-per-node 2 --runs-dir " + runs.string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const size_t at = r.output.rfind("Submitted batch job ");
    EXPECT_NE(at, std::string::npos) << r.output;
    return at == std::string::npos ? "" : std::to_string(std::atoll(r.output.c_str() + at + 20));
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

TEST_F(Slurm, JobArrayRunsEveryPointWithTwoMpiRanks) {
  mb::testing::TempDir tmp;
  const auto job = submit(write_sweep(tmp.path(), "tiny", "32"), tmp / "runs");
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(wait_until_gone(job, 240)) << "the array did not finish in 4 minutes";
  for (const char* id : {"bs4", "bs8"}) {
    const fs::path dir = tmp / "runs" / "tiny" / id;
    ASSERT_TRUE(fs::exists(dir / "DONE")) << id << ":\n" << read(dir / "stdout.log");
    EXPECT_NE(read(dir / "config.json").find("\"world_size\": 2"), std::string::npos) << id << " ran as 2 ranks";
    mb::testing::H5File f((dir / "metrics.h5").string(), mb::testing::H5File::kRead);
    EXPECT_EQ(f.read<double>("train/lm_loss").size(), std::string(id) == "bs4" ? 8u : 4u) << id;
  }
}

// A diverged point (train's exit status 4) is a result under Slurm too: the task ends
// (not requeued, not failed) and leaves DIVERGED, no DONE; a new submission skips it.
TEST_F(Slurm, ADivergedPointEndsItsTaskWithDivergedNotDone) {
  mb::testing::TempDir tmp;
  const auto job = submit(write_sweep(tmp.path(), "div", "32", R"(, "divergence_loss": 5, "divergence_intervals": 2)"),
                          tmp / "runs");
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(wait_until_gone(job, 240)) << "the array did not finish in 4 minutes";
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
  ASSERT_TRUE(wait_until_gone(again, 120));
  EXPECT_EQ(read(tmp / "runs" / "div" / "bs4" / "stdout.log"), log_before);
  EXPECT_TRUE(fs::exists(tmp / "runs" / "div" / "bs4" / "DIVERGED"));
}

TEST_F(Slurm, Usr1RequeuesThePointWhichResumesFromItsCheckpoint) {
  mb::testing::TempDir tmp;
  const auto job = submit(write_sweep(tmp.path(), "requeue", "800"), tmp / "runs");  // bs4: 200 iterations
  ASSERT_FALSE(job.empty());
  const fs::path dir = tmp / "runs" / "requeue" / "bs4", log = dir / "stdout.log";
  // USR1 to the batch shell of task 0 once it is past iteration 20, as Slurm sends it
  // 120 s before a time limit; then release the requeued task at once (Slurm otherwise holds
  // a requeued job for about two minutes).
  const auto r = mb::testing::run_command(
      "for i in $(seq 600); do grep -q 'iteration  *[2-9][0-9]/' " + log.string() + " 2>/dev/null && break; sleep 0.1; done; "
      "scancel --signal=USR1 --batch " + job + "_0; "
      "for i in $(seq 120); do squeue -h -j " + job + "_0 -o %r | grep -q BeginTime && break; sleep 0.5; done; "
      "scontrol update JobId=" + job + "_0 StartTime=now; echo released");
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
