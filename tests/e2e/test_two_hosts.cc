// Two hosts on one machine: two network namespaces joined by a veth pair act as two hosts,
// launchers/ec2/launch.sh starts train over a hostfile of them (Open MPI's daemons enter each
// namespace through tests/mpi/netns_rsh.sh, as ssh would reach a host), and MPI's traffic
// can only cross the veth link (TCP restricted to its subnet). The DP=2 run across the two
// hosts matches one process with twice the accumulation, and launch.sh --sweep runs each point
// of a sweep over both. Needs root (ip netns).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "core/util/strings.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace fs = std::filesystem;
namespace mb = megabatch;

namespace {

class TwoHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    teardown();
    const auto r = mb::testing::run_command(
        "set -e; ip netns add mbhost1; ip netns add mbhost2; ip link add mbveth1 type veth peer name mbveth2; "
        "ip link set mbveth1 netns mbhost1; ip link set mbveth2 netns mbhost2; "
        "ip -n mbhost1 addr add 10.77.0.1/24 dev mbveth1; ip -n mbhost2 addr add 10.77.0.2/24 dev mbveth2; "
        "for n in 1 2; do ip -n mbhost$n link set mbveth$n up; ip -n mbhost$n link set lo up; done");
    ASSERT_EQ(r.exit_code, 0) << "cannot create network namespaces (needs root and iproute2):\n" << r.output;
  }
  void TearDown() override { teardown(); }
  // (a veth pair that a failed setup left outside the namespaces too)
  static void teardown() {
    mb::testing::run_command(
        "ip netns del mbhost1 2>/dev/null; ip netns del mbhost2 2>/dev/null; ip link del mbveth1 2>/dev/null; true");
  }
};

std::string train_args(const fs::path& run) {
  return "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 "
         "--global-batch-size 8 --train-iters 4 --lr 3e-3 --log-interval 1 --eval-iters 0 --threads 1 "
         "--hidden-dropout 0.1 --attention-dropout 0.1 --data-path " +
         (mb::testing::brown_data() / "brown_gpt2_text_document").string() + " --run-dir " + run.string();
}

std::vector<double> losses(const fs::path& run) {
  mb::testing::H5File f((run / "metrics.h5").string(), mb::testing::H5File::kRead);
  return f.read<double>("train/lm_loss");
}

// Shell: what runs a command on "host" 1 as launch.sh would be run there, with mpirun's and
// each daemon's session directories in dir.
std::string on_host1(const fs::path& dir) {
  return "mkdir -p " + (dir / "mpirun").string() +
         " && ip netns exec mbhost1 env OMPI_ALLOW_RUN_AS_ROOT=1 "
         "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MEGABATCH_BIN=" +
         mb::testing::bin_dir() + " TMPDIR=" + (dir / "mpirun").string() + " MB_NETNS_TMPDIR=" + dir.string() +
         " timeout 300 ";
}

// launchers/ec2/launch.sh over the two hosts' hostfile (dir/hosts), one rank each: mpirun
// itself runs on "host" 1, and every daemon is started through the namespace agent.
std::string launch_sh(const fs::path& dir) {
  const std::string src = mb::testing::source_dir();
  return src + "/launchers/ec2/launch.sh --instance-type g4dn.12xlarge --hostfile " + (dir / "hosts").string() +
         " --ranks-per-node 1 --mpirun-arg --mca --mpirun-arg plm_rsh_agent --mpirun-arg " + src +
         "/tests/mpi/netns_rsh.sh --mpirun-arg --mca --mpirun-arg oob_tcp_if_include --mpirun-arg 10.77.0.0/24"
         " --mpirun-arg --mca --mpirun-arg btl_tcp_if_include --mpirun-arg 10.77.0.0/24"
         // the two daemons share one machine: without this, both map hwloc's shared topology at
         // the same address and one crashes now and then (a real second host has its own memory)
         " --mpirun-arg --mca --mpirun-arg rtc_hwloc_vmhole --mpirun-arg none ";
}

}  // namespace

