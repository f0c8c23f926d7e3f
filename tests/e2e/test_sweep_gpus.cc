// sweep run --gpus: placing points on a node's GPUs. Without GPUs here, the placement is
// tested through the runner itself (run_sweep with the GPUs given, points on the CPU): every
// point gets as many GPUs as it has ranks, a point of TP 2 is started by mpirun -np 2 (a
// real two-rank job), no GPU is held by two running points at once, and a point that needs
// more GPUs than given is refused before anything runs or is discarded. (On a GPU:
// test_gpu.cc.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "core/util/error.h"
#include "sweeps/placement.h"
#include "sweeps/run_dir.h"
#include "sweeps/runner.h"
#include "sweeps/sweep.h"
#include "tests/unit/test_util.h"

namespace fs = std::filesystem;
namespace mb = megabatch;
namespace sw = megabatch::sweeps;

TEST(GpuPlacement, TakesTheLowestFreeGpusAndWaitsWhenTooFewAreFree) {
  sw::GpuPlacer p({0, 1, 2, 5});
  EXPECT_EQ(p.take(2), (std::vector<int>{0, 1}));
  EXPECT_EQ(p.take(3), std::vector<int>{}) << "two are free";
  EXPECT_EQ(p.take(1), (std::vector<int>{2}));
  p.give_back({0, 1});
  EXPECT_EQ(p.free(), 3u);
  EXPECT_EQ(p.take(3), (std::vector<int>{0, 1, 5}));
  EXPECT_EQ(p.take(1), std::vector<int>{});
}

TEST(GpuPlacement, GpusFlagAndRanksOfAPoint) {
  EXPECT_EQ(sw::parse_gpus("all", 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(sw::parse_gpus("2,0", 4), (std::vector<int>{2, 0}));
  auto error = [](const std::string& spec, int visible) {
    try {
      sw::parse_gpus(spec, visible);
    } catch (const mb::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error("all", 0).find("no GPU is visible"), std::string::npos) << error("all", 0);
  EXPECT_NE(error("0,0", 2).find("GPU 0 is listed twice"), std::string::npos);
  EXPECT_NE(error("3", 2).find("GPU 3 is not visible (2 GPUs visible: 0 to 1)"), std::string::npos) << error("3", 2);
  EXPECT_NE(error("1,x", 2).find("'x' is not a GPU index"), std::string::npos);
  EXPECT_EQ(sw::ranks_needed({{"tensor_model_parallel_size", 2}, {"data_parallel_size", 3}}), 6);
  EXPECT_EQ(sw::ranks_needed({{"lr", 1e-3}}), 1);
}

// Whether a point runs as a job of N ranks (a Slurm array task of nodes x tasks), DP = N / TP
// as train derives it; each refusal says which of train's rules it breaks, with the numbers.
TEST(GpuPlacement, APointFitsAJobOfNRanksOrSaysWhyNot) {
  using nlohmann::json;
  EXPECT_EQ(sw::layout_problem({{"global_batch_size", 1024}, {"micro_batch_size", 64}}, 16), "");
  EXPECT_EQ(sw::layout_problem({{"global_batch_size", 512}, {"micro_batch_size", 32}}, 16), "");
  EXPECT_EQ(sw::layout_problem({{"global_batch_size", 512}, {"micro_batch_size", 64}}, 16),
            "global_batch_size 512 is not a multiple of micro_batch_size x DP (64 x 16)");
  // train's default micro batch (8) where the point gives none; a global batch left out is micro x DP
  EXPECT_EQ(sw::layout_problem({{"global_batch_size", 64}}, 16),
            "global_batch_size 64 is not a multiple of micro_batch_size x DP (8 x 16)");
  EXPECT_EQ(sw::layout_problem(json::object(), 16), "");
  EXPECT_EQ(sw::layout_problem({{"tensor_model_parallel_size", 8}}, 4),
            "tensor_model_parallel_size 8 does not divide the job's 4 ranks");
  EXPECT_EQ(sw::layout_problem({{"tensor_model_parallel_size", 2}, {"global_batch_size", 64}}, 8), "");  // DP 4: 8 x 4 = 32
  // each batch of a ramp is whole micro-batches on every rank too
  EXPECT_EQ(
      sw::layout_problem({{"global_batch_size", 64}, {"micro_batch_size", 2}, {"rampup_batch_size", {8, 8, 100}}}, 4),
      "");
  EXPECT_EQ(
      sw::layout_problem({{"global_batch_size", 64}, {"micro_batch_size", 2}, {"rampup_batch_size", {8, 4, 100}}}, 4),
      "rampup_batch_size [8,4,100]: its start and increment are not multiples of micro_batch_size x DP (2 x 4)");
  EXPECT_EQ(sw::layout_problem({{"tensor_model_parallel_size", 2}, {"data_parallel_size", 2}}, 8),
            "data_parallel_size 2, but 8 ranks at TP 2 are DP 4");
}

namespace {

fs::path write_sweep(const fs::path& dir, const std::string& grid_tp) {
  const fs::path file = dir / "gpus.json";
  mb::testing::write_text(file, R"({
  "name": "gpus",
  "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 16, "device": "cpu",
           "micro_batch_size": 2, "global_batch_size": 4, "train_iters": 6, "lr": 0.002, "log_interval": 1,
           "eval_iters": 0, "make_vocab_size_divisible_by": 1024,
           "data_path": [")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("]},
  "grid": {"tensor_model_parallel_size": )" + grid_tp + R"(},
  "seeds": [1, 2]
})");
  return file;
}

}  // namespace

TEST(SweepOnGpus, EveryPointHoldsGpusOfItsOwnWhileItRuns) {
  mb::testing::TempDir tmp;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
  const sw::Sweep s = sw::load_sweep(write_sweep(tmp.path(), "[2, 1]"));  // 2 points of 2 ranks, 2 of 1
  sw::RunOptions o;
  o.runs_dir = tmp / "runs";
  o.train_binary = fs::path(mb::testing::bin_dir()) / "train";
  o.threads = 1;
  o.gpus = {0, 1, 2};
  ::testing::internal::CaptureStdout();
  const int status = sw::run_sweep(s, o);
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(status, 0) << out;
  // Replay the runner's own account: at each start, the GPUs it names are free
  std::map<std::string, std::vector<int>> holding;
  std::set<int> busy;
  int starts = 0, max_busy = 0;
  std::istringstream in(out);
  const std::regex start(R"(^> start (\S+) \(attempt 1\) on GPUs? ([0-9,]+)$)"), done(R"(^> done (\S+) )");
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, m, start)) {
      ++starts;
      std::vector<int> g;
      std::stringstream list(m[2].str());
      for (std::string x; std::getline(list, x, ',');) g.push_back(std::stoi(x));
      for (int x : g) EXPECT_TRUE(busy.insert(x).second) << "GPU " << x << " given to " << m[1] << " while held\n" << out;
      holding[m[1]] = g;
      max_busy = std::max(max_busy, static_cast<int>(busy.size()));
    } else if (std::regex_search(line, m, done)) {
      for (int x : holding[m[1]]) busy.erase(x);
    }
  }
  EXPECT_EQ(starts, 4) << out;
  EXPECT_GE(max_busy, 2) << "points ran concurrently\n" << out;
  for (const auto& p : s.points) {
    const int ranks = sw::ranks_needed(p.config);
    ASSERT_EQ(holding[p.id].size(), static_cast<size_t>(ranks)) << p.id << "\n" << out;
    const std::string log = mb::testing::read_text(tmp / "runs" / "gpus" / p.id / "stdout.log");
    EXPECT_NE(log.find("(CUDA_VISIBLE_DEVICES=" + sw::gpu_list(holding[p.id]) + ")"), std::string::npos) << log;
    if (ranks == 2) {  // a real two-rank job: train says so
      EXPECT_NE(log.find("2 ranks: TP 2 x DP 1"), std::string::npos) << log;
    }
    EXPECT_TRUE(fs::exists(tmp / "runs" / "gpus" / p.id / "DONE")) << p.id;
  }
}

