// Mixed precision as Megatron does it, on the CPU (the half types emulated: stored rounded,
// computed in f32), through the real `train` binary and the trainer: bf16 and fp16 runs
// follow fp32 within a stated tolerance, fp32 master weights keep what the half weights
// cannot hold, an fp16 overflow skips the step (optimizer state untouched, neither the
// optimizer's step count nor the LR schedule advance) and backs the scale off, a clean
// window grows it, the scaler's state is checkpointed (resume is bitwise), checkpoints load
// across precisions, and the flags are refused where they make no sense.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "core/comm/communicator.h"
#include "core/optim/optimizer.h"
#include "core/train/trainer.h"
#include "models/registry.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace fs = std::filesystem;
namespace mb = megabatch;

namespace {

std::string train(const fs::path& run, const std::string& extra, int iters = 20) {
  return mb::testing::bin_dir() + "/train --num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 "
         "--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --log-interval 1 --eval-iters 0 " +
         mb::testing::threads_flag() + "--train-iters " + std::to_string(iters) + " --data-path " +
         (mb::testing::brown_data() / "brown_gpt2_text_document").string() + " --run-dir " + run.string() + " " + extra;
}

std::vector<double> series(const fs::path& metrics, const std::string& name) {
  mb::testing::H5File f(metrics.string(), mb::testing::H5File::kRead);
  return f.read<double>(name);
}

}  // namespace

TEST(MixedPrecision, Bf16AndFp16FollowTheFp32LossCurve) {
  mb::testing::TempDir tmp;
  std::map<std::string, std::vector<double>> losses;
  for (const std::string p : {"f32", "bf16", "fp16"}) {
    const std::string flags = p == "bf16" ? "--bf16" : p == "fp16" ? "--fp16 --initial-loss-scale 65536" : "";
    const auto r = mb::testing::run_command(train(tmp / p, flags));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    losses[p] = series(tmp / p / "metrics.h5", "train/lm_loss");
    ASSERT_EQ(losses[p].size(), 20u);
  }
  // Stated tolerance: every iteration's loss within two units of the half type's
  // roundoff, relative (bf16 2^-7, fp16 2^-10), of the fp32 run's over 20 AdamW steps.
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_NEAR(losses["bf16"][i], losses["f32"][i], 0x1.0p-7 * losses["f32"][i]) << "iteration " << i + 1;
    EXPECT_NEAR(losses["fp16"][i], losses["f32"][i], 0x1.0p-10 * losses["f32"][i]) << "iteration " << i + 1;
  }
  EXPECT_LT(losses["bf16"].back(), losses["bf16"].front() - 0.3) << "the bf16 run learns";
  EXPECT_NE(losses["bf16"], losses["f32"]) << "the bf16 run really stored bf16 values";
}

TEST(MixedPrecision, Fp16OverflowSkipsTheStepAndBacksTheScaleOff) {
  mb::testing::TempDir tmp;
  // The default initial scale 2^32 overflows the fp16 gradients of a fresh model.
  const auto r = mb::testing::run_command(train(tmp / "run", "--fp16 --lr-decay-style linear --save " +
                                                                 (tmp / "ckpt").string() + " --save-interval 2",
                                                6));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path m = tmp / "run" / "metrics.h5";
  const auto scale = series(m, "train/loss_scale"), skipped = series(m, "train/skipped"),
             lr = series(m, "train/learning_rate");
  ASSERT_EQ(scale.size(), 6u);
  // hysteresis 2: the first overflow is tolerated, each later one halves the scale
  EXPECT_EQ(scale[0], 4294967296.0);
  EXPECT_EQ(scale[1], 4294967296.0);
  EXPECT_EQ(skipped[0], 1.0);
  EXPECT_EQ(skipped[1], 1.0);
  int n_skipped = 0;
  for (size_t i = 0; i < 6; ++i) {
    n_skipped += skipped[i] != 0.0;
    if (i > 0) {
      EXPECT_EQ(scale[i], skipped[i - 1] != 0.0 && i >= 2 ? scale[i - 1] / 2 : scale[i - 1]) << i;
    }
    // the LR schedule advances only with applied steps: the first applied step has the first LR
    const size_t applied_before = static_cast<size_t>(std::count(skipped.begin(), skipped.begin() + static_cast<long>(i), 0.0));
    EXPECT_DOUBLE_EQ(lr[i], lr[0] * (1.0 - static_cast<double>(applied_before) / 6.0)) << "iteration " << i + 1;
  }
  EXPECT_GE(n_skipped, 2);
  EXPECT_NE(r.output.find("number of skipped iterations:   1 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("loss scale: 4294967296.0 |"), std::string::npos) << r.output;
  // after the two skipped steps the optimizer has not moved: its state is still zero
  mb::testing::H5File c((tmp / "ckpt" / "iter_0000002.h5").string(), mb::testing::H5File::kRead);
  const auto exp_avg = c.read<float>("optimizer/decoder.layers.0.mlp.linear_fc1.weight/exp_avg");
  EXPECT_TRUE(std::all_of(exp_avg.begin(), exp_avg.end(), [](float x) { return x == 0.0f; }));
  EXPECT_NE(c.attr_string("trainer").find("\"optimizer_steps\":0"), std::string::npos) << c.attr_string("trainer");
}

// An fp16 forward pass that overflows (weights drawn 30x too wide: logits past fp16's 65504)
// gives a NaN loss, which no loss scale mends: the run stops as diverged at that iteration, as
// Megatron's default --check-for-nan-in-loss-and-grad stops it. Before, the loss scaler skipped
// the step, and every later one, and the run ended "done" with a NaN loss; a sweep counted it
// as a result. bf16, whose range holds those logits, trains on until its loss passes the
// divergence threshold.
TEST(MixedPrecision, AnFp16LossThatOverflowsStopsTheRunAsDiverged) {
  mb::testing::TempDir tmp;
  auto r = mb::testing::run_command(train(tmp / "fp16", "--fp16 --init-method-std 30", 6));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("diverged at iteration 1: lm loss is "), std::string::npos) << r.output;
  ASSERT_TRUE(fs::exists(tmp / "fp16" / "DIVERGED")) << r.output;
  EXPECT_EQ(series(tmp / "fp16" / "metrics.h5", "train/lm_loss").size(), 1u);
  r = mb::testing::run_command(train(tmp / "bf16", "--bf16 --init-method-std 30", 6));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("lm loss above"), std::string::npos) << r.output;
  const auto bf16 = series(tmp / "bf16" / "metrics.h5", "train/lm_loss");
  EXPECT_TRUE(std::all_of(bf16.begin(), bf16.end(), [](double x) { return std::isfinite(x); }));
}

