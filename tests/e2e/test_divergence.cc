// Divergence end to end: a NaN or infinite loss, a loss above --divergence-loss, weights a step
// overflowed and an evaluation that overflowed each stop the run with exit status 4 and
// run_dir/DIVERGED, and no checkpoint of the diverged weights is written.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "tests/e2e/train_fixture.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
namespace fs = std::filesystem;
using mb::testing::kSmall;
using mb::testing::Train;

// Divergence is a state, not an error: a NaN loss, or an lm loss that stays above
// --divergence-loss for --divergence-intervals log intervals, stops the run with exit
// status 4 and run_dir/DIVERGED (iteration, reason); no checkpoint of the diverged weights
// is written, and the metrics up to it stay readable.
TEST_F(Train, ADivergedRunStopsEarlyAndSaysWhereAndWhy) {
  const std::string base =
      kSmall +
      "--micro-batch-size 4 --global-batch-size 4 --train-iters 40 --lr-decay-style constant --log-interval 2 "
      "--eval-iters 1 --eval-interval 1000 --save-interval 1 ";
  {  // a loss above the threshold: the first logged intervals of a fresh model are ~10.9
    const fs::path run = tmp_ / "above", ckpt = tmp_ / "above_ckpt";
    const auto r = mb::testing::run_command(train(base + "--lr 1e-4 --divergence-loss 5 --divergence-intervals 3 --save " +
                                                  ckpt.string() + " --run-dir " + run.string()));
    ASSERT_EQ(r.exit_code, 4) << r.output;
    // logged at 1, 2 and 4 (iteration 1's line is an interval of its own): three intervals above 5
    const auto d = nlohmann::json::parse(mb::read_file(run / "DIVERGED"));
    EXPECT_EQ(d["iteration"], 4) << d.dump();
    EXPECT_NE(d["reason"].get<std::string>().find("above 5 (divergence_loss) for 3 log intervals"), std::string::npos) << d;
    EXPECT_NE(r.output.find(" diverged at iteration 4: lm loss above 5"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("validation loss at iteration 4 on validation set"), std::string::npos) << "no final evaluation";
    EXPECT_TRUE(fs::exists(ckpt / "iter_0000003.h5"));
    EXPECT_FALSE(fs::exists(ckpt / "iter_0000004.h5")) << "the diverged iteration is not checkpointed";
    const auto py = mb::testing::run_command("/usr/bin/python3 -c \"import h5py; f = h5py.File('" +
                                             (run / "metrics.h5").string() + "', 'r'); print(len(f['train/lm_loss']))\"");
    EXPECT_EQ(py.output, "4\n");
    // a new attempt decides afresh: resumed with a threshold it stays under, it finishes
    const auto again = mb::testing::run_command(train(base + "--lr 1e-4 --train-iters 6 --save " + ckpt.string() + " --load " +
                                                      ckpt.string() + " --run-dir " + run.string()));
    ASSERT_EQ(again.exit_code, 0) << again.output;
    EXPECT_FALSE(fs::exists(run / "DIVERGED"));
  }
  {  // a learning rate that sends LAMB's loss to NaN: stopped where the NaN appeared, long before 40
    const fs::path run = tmp_ / "nan";
    const auto r = mb::testing::run_command(train(base + "--optimizer lamb --lr 40 --divergence-loss 1e30 --save " +
                                                  (tmp_ / "nan_ckpt").string() + " --run-dir " + run.string()));
    ASSERT_EQ(r.exit_code, 4) << r.output;
    const auto d = nlohmann::json::parse(mb::read_file(run / "DIVERGED"));
    EXPECT_LT(d["iteration"].get<int>(), 40);
    EXPECT_TRUE(d["reason"].get<std::string>().find("is nan") != std::string::npos ||
                d["reason"].get<std::string>().find("is inf") != std::string::npos ||
                d["reason"].get<std::string>().find("is -nan") != std::string::npos) << d;
  }
}

// A step can overflow the weights while its own loss and gradient norm stay finite (they were
// computed before the update), and an evaluation can overflow where training did not. Before,
// the first was checkpointed and the run went on to a NaN loss a step later, "the last
// checkpoint before it" full of inf; and a NaN validation loss after the last iteration (the
// sweep's result) ended the run "done" with its checkpoint and a PPL of e^20. Now the weights
// are checked before every checkpoint and each evaluation's losses after it: either ends the
// run as diverged, with no checkpoint of those weights.
TEST_F(Train, WeightsOrAnEvaluationThatOverflowEndTheRunAsDivergedWithNoCheckpointOfThem) {
  const std::string base = kSmall + "--micro-batch-size 4 --global-batch-size 4 --optimizer sgd --log-interval 1 ";
  auto metrics = [](const fs::path& run, const std::string& name) {
    mb::testing::H5File f((run / "metrics.h5").string(), mb::testing::H5File::kRead);
    return f.read<double>(name);
  };
  auto reason = [](const fs::path& run) {
    return nlohmann::json::parse(mb::read_file(run / "DIVERGED"))["reason"].get<std::string>();
  };
  {  // lr 1e40 x gradients of norm ~1.5: past f32's 3.4e38, while iteration 1's loss and norm are finite
    const fs::path run = tmp_ / "inf", ckpt = tmp_ / "inf_ckpt";
    const auto r = mb::testing::run_command(train(base +
                                                  "--lr 1e40 --train-iters 3 --eval-iters 0 --save-interval 1 "
                                                  "--save " +
                                                  ckpt.string() + " --run-dir " + run.string()));
    ASSERT_EQ(r.exit_code, 4) << r.output;
    EXPECT_NE(reason(run).find("the weights after iteration 1 are not finite (embedding.word_embeddings.weight and "),
              std::string::npos)
        << reason(run);
    EXPECT_FALSE(fs::exists(ckpt / "iter_0000001.h5")) << r.output;
    const auto loss = metrics(run, "train/lm_loss");
    ASSERT_EQ(loss.size(), 1u);
    EXPECT_TRUE(std::isfinite(loss[0]));
  }
  // lr 1e37: every weight stays below 1e38 (finite) but the forward pass overflows. The
  // checkpoint after iteration 1 is written and holds only finite values (read back by h5py);
  // iteration 2's loss is NaN.
  const fs::path ckpt = tmp_ / "big_ckpt";
  {
    const fs::path run = tmp_ / "big";
    const auto r = mb::testing::run_command(train(base +
                                                  "--lr 1e37 --train-iters 3 --eval-iters 0 --save-interval 1 "
                                                  "--save " +
                                                  ckpt.string() + " --run-dir " + run.string()));
    ASSERT_EQ(r.exit_code, 4) << r.output;
    EXPECT_EQ(reason(run).rfind("lm loss is ", 0), 0u) << reason(run);
    const auto py = mb::testing::run_command("/usr/bin/python3 -c \"import h5py, numpy as np; f = h5py.File('" +
                                             (ckpt / "iter_0000001.h5").string() +
                                             "', 'r'); p = [f['params'][k][()] for k in f['params']]; print(len(p), "
                                             "all(np.isfinite(x).all() for x in p))\"");
    EXPECT_EQ(py.output, "28 True\n") << py.output;
  }
  {  // the same weights evaluated after the last iteration: diverged, and no final checkpoint
    const fs::path run = tmp_ / "valid", ckpt2 = tmp_ / "valid_ckpt";
    const auto r = mb::testing::run_command(train(base + "--lr 1e37 --train-iters 1 --eval-iters 1 --save " +
                                                  ckpt2.string() + " --run-dir " + run.string()));
    ASSERT_EQ(r.exit_code, 4) << r.output;
    EXPECT_EQ(reason(run).rfind("validation lm loss is ", 0), 0u) << reason(run);
    EXPECT_FALSE(fs::exists(ckpt2 / "iter_0000001.h5"));
    EXPECT_EQ(r.output.find("> done"), std::string::npos) << r.output;
    const auto v = metrics(run, "validation/lm_loss"), ppl = metrics(run, "validation/lm_loss_ppl");
    ASSERT_EQ(v.size(), 1u);
    ASSERT_EQ(ppl.size(), 1u);
    EXPECT_TRUE(std::isnan(v[0]));
    EXPECT_TRUE(std::isnan(ppl[0])) << "not Megatron's cap e^20 = " << std::exp(20.0) << ": " << ppl[0];
  }
  {  // and during training (--eval-interval): the run stops there, iteration 2 never runs
    const fs::path run = tmp_ / "interval";
    const auto r = mb::testing::run_command(
        train(base + "--lr 1e37 --train-iters 3 --eval-iters 1 --eval-interval 1 --run-dir " + run.string()));
    ASSERT_EQ(r.exit_code, 4) << r.output;
    EXPECT_EQ(nlohmann::json::parse(mb::read_file(run / "DIVERGED"))["iteration"], 1);
    EXPECT_EQ(metrics(run, "train/lm_loss").size(), 1u);
  }
  {  // --skip-train evaluates the checkpoint of huge weights: the same verdict
    const fs::path run = tmp_ / "skip";
    const auto r =
        mb::testing::run_command(train(base + "--lr 1e37 --train-iters 3 --eval-iters 1 --skip-train --load " +
                                       ckpt.string() + " --run-dir " + run.string()));
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_EQ(reason(run).rfind("validation lm loss is ", 0), 0u) << reason(run);
  }
}