TEST_F(TwoHosts, DataParallelAcrossTwoHostsMatchesOneProcess) {
  mb::testing::TempDir tmp;
  mb::testing::write_text(tmp / "hosts", "mbhost1 slots=1\nmbhost2 slots=1\n");
  const auto r =
      mb::testing::run_command(on_host1(tmp.path()) + launch_sh(tmp.path()) + "-- " + train_args(tmp / "two"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2 ranks: TP 1 x DP 2"), std::string::npos) << r.output;
  const auto one = mb::testing::run_command(mb::testing::bin_dir() + "/train " + train_args(tmp / "one"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto a = losses(tmp / "two"), b = losses(tmp / "one");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(a[i], b[i], 2e-5 * b[i]) << "iteration " << i + 1;
}

// launch.sh --sweep: each point runs over both hosts (sweep run --ranks 2 under the launcher's
// mpirun). A result lost afterwards: sweep status, from another directory, names the command
// that runs it again, the launcher's as typed in its directory with --rerun damaged, and that
// command runs it alone. Before, status said "sweep run --rerun damaged", which would have run
// the points without the hosts.
TEST_F(TwoHosts, ASweepRunsEachPointOverBothHostsAndStatusNamesItsCommandForALostResult) {
  mb::testing::TempDir tmp;
  mb::testing::write_text(tmp / "hosts", "mbhost1 slots=1\nmbhost2 slots=1\n");
  mb::testing::write_text(tmp / "two.json", R"({"name": "two",
 "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "seq_length": 16, "micro_batch_size": 2,
          "lr": 0.002, "log_interval": 1, "eval_iters": 0, "threads": 1,
          "data_path": [")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() +
                                                R"("]},
 "zip": {"global_batch_size": [4, 8]}, "derive": {"sample_budget": 16}})");
  const std::string command = launch_sh(tmp.path()) + "--sweep two.json -- --runs-dir runs";
  auto r = mb::testing::run_command("cd " + tmp.path().string() + " && " + on_host1(tmp.path()) + command);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path root = tmp / "runs" / "two";
  for (const char* id : {"bs4", "bs8"}) {
    ASSERT_TRUE(fs::exists(root / id / "DONE")) << id << ":\n" << r.output;
    EXPECT_NE(mb::testing::read_text(root / id / "stdout.log").find("2 ranks: TP 1 x DP 2"), std::string::npos) << id;
  }
  const std::string bs4_log = mb::testing::read_text(root / "bs4" / "stdout.log");
  const std::string bytes = mb::testing::read_text(root / "bs8" / "metrics.h5");
  mb::testing::write_text(root / "bs8" / "metrics.h5", bytes.substr(0, bytes.size() / 2));
  r = mb::testing::run_command("cd / && " + mb::testing::bin_dir() + "/sweep status " + root.string());
  const std::string again = "cd " + mb::shell_quote(tmp.path().string()) + " && " + command + " --rerun damaged";
  ASSERT_NE(r.output.find("1 result(s) lost (metrics.h5 unreadable; " + again + ")"), std::string::npos) << r.output;
  // the command it names, on "host" 1
  r = mb::testing::run_command(on_host1(tmp.path()) + "bash -c " + mb::shell_quote(again));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> start bs8"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("> start bs4"), std::string::npos) << r.output;
  EXPECT_EQ(mb::testing::read_text(root / "bs4" / "stdout.log"), bs4_log) << "bs4's result stood: not run again";
  mb::testing::H5File f((root / "bs8" / "metrics.h5").string(), mb::testing::H5File::kRead);
  EXPECT_EQ(f.read<double>("train/lm_loss").size(), 2u);
  r = mb::testing::run_command("cd / && " + mb::testing::bin_dir() + "/sweep status " + root.string());
  EXPECT_NE(r.output.find("sweep: 2 done, 0 diverged, 0 running, 0 failed, 0 waiting |"), std::string::npos)
      << r.output;
  // the rerun's own --rerun is not part of the command recorded (it would name it twice)
  mb::testing::write_text(root / "bs4" / "metrics.h5", "");
  r = mb::testing::run_command("cd / && " + mb::testing::bin_dir() + "/sweep status " + root.string());
  EXPECT_NE(r.output.find("1 result(s) lost (metrics.h5 unreadable; " + again + ")"), std::string::npos) << r.output;
}