// fp16 steps that all overflow at a loss scale that cannot go lower (a static --loss-scale, or
// a dynamic one at --min-loss-scale) take no step however long the run goes on: after
// --divergence-intervals log intervals of nothing else (3, here 3 iterations) the run stops
// as diverged, naming the scale. Before, it ran to its end untrained and ended "done". A
// dynamic scale on its way down from 1e30 is no such run: it goes on.
TEST(MixedPrecision, Fp16StepsThatAllOverflowAtTheLowestScaleStopTheRun) {
  mb::testing::TempDir tmp;
  for (const auto& [flags, which] : std::vector<std::pair<std::string, std::string>>{
           {"--loss-scale 1e30", "a static one (--loss-scale)"},
           {"--initial-loss-scale 1e30 --min-loss-scale 1e30", "the lowest (--min-loss-scale)"}}) {
    SCOPED_TRACE(flags);
    const fs::path run = tmp / std::to_string(which.size());
    const auto r = mb::testing::run_command(train(run, "--fp16 " + flags, 12));
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_NE(r.output.find("diverged at iteration 3: every step of 3 log intervals overflowed fp16 at the loss scale "
                            "1e+30, " +
                            which + ", so no step was taken"),
              std::string::npos)
        << r.output;
    EXPECT_TRUE(fs::exists(run / "DIVERGED"));
    EXPECT_EQ(series(run / "metrics.h5", "train/skipped"), (std::vector<double>{1, 1, 1}));
  }
  const auto r = mb::testing::run_command(train(tmp / "down", "--fp16 --initial-loss-scale 1e30", 6));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(MixedPrecision, ACleanWindowGrowsTheScale) {
  mb::testing::TempDir tmp;
  const auto r = mb::testing::run_command(train(tmp / "run", "--fp16 --initial-loss-scale 256 --loss-scale-window 2", 7));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(series(tmp / "run" / "metrics.h5", "train/loss_scale"),
            (std::vector<double>{256, 256, 512, 512, 1024, 1024, 2048}));
  const auto skipped = series(tmp / "run" / "metrics.h5", "train/skipped");
  EXPECT_TRUE(std::all_of(skipped.begin(), skipped.end(), [](double x) { return x == 0.0; }));
}

TEST(MixedPrecision, ResumeWithTheLossScalerIsBitwise) {
  mb::testing::TempDir tmp;
  for (const std::string flags : {"--fp16 --loss-scale-window 3 --initial-loss-scale 1024", "--bf16"}) {
    SCOPED_TRACE(flags);
    const fs::path whole = tmp / "whole", split = tmp / "split";
    fs::remove_all(whole);
    fs::remove_all(split);
    auto r = mb::testing::run_command(train(whole, flags + " --save " + (whole / "ckpt").string(), 8));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = mb::testing::run_command(train(split, flags + " --save " + (split / "ckpt").string() + " --exit-interval 5", 8));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = mb::testing::run_command(train(split, flags + " --save " + (split / "ckpt").string() + " --load " +
                                              (split / "ckpt").string(), 8));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const std::string s : {"train/lm_loss", "train/grad_norm", "train/learning_rate"})
      EXPECT_EQ(series(whole / "metrics.h5", s), series(split / "metrics.h5", s)) << s;
    if (flags.find("fp16") != std::string::npos) {
      EXPECT_EQ(series(whole / "metrics.h5", "train/loss_scale"), series(split / "metrics.h5", "train/loss_scale"));
    }
  }
}

