// Multi-process training under mpirun (Open MPI, oversubscribed on this machine): tensor
// parallel, data parallel (with and without the distributed optimizer) and both together
// reproduce the single-process run to fp32 tolerance, LAMB's per-tensor trust ratios are the same at TP 2 as at TP 1, a
// checkpoint written at TP 2 loads at TP 1 and TP 4, a job whose ranks disagree or die ends with a non-zero status that
// names the rank, a rank that stops past --distributed-timeout-minutes ends the job, and a signal to one rank (or
// --exit-duration-in-mins) stops every rank after the same iteration, and replicas whose weights differ stop the job
// at --check-weight-hash-across-dp-replicas-interval.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <regex>
#include <string>

#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace fs = std::filesystem;
namespace mb = megabatch;

namespace {

// leak_checked: in the sanitizer build, the ranks check leaks (with full stacks, 4x slower); the
// sanitize tests' other jobs check everything else (core/train/sanitizer_defaults.cc). The jobs
// that do cover each path of a rank: TP x DP, the distributed optimizer (its step, its checkpoint
// written and loaded at another size), overlapped buckets, a stop by signal.
constexpr const char* kRankLeakCheck = "MEGABATCH_RANK_LEAK_CHECK=1 ";
std::string mpirun(int np, bool leak_checked = false) {
  return mb::testing::mpi_env() + (leak_checked ? kRankLeakCheck : "") + "mpirun -np " + std::to_string(np) + " ";
}

// 4 heads, so TP 1, 2 and 4 all split it. The vocabulary is padded to a multiple of
// 128 x TP, and the padding rows take part in the softmax: runs to compare use
// same_padding(tp), which pads GPT-2's 50257 to 51200 at every TP.
std::string same_padding(int tp) { return " --make-vocab-size-divisible-by " + std::to_string(2048 / tp) + " "; }

std::string train(const fs::path& run, const std::string& extra) {
  return mb::testing::bin_dir() + "/train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
         "--micro-batch-size 2 --global-batch-size 8 --train-iters 4 --lr 3e-3 --log-interval 1 --eval-iters 0 "
         "--threads 1 --hidden-dropout 0.1 --attention-dropout 0.1 --data-path " +
         (mb::testing::brown_data() / "brown_gpt2_text_document").string() + " --run-dir " + run.string() + " " + extra;
}

std::vector<double> series(const fs::path& run, const std::string& name) {
  mb::testing::H5File f((run / "metrics.h5").string(), mb::testing::H5File::kRead);
  return f.read<double>(name);
}

// Runs resumed from the checkpoint of iteration 2 (each 2 iterations, in tmp/<run>) continue
// the lm loss of the uninterrupted 4-iteration run `whole` to fp32 tolerance.
void expect_resumed_runs_continue(const fs::path& tmp, std::initializer_list<const char*> runs, const fs::path& whole_run) {
  const auto whole = series(whole_run, "train/lm_loss");
  ASSERT_EQ(whole.size(), 4u);
  for (const char* run : runs) {
    const auto a = series(tmp / run, "train/lm_loss");
    ASSERT_EQ(a.size(), 2u) << run;
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(a[i], whole[i + 2], 2e-5 * whole[i + 2]) << run << " iteration " << i + 3;
  }
}

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rel, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i], rel * std::max(1.0, std::abs(b[i]))) << what << "[" << i << "]";
}