TEST(SweepOnGpus, APointNeedingMoreGpusThanGivenIsRefusedBeforeAnythingRuns) {
  mb::testing::TempDir tmp;
  const sw::Sweep s = sw::load_sweep(write_sweep(tmp.path(), "[4, 1]"));
  sw::RunOptions o;
  o.runs_dir = tmp / "runs";
  o.train_binary = fs::path(mb::testing::bin_dir()) / "train";
  o.gpus = {0, 1};
  try {
    sw::run_sweep(s, o);
    FAIL() << "a point of TP 4 on 2 GPUs was not refused";
  } catch (const mb::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("2 point(s) need more GPUs (tensor_model_parallel_size x data_parallel_size) than --gpus gives (2)"),
              std::string::npos) << what;
    EXPECT_NE(what.find("needs 4"), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(tmp / "runs" / "gpus")) << "nothing ran";
}

TEST(SweepOnGpus, ARefusedSweepDiscardsNothingEvenUnderRerun) {
  mb::testing::TempDir tmp;
  const sw::Sweep s = sw::load_sweep(write_sweep(tmp.path(), "[4, 1]"));
  const fs::path ran = tmp / "runs" / "gpus" / s.points.back().id;  // ran with another configuration
  sw::make_point_dir(ran);
  mb::testing::write_text(ran / "point.json", R"({"lr": 0.5})");
  sw::RunOptions o;
  o.runs_dir = tmp / "runs";
  o.train_binary = fs::path(mb::testing::bin_dir()) / "train";
  o.gpus = {0, 1};
  o.rerun_changed = true;  // would discard `ran`, were the sweep not refused first
  EXPECT_THROW(sw::run_sweep(s, o), mb::Error);
  EXPECT_EQ(mb::testing::read_text(ran / "point.json"), R"({"lr": 0.5})") << "the refused sweep deleted a point";
}