TEST(MixedPrecision, CheckpointsHoldFp32MastersAndLoadAcrossPrecisions) {
  mb::testing::TempDir tmp;
  // runs continued past the end of the one they resume: one decay span for all (a resume refuses another)
  const std::string decay = " --lr-decay-iters 5 ";
  auto r =
      mb::testing::run_command(train(tmp / "bf16", decay + "--bf16 --save " + (tmp / "bf16" / "ckpt").string(), 3));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // the stored weights are the fp32 masters: not all of them are bf16 values
  mb::testing::H5File c((tmp / "bf16" / "ckpt" / "iter_0000003.h5").string(), mb::testing::H5File::kRead);
  const auto w = c.read<float>("params/decoder.layers.0.mlp.linear_fc1.weight");
  EXPECT_TRUE(std::any_of(w.begin(), w.end(), [](float x) { return mb::round_to(mb::DType::kBF16, x) != x; }));
  // a bf16 checkpoint continues in fp32, an fp32 one in fp16
  r = mb::testing::run_command(train(tmp / "f32", decay + "--load " + (tmp / "bf16" / "ckpt").string(), 5));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(iteration 3,"), std::string::npos) << r.output;
  r = mb::testing::run_command(train(tmp / "f32", decay + "--save " + (tmp / "f32" / "ckpt").string(), 2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(
      train(tmp / "fp16", decay + "--fp16 --initial-loss-scale 1024 --load " + (tmp / "f32" / "ckpt").string(), 4));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(iteration 2,"), std::string::npos) << r.output;
}

TEST(MixedPrecision, MasterWeightsKeepUpdatesTooSmallForBf16) {
  // One SGD step of lr 1e-4 changes a weight of size ~0.02 by far less than its bf16 ulp
  // (~1e-4): the bf16 parameters stay, the fp32 masters move, and the parameters are the
  // masters rounded.
  mb::comm::LocalCommunicator tp;
  mb::models::ModelConfig c;
  c.num_layers = 1;
  c.hidden_size = 32;
  c.num_attention_heads = 2;
  c.seq_length = 8;
  c.vocab_size = 300;
  c.hidden_dropout = c.attention_dropout = 0;
  auto model = mb::models::make_model(c, tp, 3, mb::DType::kBF16);
  auto& P = model->parameters();
  const auto masters0 = mb::to_host_f32(P.masters()), params0 = mb::to_host_f32(P.params());
  for (size_t i = 0; i < masters0.size(); ++i) ASSERT_EQ(params0[i], masters0[i]) << "masters start as the bf16 values";
  const auto plugin = mb::optim::load_plugin("sgd", mb::optim::plugin_search_path());
  mb::optim::PluginOptimizer opt(plugin, P, tp, mb::optim::resolve_hparams(plugin, {{"momentum", 0.0}}, "t"), 0);
  mb::train::Batch b;
  b.batch = 2;
  b.seq = 8;
  for (int i = 0; i < 16; ++i) b.tokens.push_back(i * 7 % 300), b.labels.push_back(i * 11 % 300);
  P.zero_grad();
  model->forward(b, {1, 1, 0, false}, 1.0f);
  model->backward();
  opt.step(1, 1e-4, 2);
  const auto masters = mb::to_host_f32(P.masters()), params = mb::to_host_f32(P.params());
  size_t moved_masters = 0, kept_params = 0;
  for (size_t i = 0; i < masters.size(); ++i) {
    ASSERT_EQ(params[i], mb::round_to(mb::DType::kBF16, masters[i])) << "parameter " << i << " is its master rounded";
    if (masters[i] != masters0[i]) {
      ++moved_masters;
      kept_params += params[i] == params0[i];
    }
  }
  EXPECT_GT(moved_masters, 1000u);
  EXPECT_GT(kept_params, moved_masters / 2) << "most updates are below bf16 resolution and live only in the masters";
}

TEST(MixedPrecision, FlagsAreRefusedWhereTheyMakeNoSense) {
  mb::testing::TempDir tmp;
  auto r = mb::testing::run_command(train(tmp / "r", "--bf16 --fp16", 1));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--bf16 and --fp16 are mutually exclusive"), std::string::npos) << r.output;
  r = mb::testing::run_command(train(tmp / "r", "--bf16 --loss-scale 128", 1));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--loss-scale is for --fp16 runs (loss scaling); bf16 needs none"), std::string::npos) << r.output;
  r = mb::testing::run_command(train(tmp / "r", "--device tpu", 1));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("'tpu' is not a device; use cpu, cuda or cuda:N"), std::string::npos) << r.output;
  // without a GPU (or a CUDA build), --device cuda is a clear error, not a crash
  if (mb::testing::run_command("nvidia-smi -L").exit_code != 0) {
    r = mb::testing::run_command(train(tmp / "r", "--device cuda", 1));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(r.output.find("no GPU is visible") != std::string::npos ||
                r.output.find("built without CUDA") != std::string::npos)
        << r.output;
  }
}