class Mpi : public ::testing::Test {
 protected:
  // The single-process reference: micro batch 2, global batch 8 (4 accumulation steps). Run at
  // its first use in this test process (each test is a process of its own; 5 of the 13 need none).
  static fs::path reference() {
    if (!ref_) {
      ref_ = new mb::testing::TempDir;
      const auto r = mb::testing::run_command(
          train(ref_->path() / "run", "--optimizer lamb --diagnostics-interval 1" + same_padding(1)));
      if (r.exit_code != 0) ADD_FAILURE() << "the one-process reference run failed:\n" << r.output;
    }
    return ref_->path() / "run";
  }
  static void TearDownTestSuite() {
    delete ref_;
    ref_ = nullptr;
  }
  // 4 iterations of 8 samples: losses and gradient norms to fp32 tolerance (the sums of
  // partial products come in another order).
  static void expect_matches_reference(int np, int tp, const std::string& flags = "", bool leak_checked = false) {
    mb::testing::TempDir tmp;
    const std::string extra = "--tensor-model-parallel-size " + std::to_string(tp) + same_padding(tp) + flags;
    const auto r = mb::testing::run_command(mpirun(np, leak_checked) +
                                            train(tmp / "run", "--optimizer lamb --diagnostics-interval 1 " + extra));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // Megatron's default deadline on collectives (10 minutes), on whenever there are ranks to wait for
    EXPECT_NE(r.output.find("> deadline: a collective that waits 10 min for the other ranks ends the job"),
              std::string::npos)
        << r.output;
    if (flags.find("--use-distributed-optimizer") != std::string::npos && np / tp > 1) {  // it was on
      EXPECT_NE(r.output.find("> distributed optimizer: this rank steps and keeps optimizer state for "), std::string::npos)
          << r.output;
      EXPECT_NE(r.output.find("gradients reduce-scattered over " + std::to_string(np / tp) + " ranks"), std::string::npos)
          << r.output;
    }
    for (const char* s : {"train/lm_loss", "train/grad_norm"})
      expect_close(series(tmp / "run", s), series(reference(), s), 2e-5, std::to_string(np) + " ranks " + extra + ": " + s);
    // LAMB's per-tensor norms and trust ratios: sharded norms reduced over the group once
    for (const char* s : {"optimizer/trust_ratio", "optimizer/weight_norm", "optimizer/update_norm"})
      expect_close(series(tmp / "run", s), series(reference(), s), 2e-5, std::to_string(np) + " ranks " + extra + ": " + s);
    mb::testing::H5File f((tmp / "run" / "metrics.h5").string(), mb::testing::H5File::kRead);
    EXPECT_EQ(f.read_strings("optimizer/tensor_names").size(), 28u);
  }
  static mb::testing::TempDir* ref_;
};
mb::testing::TempDir* Mpi::ref_ = nullptr;

}  // namespace

TEST_F(Mpi, TensorParallelTwoMatchesOneProcess) { expect_matches_reference(2, 2); }

TEST_F(Mpi, DataParallelTwoMatchesOneProcessWithTwiceTheAccumulation) { expect_matches_reference(2, 1); }

TEST_F(Mpi, TwoByTwoMatchesOneProcess) { expect_matches_reference(4, 2, "", true); }

TEST_F(Mpi, TensorParallelFourMatchesOneProcess) { expect_matches_reference(4, 4); }

TEST_F(Mpi, DataParallelFourMatchesOneProcess) { expect_matches_reference(4, 1); }

// The distributed optimizer (LAMB state sharded over DP, pieces' norms and trust ratios
// summed over the ranks): TP x DP = 1 x 4, 2 x 2 and 4 x 1 against one process, to the same
// tolerance. (At DP 1 there is nothing to shard: the flag changes nothing.)
TEST_F(Mpi, DistributedOptimizerOneByFourMatchesOneProcess) { expect_matches_reference(4, 1, " --use-distributed-optimizer"); }

TEST_F(Mpi, DistributedOptimizerTwoByTwoMatchesOneProcess) {
  expect_matches_reference(4, 2, " --use-distributed-optimizer", true);
}

TEST_F(Mpi, DistributedOptimizerFourByOneMatchesOneProcess) { expect_matches_reference(4, 4, " --use-distributed-optimizer"); }

// Its checkpoints hold whole tensors: written at DP 4, they resume in one process without
// it and at DP 2 with it, both continuing to the losses of the uninterrupted run.
TEST_F(Mpi, DistributedOptimizerCheckpointResumesAtAnotherDataParallelSize) {
  mb::testing::TempDir tmp;
  const std::string c = (tmp / "c").string();
  auto r = mb::testing::run_command(
      mpirun(4) + train(tmp / "dp4", "--optimizer lamb --use-distributed-optimizer --exit-interval 2 --save " + c + same_padding(1)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(train(tmp / "one", "--optimizer lamb --load " + c + same_padding(1)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(mpirun(2) + train(tmp / "dp2", "--optimizer lamb --use-distributed-optimizer --load " + c + same_padding(1)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(iteration 2,"), std::string::npos) << r.output;
  expect_resumed_runs_continue(tmp.path(), {"one", "dp2"}, reference());
}

// DP 3: buckets that are no multiple of 3 (padded), reduce-scattered during the backward
// pass, against one process with the same global batch.
// The noise scale's micro-batch norms are of each rank's whole local gradients, not of the
// shards the distributed optimizer keeps: with it the estimates are those of a run without.
TEST(MpiDistributedOptimizer, TheNoiseScaleIsThatOfARunWithoutIt) {
  mb::testing::TempDir tmp;
  const std::string flags = "--optimizer lamb --log-noise-scale" + same_padding(1);
  for (const std::string run : {"plain", "dist"}) {
    const auto r = mb::testing::run_command(
        mpirun(2) + train(tmp / run, flags + (run == "dist" ? " --use-distributed-optimizer" : "")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  for (const char* s : {"train/noise_grad_sq_norm", "train/noise_trace_cov", "noise_scale/b_simple"})
    expect_close(series(tmp / "dist", s), series(tmp / "plain", s), 1e-4, s);
  for (double b : series(tmp / "dist", "noise_scale/b_simple")) EXPECT_GT(b, 0) << "B_simple of a real run";
}

TEST(MpiDistributedOptimizer, OverlappedUnevenBucketsAtDataParallelThreeMatchOneProcess) {
  mb::testing::TempDir tmp;
  const std::string common = "--optimizer lamb --global-batch-size 12" + same_padding(1);
  auto r = mb::testing::run_command(train(tmp / "one", common));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(mpirun(3) + train(tmp / "dp3", common + " --use-distributed-optimizer --ddp-bucket-size 5000 "
                                                                    "--overlap-grad-reduce"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::regex said(R"(reduce-scattered over 3 ranks \(MPI\) in (\d+) bucket\(s\), (\d+) started during the backward pass)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, said)) << r.output;
  EXPECT_GE(std::stoi(m[1]), 4) << r.output;
  EXPECT_GE(std::stoi(m[2]), 1) << r.output;
  for (const char* s : {"train/lm_loss", "train/grad_norm"})
    expect_close(series(tmp / "dp3", s), series(tmp / "one", s), 2e-5, std::string("DP 3: ") + s);
}

// A ramped batch (--rampup-batch-size 4 4 8 to 8: batches 4, 4, then 8) at DP 2 takes one
// micro-batch a rank, then two, each its contiguous share of the step's batch: with overlapped
// buckets (armed at the last micro-batch of each step, whichever it is) it matches one process.
TEST(MpiRampup, ARampedBatchAtDataParallelTwoMatchesOneProcess) {
  mb::testing::TempDir tmp;
  auto ramped = [](const fs::path& run, const std::string& ramp, const std::string& extra = "") {
    std::string cmd =
        train(run, "--optimizer lamb --log-noise-scale --rampup-batch-size " + ramp + same_padding(1) + extra);
    const std::string iters = "--train-iters 4";
    cmd.replace(cmd.find(iters), iters.size(), "--train-samples 40");
    return cmd;
  };
  auto r = mb::testing::run_command(ramped(tmp / "one", "4 4 8"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(mpirun(2) +
                               ramped(tmp / "dp2", "4 4 8", " --overlap-grad-reduce --ddp-bucket-size 5000"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(series(tmp / "dp2", "train/global_batch_size"), (std::vector<double>{4, 4, 8, 8, 8, 8}));
  for (const char* s : {"train/lm_loss", "train/grad_norm", "train/consumed_samples"})
    expect_close(series(tmp / "dp2", s), series(tmp / "one", s), 2e-5, std::string("ramped at DP 2: ") + s);
  // a ramp whose batches are not whole micro-batches on both ranks is refused before it runs
  r = mb::testing::run_command(mpirun(2) + ramped(tmp / "odd", "2 2 8"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("must be multiples of micro_batch_size x data-parallel size (2 x 2 = 4)"), std::string::npos)
      << r.output;
}

// Mixed precision: each rank keeps the fp32 masters of its shards only, so a checkpoint
// gathers them. bf16 at DP 2: the checkpoint of the distributed optimizer holds the same
// masters and state as that of the plain DP run (to fp32 tolerance: the trust ratios' norms
// are summed over the pieces in another order), and it resumes in one process without the
// flag and at DP 4 with it, each continuing to the losses of the uninterrupted run.
TEST(MpiDistributedOptimizer, HalfPrecisionCheckpointGathersTheShardedMastersAndResumesAtAnotherSize) {
  mb::testing::TempDir tmp;
  const std::string common = "--optimizer lamb --bf16" + same_padding(1);
  const std::string c = (tmp / "c").string(), p = (tmp / "p").string();
  auto r = mb::testing::run_command(mpirun(2) + train(tmp / "whole", common + " --use-distributed-optimizer"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> distributed optimizer: this rank steps and keeps optimizer state and fp32 master weights for "),
            std::string::npos) << r.output;
  // the memory estimate: 4 bytes of masters per parameter over 2 ranks, the 2 of a bf16 parameter
  const std::regex memory(R"(parameters ([0-9.]+ [KMG]iB), gradients [^,]+, master weights \1 \(this rank's 1/2\), )"
                          R"(optimizer state [0-9.]+ [KMG]iB \(this rank's 1/2\))");
  EXPECT_TRUE(std::regex_search(r.output, memory)) << r.output;
  r = mb::testing::run_command(
      mpirun(2, true) + train(tmp / "dist", common + " --use-distributed-optimizer --exit-interval 2 --save " + c));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(mpirun(2) + train(tmp / "plain", common + " --exit-interval 2 --save " + p));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(
      "/usr/bin/python3 -c \"import h5py, numpy as np\n"
      "a, b = h5py.File('" + c + "/iter_0000002.h5'), h5py.File('" + p + "/iter_0000002.h5')\n"
      "names = []\n"
      "a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) else None)\n"
      "bad = [n for n in names if n not in b or not np.allclose(a[n][()], b[n][()], rtol=1e-5, atol=1e-8)]\n"
      "moved = sum(int(np.count_nonzero(a[n][()])) for n in names if n.startswith('optimizer/'))\n"
      "print(len([n for n in names if n.startswith('params/')]), 'parameters', 'differ:', bad[:3], 'state nonzero:', moved)\"");
  EXPECT_NE(r.output.find("28 parameters differ: []"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("state nonzero: 0\n"), std::string::npos) << "the checkpoints hold no optimizer state: " << r.output;
  r = mb::testing::run_command(train(tmp / "one", common + " --load " + c));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(mpirun(4, true) +
                               train(tmp / "dp4", common + " --use-distributed-optimizer --load " + c));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(iteration 2,"), std::string::npos) << r.output;
  expect_resumed_runs_continue(tmp.path(), {"one", "dp4"}, tmp / "whole");
}

// BERT and T5 under mpirun at TP 2 against one process (WordPiece + sentinels padded to
// the same rows at both sizes).
TEST(MpiModels, BertAndT5AtTensorParallelTwoMatchOneProcess) {
  for (const std::string type : {"bert", "t5"}) {
    mb::testing::TempDir tmp;
    auto args = [&](int tp) {
      return mb::testing::bin_dir() + "/train --model-type " + type + " --num-layers 2 --hidden-size 32 "
             "--num-attention-heads 4 --seq-length 48 --micro-batch-size 2 --global-batch-size 4 " +
             (type == "t5" ? "--decoder-seq-length 16 " : "") +
             "--train-iters 3 --lr 3e-3 --log-interval 1 --eval-iters 0 --threads 1 --hidden-dropout 0.1 "
             "--attention-dropout 0.1 --make-vocab-size-divisible-by " + std::to_string(2048 / tp) +
             " --tensor-model-parallel-size " + std::to_string(tp) + " --data-path " +
             (mb::testing::brown_data() / "brown_bert_text_sentence").string() + " --run-dir " +
             (tmp / ("tp" + std::to_string(tp))).string();
    };
    auto r = mb::testing::run_command(args(1));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = mb::testing::run_command(mpirun(2) + args(2));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::vector<std::string> names = {"train/lm_loss", "train/grad_norm"};
    if (type == "bert") names.push_back("train/sop_loss");
    for (const auto& s : names) expect_close(series(tmp / "tp2", s), series(tmp / "tp1", s), 2e-5, type + " " + s);
  }
}

// --calculate-per-token-loss at data parallel 2, one sample a micro-batch: each rank's micro-batches
// hold other counts of masked tokens, and the global batch's count is summed over the ranks, so
// the steps are those of one process taking the global batch of 4 as one micro-batch (where the
// token mean of the batch is the only mean there is).
TEST(MpiPerTokenLoss, BertAtDataParallelTwoStepsAsOneMicroBatchOfTheGlobalBatch) {
  mb::testing::TempDir tmp;
  auto args = [&](int micro, const std::string& run) {
    return mb::testing::bin_dir() +
           "/train --model-type bert --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 48 "
           "--micro-batch-size " +
           std::to_string(micro) +
           " --global-batch-size 4 --train-iters 3 --lr 3e-3 "
           "--log-interval 1 --eval-iters 0 --threads 1 --hidden-dropout 0 --attention-dropout 0 --data-path " +
           (mb::testing::brown_data() / "brown_bert_text_sentence").string() + " --run-dir " + (tmp / run).string();
  };
  auto r = mb::testing::run_command(args(4, "one"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(mpirun(2) + args(1, "dp2") + " --calculate-per-token-loss");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string s : {"train/lm_loss", "train/grad_norm", "train/sop_loss"})
    expect_close(series(tmp / "dp2", s), series(tmp / "one", s), 2e-5, s);
}

TEST_F(Mpi, CheckpointWrittenAtTensorParallelTwoLoadsAtOneAndFour) {
  mb::testing::TempDir tmp;
  const std::string c = (tmp / "c").string();
  auto r = mb::testing::run_command(mpirun(2) + train(tmp / "tp2", "--tensor-model-parallel-size 2 --exit-interval 2 --save " + c + same_padding(2)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Parameters and optimizer state are stored whole: TP 1 and TP 4 continue from
  // iteration 2 to the losses of the uninterrupted TP 1 run.
  r = mb::testing::run_command(train(tmp / "tp1", "--load " + c + same_padding(1)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(iteration 2,"), std::string::npos) << r.output;
  r = mb::testing::run_command(mpirun(4) + train(tmp / "tp4", "--tensor-model-parallel-size 4 --load " + c + same_padding(4)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(train(tmp / "whole", same_padding(1)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_resumed_runs_continue(tmp.path(), {"tp1", "tp4"}, tmp / "whole");
  // With the default padding (128 x TP) the vocabulary-row tensors differ in padding rows
  // only; the rows both have load and the run continues.
  const std::string d = (tmp / "d").string();
  r = mb::testing::run_command(mpirun(2) +
                               train(tmp / "tp2b", "--tensor-model-parallel-size 2 --exit-interval 2 --save " + d));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(train(tmp / "tp1b", "--load " + d));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto b = series(tmp / "tp1b", "train/lm_loss");
  ASSERT_EQ(b.size(), 2u);
  EXPECT_LT(b[0], 11.0);
}

TEST_F(Mpi, RanksStartedWithDifferentConfigurationsAreRefused) {
  mb::testing::TempDir tmp;
  // a hang is timeout's exit status 124 (a deadline for a loaded machine, not a pace)
  const auto r = mb::testing::run_command(
      mb::testing::mpi_env() + "timeout 300 mpirun -np 1 " + train(tmp / "run", "--lr 1e-3") +
      " : -np 1 " + train(tmp / "run", "--lr 2e-3"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "the job hung:\n" << r.output;
  EXPECT_NE(r.output.find("rank 1 was started with a configuration that differs from rank 0's: "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("0.002 here, 0.001 on rank 0"), std::string::npos)
      << r.output;
}

// --check-weight-hash-across-dp-replicas-interval (Megatron's): data-parallel replicas hold the
// same weights, said at the start and every N iterations, with the distributed optimizer too; a
// plugin drawing noise from a generator of its own (tests/plugins/own_noise.cc) moves them apart
// in its first step, and the job stops at the first check after it, naming the first parameter,
// before any checkpoint of it is written. One replica compares nothing, and says so.
TEST_F(Mpi, ReplicasWhoseWeightsDifferStopTheJobAtTheWeightCheck) {
  mb::testing::TempDir tmp;
  const std::string check = " --check-weight-hash-across-dp-replicas-interval 2";
  for (const std::string extra : {"", " --use-distributed-optimizer"}) {
    const auto r = mb::testing::run_command(mpirun(2) + train(tmp / "same", "--optimizer adamw" + check + extra));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const char* at : {"0", "2", "4"})
      EXPECT_NE(
          r.output.find(std::string("> weights: the 2 data-parallel replicas hold the same weights at iteration ") +
                        at + "\n"),
          std::string::npos)
          << extra << " at " << at << "\n"
          << r.output;
  }
  const fs::path ckpt = tmp / "ckpt";
  const auto r = mb::testing::run_command(
      mpirun(2) + train(tmp / "noisy", "--optimizer own_noise --plugin-path " MEGABATCH_TEST_PLUGIN_DIR + check +
                                           " --save " + ckpt.string() + " --save-interval 2"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> weights: the 2 data-parallel replicas hold the same weights at iteration 0"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("error: the 2 data-parallel replicas hold different weights at iteration 2 "
                          "(--check-weight-hash-across-dp-replicas-interval): embedding.word_embeddings.weight differs "
                          "between data-parallel ranks 0 and 1 (and "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("an optimizer plugin that draws noise from a generator of its own"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(ckpt / "iter_0000002.h5")) << "no checkpoint of replicas that differ";
  const auto one = mb::testing::run_command(
      train(tmp / "one", "--optimizer own_noise --plugin-path " MEGABATCH_TEST_PLUGIN_DIR + check));
  EXPECT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("> note: --check-weight-hash-across-dp-replicas-interval compares the data-parallel "
                            "replicas' weights, and this run has one: nothing to compare"),
            std::string::npos)
      << one.output;
  EXPECT_EQ(one.output.find("> weights:"), std::string::npos) << one.output;
}

TEST_F(Mpi, ARankThatDiesEndsTheJob) {
  mb::testing::TempDir tmp;
  const std::string log = (tmp / "log").string();
  // start a long DP=2 run, wait for its second iteration line, SIGKILL one rank; a hang is
  // timeout's exit status 124
  const auto r = mb::testing::run_command(
      "(" + mb::testing::mpi_env() + "timeout 300 mpirun -np 2 " +
      train(tmp / "run", "--train-iters 100000") + " > " + log + " 2>&1; echo exit=$? >> " + log + ") & " +
      mb::testing::wait_for_line(log, "iteration  *2/") +
      "pkill -9 -f -n 'train.*" + (tmp / "run").string() + "'; wait; cat " + log);
  EXPECT_EQ(r.output.find("exit=0"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("exit=124"), std::string::npos) << "the job hung:\n" << r.output;
  EXPECT_NE(r.output.find("exit="), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << "mpirun names the rank that died:\n" << r.output;
}

// --distributed-timeout-minutes: a rank that stops (SIGSTOP: a hung or frozen process) leaves
// the other waiting in its next collective; at the deadline (0.25 min) that rank says which
// group's collective waited how long and ends with status 5, and the job ends instead of
// hanging (a hang is timeout's status 124), with its metrics intact. The run is made long by
// its configuration; the test waits for its third iteration line, not for a time.
TEST_F(Mpi, ACollectiveWaitingPastTheDistributedTimeoutEndsTheJob) {
  mb::testing::TempDir tmp;
  const std::string log = (tmp / "log").string();
  const auto r = mb::testing::run_command(
      "(" + mb::testing::mpi_env() + "timeout 300 mpirun -np 2 " +
      train(tmp / "run", "--train-iters 100000 --distributed-timeout-minutes 0.25") + " > " + log +
      " 2>&1; echo exit=$? >> " + log + ") & " + mb::testing::wait_for_line(log, "iteration  *3/") +
      "pkill -STOP -f -n 'train.*" + (tmp / "run").string() + "'; wait; cat " + log);
  EXPECT_EQ(r.output.find("exit=124"), std::string::npos) << "the job hung:\n" << r.output;
  EXPECT_NE(r.output.find("exit=5"), std::string::npos) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("train \\(rank [01]\\): error: the (world|data-parallel) group's "
                                                     "[a-z -]+ has waited [0-9.]+ s for its other ranks "
                                                     "\\(--distributed-timeout-minutes 0.25\\): one of them died")))
      << r.output;
  const auto it = series(tmp / "run", "train/iteration");
  ASSERT_GE(it.size(), 3u) << "the metrics written before the stop are readable";
  EXPECT_EQ(it[2], 3.0);
}

// A scheduler's signal reaches the ranks of a job at different moments; here it reaches one
// rank only (the newest process), the extreme case. Every rank stops after the same
// iteration, the checkpoint of that iteration is written, and the job exits 3, where the
// signalled rank used to leave the loop alone and the other wait for it in a collective.
TEST_F(Mpi, ASignalToOneRankStopsEveryRankAfterTheSameIteration) {
  mb::testing::TempDir tmp;
  const std::string log = (tmp / "log").string(), ckpt = (tmp / "ckpt").string();
  const auto r = mb::testing::run_command(
      "(" + mb::testing::mpi_env() + kRankLeakCheck + "timeout 300 mpirun -np 2 " +
      train(tmp / "run", "--train-iters 100000 --save " + ckpt) + " > " + log + " 2>&1; echo exit=$? >> " + log +
      ") & " + mb::testing::wait_for_line(log, "iteration  *3/") + "pkill -TERM -f -n 'train.*" +
      (tmp / "run").string() + "'; wait; cat " + log);
  EXPECT_NE(r.output.find("exit=3"), std::string::npos) << "the job did not stop with status 3:\n" << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("stopped by signal 15 after iteration (\\d+)"))) << r.output;
  const int64_t stopped = std::stoll(m[1].str());
  const auto it = series(tmp / "run", "train/iteration");
  ASSERT_FALSE(it.empty());
  EXPECT_EQ(it.back(), static_cast<double>(stopped)) << "the metrics end at the iteration the job stopped after";
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld.h5", static_cast<long long>(stopped));
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / name)) << "the checkpoint of iteration " << stopped << "\n" << r.output;
}

// --exit-duration-in-mins under MPI: the ranks agree on it in the all-reduce that agrees on a
// signal, so a job of 2 ranks made long by its configuration (100000 iterations, a budget below
// any iteration's time) stops after the same iteration, the first, writes its checkpoint and
// exits 3 through mpirun, whatever the machine's speed.
TEST_F(Mpi, ExitDurationStopsEveryRankAfterTheSameIteration) {
  mb::testing::TempDir tmp;
  const std::string ckpt = (tmp / "ckpt").string();
  // a hang is timeout's exit status 124 (a deadline for a loaded machine, not a pace)
  const auto r =
      mb::testing::run_command(mb::testing::mpi_env() + "timeout 300 mpirun -np 2 " +
                               train(tmp / "run", "--train-iters 100000 --exit-duration-in-mins 1e-6 --save " + ckpt));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find(" exiting after iteration 1, "), std::string::npos) << r.output;
  EXPECT_EQ(series(tmp / "run", "train/iteration"), (std::vector<double>{1}));
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "iter_0000001.h5")) << r.output;
}

// Data-parallel gradient buckets: the same buckets summed after the backward pass, or each
// as soon as the last micro-batch's backward pass has finished it (--overlap-grad-reduce),
// or everything as one bucket, give bitwise the same losses and gradient norms (at DP 2 a
// sum of two is exact in any order) for GPT, BERT and T5; at TP 2 x DP 2 too. The overlap
// is real: buckets start during the backward pass (the trainer says how many).
TEST(MpiBuckets, OverlappedBucketsGiveTheGradientsOfOneReductionBitwise) {
  for (const std::string type : {"gpt", "bert", "t5"}) {
    SCOPED_TRACE(type);
    mb::testing::TempDir tmp;
    const bool gpt = type == "gpt";
    auto run = [&](const std::string& name, int np, const std::string& extra) {
      const std::string cmd = mb::testing::bin_dir() + "/train --model-type " + type + " --num-layers 3 --hidden-size 32 " +
                              "--num-attention-heads 4 --seq-length " + (gpt ? "16" : "48") +
                              (type == "t5" ? " --decoder-seq-length 16 " : " ") +
                              "--micro-batch-size 2 --global-batch-size 8 --train-iters 3 --lr 3e-3 --log-interval 1 " +
                              "--eval-iters 0 --threads 1 --hidden-dropout 0.1 --attention-dropout 0.1 --data-path " +
                              (mb::testing::brown_data() / (gpt ? "brown_gpt2_text_document" : "brown_bert_text_sentence")).string() +
                              " --run-dir " + (tmp / name).string() + " " + extra;
      const auto r = mb::testing::run_command(mpirun(np, gpt && name == "overlap") + cmd);
      EXPECT_EQ(r.exit_code, 0) << r.output;
      return r.output;
    };
    run("one", 2, "");
    run("after", 2, "--ddp-bucket-size 6000");
    const std::string overlapped = run("overlap", 2, "--ddp-bucket-size 6000 --overlap-grad-reduce");
    const std::regex said(R"(in (\d+) bucket\(s\), (\d+) started during the backward pass)");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(overlapped, m, said)) << overlapped;
    EXPECT_GE(std::stoi(m[1]), 4) << overlapped;
    EXPECT_GE(std::stoi(m[2]), 3) << "the blocks' buckets start before the backward pass ends\n" << overlapped;
    for (const char* s : {"train/lm_loss", "train/grad_norm"}) {
      EXPECT_EQ(series(tmp / "after", s), series(tmp / "one", s)) << s;
      EXPECT_EQ(series(tmp / "overlap", s), series(tmp / "one", s)) << s;
    }
    if (gpt) {  // with tensor parallelism beside it
      run("tp_after", 4, "--tensor-model-parallel-size 2 --ddp-bucket-size 3000");
      run("tp_overlap", 4, "--tensor-model-parallel-size 2 --ddp-bucket-size 3000 --overlap-grad-reduce");
      for (const char* s : {"train/lm_loss", "train/grad_norm"})
        EXPECT_EQ(series(tmp / "tp_overlap", s), series(tmp / "tp_after", s)) << "TP 2 x DP 2: " << s;
    }
  }
}

// data_parallel_size says what the job was meant to be: a job of another size is refused,
// naming the key and how many ranks to launch; the right size runs.
TEST(MpiLayout, AJobOfAnotherDataParallelSizeIsRefused) {
  mb::testing::TempDir tmp;
  auto r = mb::testing::run_command(mpirun(2) + train(tmp / "a", "--train-iters 1 --data-parallel-size 1"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("data_parallel_size 1: this job has 2 rank(s) at tensor_model_parallel_size 1, so DP is 2; "
                          "launch TP x DP = 1 ranks"), std::string::npos) << r.output;
  r = mb::testing::run_command(mpirun(2) + train(tmp / "b", "--train-iters 1 --data-parallel-size 2"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// Mixed precision: the fp32 masters of each piece stepped, all-gathered and rounded into
// the half weights; fp16's overflow check over the shards skips the same steps (the loss
// scale drops on the same iterations) as without the distributed optimizer.
TEST(MpiDistributedOptimizer, HalfPrecisionStepsAsWithoutIt) {
  for (const std::string flag : {"--bf16", "--fp16"}) {
    SCOPED_TRACE(flag);
    mb::testing::TempDir tmp;
    // fp16 from 2^23 halving at each overflow: the first steps overflow and are skipped, the
    // later ones are applied
    const std::string common = "--optimizer adamw " + flag + same_padding(1) +
                               (flag == "--fp16" ? " --initial-loss-scale 8388608 --hysteresis 1" : "");
    auto r = mb::testing::run_command(mpirun(2) + train(tmp / "plain", common));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = mb::testing::run_command(mpirun(2) + train(tmp / "dist", common + " --use-distributed-optimizer"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_close(series(tmp / "dist", "train/lm_loss"), series(tmp / "plain", "train/lm_loss"), 2e-5, flag + " lm loss");
    // the unscaled gradient norm (a skipped fp16 step's is NaN on both; a shard left scaled
    // would show the loss scale)
    const auto norm = series(tmp / "dist", "train/grad_norm"), plain_norm = series(tmp / "plain", "train/grad_norm");
    ASSERT_EQ(norm.size(), plain_norm.size());
    size_t finite = 0;
    for (size_t i = 0; i < norm.size(); ++i) {
      EXPECT_EQ(std::isfinite(norm[i]), std::isfinite(plain_norm[i])) << "iteration " << i + 1;
      if (!std::isfinite(plain_norm[i])) continue;
      ++finite;
      EXPECT_NEAR(norm[i], plain_norm[i], 2e-5 * std::max(1.0, plain_norm[i])) << "grad norm, iteration " << i + 1;
    }
    EXPECT_GT(finite, 0u) << "every step overflowed: the norms show nothing";
    if (flag == "--fp16") {
      const auto scale = series(tmp / "dist", "train/loss_scale");
      EXPECT_EQ(scale, series(tmp / "plain", "train/loss_scale"));
      EXPECT_LT(scale.back(), scale.front()) << "no overflow was skipped: the test shows nothing about skipped steps";
    }
  }
}
