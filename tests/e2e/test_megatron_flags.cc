// Megatron-LM's own flags in train (core/train/megatron_flags.cc): the example scripts of
// Megatron's GPT, BERT and T5 pass train --check as they are; what megabatch does not have is
// refused in one message that names every such flag; --attention-backend chooses the attention
// (flash on the CPU is the flash algorithm's reference, and trains as the explicit attention
// does); --exit-on-missing-checkpoint stops a run whose --load holds no checkpoint.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
namespace fs = std::filesystem;

namespace {
class MegatronFlags : public ::testing::Test {
 protected:
  static std::string data(const char* name) { return (mb::testing::brown_data() / name).string(); }
  static mb::testing::CommandResult train(const std::string& args) {
    return mb::testing::run_command(mb::testing::bin_dir() + "/train " + args + " " + mb::testing::threads_flag());
  }
  mb::testing::TempDir tmp_;
};

// Each taken flag is said on a line of its own, naming it and why nothing is to be done.
void expect_noted(const std::string& output, const std::vector<std::string>& flags) {
  for (const std::string& flag : flags)
    EXPECT_NE(output.find("> note: Megatron-LM's " + flag + " needs nothing here: "), std::string::npos)
        << flag << "\n"
        << output;
}
}  // namespace

// The flags of examples/gpt3/train_gpt3_175b_distributed.sh, examples/bert/train_bert_340m_
// distributed.sh and examples/t5/train_t5_220m_distributed.sh (Megatron-LM, 2025), in their
// order, with the sizes made small, one rank (tensor and pipeline parallel sizes 1), the default
// vocabulary files and --model-type for the script's name. Left out: GPT's --rampup-batch-size
// beside --train-iters, which Megatron itself refuses ("expected no batch-size rampup for
// iteration-based training") as megabatch does, T5's --distributed-backend nccl (it needs
// GPUs), T5's BertWordPieceCase, which needs a cased vocabulary (the default is uncased), and
// T5's --split 99982,9,9, which leaves the validation split none of the corpus's 500 documents.
TEST_F(MegatronFlags, TheExampleScriptsOfMegatronsGptBertAndT5PassTrainCheck) {
  const std::string dirs = "--save " + (tmp_ / "ckpt").string() + " --load " + (tmp_ / "ckpt").string() +
                           " --tensorboard-dir " + (tmp_ / "tb").string();
  const std::string gpt =
      "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 --max-position-embeddings 32 "
      "--attention-backend auto --micro-batch-size 1 --global-batch-size 16 --train-iters 500000 --weight-decay 0.1 "
      "--adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006 --clip-grad 1.0 --fp16 --lr 6.0e-5 "
      "--lr-decay-style cosine --min-lr 6.0e-6 --lr-warmup-fraction .001 --lr-decay-iters 430000 "
      "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --data-path " +
      data("brown_gpt2_text_document") +
      " --split 949,50,1 --log-interval 100 --save-interval 10000 --eval-interval 1000 --eval-iters 10 ";
  const std::string bert =
      "--model-type bert --num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 64 "
      "--max-position-embeddings 64 --attention-backend auto --micro-batch-size 4 --global-batch-size 32 "
      "--train-iters 1000000 --weight-decay 1e-2 --clip-grad 1.0 --fp16 --lr 0.0001 --lr-decay-iters 990000 "
      "--lr-decay-style linear --min-lr 1.0e-5 --weight-decay 1e-2 --lr-warmup-fraction .01 --clip-grad 1.0 "
      "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --data-path " +
      data("brown_bert_text_sentence") +
      " --split 949,50,1 --log-interval 100 --save-interval 10000 --eval-interval 1000 --eval-iters 10 ";
  const std::string t5 =
      "--model-type t5 --encoder-num-layers 2 --decoder-num-layers 2 --hidden-size 64 --num-attention-heads 2 "
      "--kv-channels 32 --ffn-hidden-size 256 --encoder-seq-length 64 --decoder-seq-length 16 "
      "--max-position-embeddings 64 --micro-batch-size 4 --global-batch-size 8 --lr 0.0001 --train-iters 1000000 "
      "--lr-decay-iters 1000000 --lr-decay-style linear --min-lr 0.00001 --weight-decay 1e-2 "
      "--lr-warmup-fraction .01 --clip-grad 1.0 --bf16 --vocab-extra-ids 100 --init-method-std 0.015 "
      "--transformer-impl transformer_engine --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
      "--attention-backend auto --data-path " +
      data("brown_bert_text_sentence") +
      " --tokenizer-type BertWordPieceLowerCase --split 949,50,1 --log-interval 100 --save-interval 500 "
      "--eval-interval 1000 --eval-iters 10 ";
  for (const auto& [name, args, taken] :
       {std::tuple{"gpt", gpt, std::vector<std::string>{"--pipeline-model-parallel-size 1"}},
        std::tuple{"bert", bert, std::vector<std::string>{"--pipeline-model-parallel-size 1"}},
        std::tuple{"t5", t5,
                   std::vector<std::string>{"--transformer-impl transformer_engine",
                                            "--pipeline-model-parallel-size 1"}}}) {
    SCOPED_TRACE(name);
    const auto r = train("--check " + args + dirs);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("> check: configuration, optimizer adamw, data "), std::string::npos) << r.output;
    expect_noted(r.output, taken);
  }
  // Megatron Core's check for NaN (its --no- form is in many scripts): megabatch stops at the
  // first NaN whichever is given
  for (const std::string nan : {"--check-for-nan-in-loss-and-grad", "--no-check-for-nan-in-loss-and-grad"}) {
    const auto r = train("--check " + gpt + dirs + " " + nan);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    expect_noted(r.output, {nan});
    EXPECT_NE(r.output.find(nan + " needs nothing here: megabatch stops a run as diverged (exit status 4, "
                                  "run_dir/DIVERGED) at the first NaN or inf lm loss or gradient norm, always"),
              std::string::npos)
        << r.output;
  }
  // how Megatron's step runs or logs (in its newer scripts): taken, each said
  const std::vector<std::string> how = {"--ddp-average-in-collective", "--no-align-grad-reduce",
                                        "--train-sync-interval 10", "--logging-level 20"};
  std::string all;
  for (const std::string& flag : how) all += " " + flag;
  const auto noted = train("--check " + gpt + dirs + all);
  EXPECT_EQ(noted.exit_code, 0) << noted.output;
  expect_noted(noted.output, how);
  // --kv-channels is taken at the one value megabatch's attention has: hidden / heads
  const auto r = train("--check " + gpt + "--kv-channels 16");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--kv-channels 16: megabatch's attention heads have hidden / heads = 64 / 2 channels each"),
            std::string::npos)
      << r.output;
}

// A Llama-style script: every flag megabatch does not take is named in the one error, with the
// reason and what to do, with the unknown flag among them; the taken ones are not in it.
TEST_F(MegatronFlags, WhatMegabatchDoesNotHaveIsRefusedInOneMessageNamingEveryFlag) {
  const auto r = train(
      "--check --num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 --lr 1e-4 "
      "--train-iters 2 --data-path " +
      data("brown_gpt2_text_document") +
      " --use-mcore-models --reset-position-ids --reset-attention-mask --apply-residual-connection-post-layernorm "
      "--qk-layernorm "
      "--position-embedding-type "
      "learned_absolute --group-query-attention --num-query-groups 2 --squared-relu --fp8-format hybrid "
      "--init-method-xavier-uniform "
      "--fp8-recipe delayed "
      "--sequence-parallel --pipeline-model-parallel-size 4 --transformer-impl=te --ckpt-format "
      "torch_dist --no-such-flag 7 --recompute-activations --use-rotary-position-embeddings --log-energy "
      "--grad-reduce-in-bf16");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string megatrons = "(Megatron-LM's) is not taken here: ";
  for (const std::string& line :
       {std::string("train: error: 9 of the options cannot be taken; drop or change each:\n"),
        "\n  --log-energy " + megatrons + "megabatch does not read the GPUs' energy counters; drop it",
        "\n  --grad-reduce-in-bf16 " + megatrons +
            "megabatch sums the data-parallel gradients in fp32 always (its main gradients); drop it",
        "\n  --fp8-format hybrid " + megatrons +
            "megabatch trains in fp32, bf16 (--bf16) or fp16 (--fp16); it has no fp8",
        "\n  --fp8-recipe delayed " + megatrons +
            "megabatch trains in fp32, bf16 (--bf16) or fp16 (--fp16); it has no fp8",
        "\n  --pipeline-model-parallel-size 4 " + megatrons + "megabatch has no pipeline parallelism; spread the model",
        "\n  --transformer-impl te " + megatrons + "Megatron's values are local and transformer_engine",
        "\n  --ckpt-format torch_dist " + megatrons + "megabatch writes and reads checkpoints of its own (HDF5",
        std::string("\n  unknown option --no-such-flag (see --help)\n"),
        "\n  --use-rotary-position-embeddings " + megatrons +
            "Megatron's older switch for rotary embeddings; say --position-embedding-type rope"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  for (const char* taken :
       {"--use-mcore-models", "--sequence-parallel", "--recompute-activations", "7", "--group-query-attention",
        "--num-query-groups", "--qk-layernorm", "--squared-relu", "--apply-residual-connection-post-layernorm",
        "--reset-position-ids", "--reset-attention-mask", "--init-method-xavier-uniform"})
    EXPECT_EQ(r.output.find(std::string("  ") + taken + " "), std::string::npos) << taken << "\n" << r.output;
}

// Megatron's --group-query-attention --num-query-groups is taken (its model is in test_gpt.cc's
// GroupedQueryAttentionGivesPyTorchsLossAndGradients); each mistake of it is named with what to
// do: groups without the switch (Megatron would ignore them), groups that do not divide the
// heads, groups the tensor-parallel ranks do not divide, and T5, whose cross-attention Megatron
// does not group.
TEST_F(MegatronFlags, GroupedQueryAttentionIsTakenAndItsMistakesAreNamed) {
  const std::string common =
      "--check --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --lr 1e-4 --train-iters 2 ";
  const std::string gpt = common + "--data-path " + data("brown_gpt2_text_document") + " ";
  auto r = train(gpt + "--group-query-attention --num-query-groups 2 --print-params");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("4 heads in 2 key/value groups"), std::string::npos) << r.output;
  for (const auto& [flags, error] : std::vector<std::pair<std::string, std::string>>{
           {gpt + "--num-query-groups 2",
            "--num-query-groups sets grouped-query attention, which this run does not have (Megatron ignores it "
            "then); add --group-query-attention, or drop it"},
           {gpt + "--group-query-attention --num-query-groups 3",
            "--num-query-groups 3 does not divide the 4 attention heads; make it a divisor"},
           {gpt + "--group-query-attention --tensor-model-parallel-size 2",
            "--num-query-groups 1 is not a multiple of --tensor-model-parallel-size 2; each rank holds whole groups"},
           {common + "--model-type t5 --group-query-attention --data-path " + data("brown_bert_text_sentence"),
            "--group-query-attention: T5's decoder cross-attends, and Megatron's cross-attention takes no "
            "grouped-query attention; drop it"}}) {
    r = train(flags);
    EXPECT_EQ(r.exit_code, 1) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find("train: error: " + error), std::string::npos) << flags << "\n" << r.output;
  }
}

// Megatron's --calculate-per-token-loss on BERT (whose micro-batches hold other counts of masked
// tokens), dropout off: at micro-batch 1 and 2 of a global batch of 4 the losses and gradient
// norms are those of one micro-batch of 4, where the mean over the batch's tokens is the only
// mean (the default path, which is what any split of it is measured against); without it, the
// mean of 4 micro-batches' means steps otherwise. Beside --log-noise-scale it is refused.
TEST_F(MegatronFlags, PerTokenLossStepsAsOneMicroBatchHoweverTheBatchIsSplit) {
  auto run = [&](int micro, const std::string& name, const std::string& extra) {
    const auto r = train(
        "--model-type bert --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 48 "
        "--micro-batch-size " +
        std::to_string(micro) +
        " --global-batch-size 4 --train-iters 3 --lr 3e-3 --log-interval 1 --eval-iters 0 --hidden-dropout 0 "
        "--attention-dropout 0 --data-path " +
        data("brown_bert_text_sentence") + " --run-dir " + (tmp_ / name).string() + " " + extra);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    mb::testing::H5File f((tmp_ / name / "metrics.h5").string(), mb::testing::H5File::kRead);
    return std::pair{f.read<double>("train/lm_loss"), f.read<double>("train/grad_norm")};
  };
  const auto whole = run(4, "whole", "");
  ASSERT_EQ(whole.first.size(), 3u);
  for (const int micro : {1, 2}) {
    SCOPED_TRACE("micro-batch " + std::to_string(micro));
    const auto split = run(micro, "split" + std::to_string(micro), "--calculate-per-token-loss");
    ASSERT_EQ(split.first.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_NEAR(split.first[i], whole.first[i], 2e-5 * whole.first[i]) << "lm loss, iteration " << i + 1;
      EXPECT_NEAR(split.second[i], whole.second[i], 2e-5 * whole.second[i]) << "grad norm, iteration " << i + 1;
    }
  }
  const auto means = run(1, "means", "");
  EXPECT_GT(std::abs(means.second[0] - whole.second[0]), 1e-3 * whole.second[0])
      << "the mean of micro-batch means is another objective: its gradient differs";
  const auto r = train(
      "--check --calculate-per-token-loss --log-noise-scale --num-layers 2 --hidden-size 64 --num-attention-heads 2 "
      "--seq-length 32 --micro-batch-size 2 "
      "--global-batch-size 4 --lr 1e-4 --train-iters 2 --data-path " +
      data("brown_gpt2_text_document"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("train: error: --log-noise-scale estimates the noise from each micro-batch's mean "
                          "gradient, which --calculate-per-token-loss weighs by its token count; drop one of them"),
            std::string::npos)
      << r.output;
}

// Megatron's --no-position-embedding: a BERT without its position table (max positions x hidden
// parameters fewer) trains; T5, whose positions are learned or relative, refuses it by name. (A
// GPT's is in test_gpt.cc's NoPositionEmbeddingsGivePyTorchsLossAndGradients.)
TEST_F(MegatronFlags, NoPositionEmbeddingDropsThePositionTable) {
  const std::string bert =
      "--model-type bert --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 48 --micro-batch-size 2 "
      "--global-batch-size 2 --train-iters 2 --lr 1e-3 --eval-iters 0 --data-path " +
      data("brown_bert_text_sentence") + " ";
  auto parameters = [](const std::string& output) {
    const size_t at = output.find("parameters:");
    return at == std::string::npos ? -1 : std::stoll(output.substr(at + 11));
  };
  auto r = train(bert + "--check --print-params");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const long long with = parameters(r.output);
  r = train(bert + "--check --print-params --no-position-embedding");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(parameters(r.output), with - 48 * 32) << r.output;
  r = train(bert + "--no-position-embedding --run-dir " + (tmp_ / "nope").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> done: iteration 2"), std::string::npos) << r.output;
  std::string t5 = bert;
  t5.replace(t5.find("bert"), 4, "t5");  // --model-type t5
  r = train(t5 + "--check --no-position-embedding");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("train: error: --no-position-embedding: megabatch's T5 has learned or relative positions"),
            std::string::npos)
      << r.output;
}

// The same in a --config file (snake_case keys, as Megatron's YAML configs have them): a switch
// set true asks for it and false for Megatron's default (nothing asked); a refused key and an
// unknown one are said in one error naming the file; the taken ones are noted with the file's key.
TEST_F(MegatronFlags, AConfigFileTakesAndRefusesThemAsTheFlagsAre) {
  const std::string common =
      "--check --num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 "
      "--lr 1e-4 --train-iters 2 --data-path " +
      data("brown_gpt2_text_document") + " --config ";
  const fs::path bad = tmp_ / "bad.json", good = tmp_ / "good.json";
  mb::testing::write_text(bad,
                          R"({"use_mcore_models": true, "fp32_residual_connection": false, "no_save_optim": true,
                                   "pipeline_model_parallel_size": 2, "hiden_size": 64})");
  auto r = train(common + bad.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  for (const std::string& line :
       {std::string("train: error: 3 of the options cannot be taken; drop or change each:\n"),
        "\n  --no-save-optim (" + bad.string() +
            ".no_save_optim) (Megatron-LM's) is not taken here: megabatch's checkpoints always hold the optimizer "
            "state",
        "\n  --pipeline-model-parallel-size 2 (" + bad.string() +
            ".pipeline_model_parallel_size) (Megatron-LM's) is not taken here: megabatch has no pipeline parallelism",
        "\n  " + bad.string() + ": unknown option 'hiden_size'; did you mean 'hidden_size'?"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  EXPECT_EQ(r.output.find("--fp32-residual-connection"), std::string::npos)
      << "fp32_residual_connection false asks for nothing\n"
      << r.output;
  mb::testing::write_text(good,
                          R"({"use_mcore_models": true, "fp32_residual_connection": false, "transformer_impl": "local",
                                    "pipeline_model_parallel_size": 1})");
  r = train(common + good.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  expect_noted(r.output, {"--use-mcore-models (" + good.string() + ".use_mcore_models)",
                          "--transformer-impl local (" + good.string() + ".transformer_impl)",
                          "--pipeline-model-parallel-size 1 (" + good.string() + ".pipeline_model_parallel_size)"});
}

// --attention-backend flash on the CPU runs the flash algorithm's reference (no T x T
// probabilities saved: the memory line says so) and trains as the explicit attention does, with
// dropout on: the same masks (keyed by element) on the same scores, summed in another order, so
// the f32 losses and gradient norms agree to a few f32 roundings of a sum over the 32 or 64 keys:
// within 64 * 2^-24 of their size. GPT is causal; gpt-gqa reads 4 heads' keys and values from 2
// groups (grouped-query attention, with rotary positions and q/k norms on that layout); T5 adds
// the relative position bias and cross-attention. auto keeps the explicit attention on the CPU;
// fused is refused.
TEST_F(MegatronFlags, AttentionBackendFlashTrainsOnTheCpuAsTheExplicitAttentionDoes) {
  const double tolerance = 64 * std::ldexp(1.0, -24);
  for (const std::string model : {"gpt", "gpt-gqa", "t5"}) {
    SCOPED_TRACE(model);
    const std::string args =
        model == "gpt" ? "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 --data-path " +
                             data("brown_gpt2_text_document")
        : model == "gpt-gqa"
            ? "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
              "--group-query-attention --num-query-groups 2 --position-embedding-type rope "
              "--qk-layernorm --data-path " +
                  data("brown_gpt2_text_document")
            : "--model-type t5 --num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 64 "
              "--decoder-seq-length 16 --position-embedding-type relative --data-path " +
                  data("brown_bert_text_sentence");
    auto run = [&](const std::string& backend) {
      const fs::path dir = tmp_ / (model + backend);
      const auto r = train(args + " --micro-batch-size 4 --global-batch-size 4 --train-iters 3 --lr 1e-3 "
                                  "--log-interval 1 --eval-iters 0 --attention-backend " +
                           backend + " --run-dir " + dir.string());
      EXPECT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(r.output.find(", flash attention)") != std::string::npos, backend == "flash") << r.output;
      mb::testing::H5File f((dir / "metrics.h5").string(), mb::testing::H5File::kRead);
      return std::pair{f.read<double>("train/lm_loss"), f.read<double>("train/grad_norm")};
    };
    const auto [loss, norm] = run("flash");
    const auto [explicit_loss, explicit_norm] = run("unfused");
    const auto auto_loss = run("auto").first;
    ASSERT_EQ(loss.size(), 3u);
    ASSERT_EQ(explicit_loss.size(), 3u);
    for (size_t i = 0; i < loss.size(); ++i) {
      EXPECT_NEAR(loss[i], explicit_loss[i], tolerance * explicit_loss[i]) << "iteration " << i + 1;
      EXPECT_NEAR(norm[i], explicit_norm[i], tolerance * explicit_norm[i]) << "iteration " << i + 1;
    }
    // the flash path ran: its sums in another order leave other last bits in the gradients
    EXPECT_NE(norm, explicit_norm) << "flash and unfused gave the same bits: one attention ran both";
    EXPECT_EQ(auto_loss, explicit_loss) << "auto is the explicit attention on the CPU";
  }
  const auto r = train("--check --num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 --lr 1e-4 "
                       "--train-iters 2 --attention-backend fused");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("attention_backend: 'fused' is Transformer Engine's cuDNN attention"), std::string::npos)
      << r.output;
}

// --exit-on-missing-checkpoint: a --load without a checkpoint (a mistyped path) is an error
// instead of a start from scratch; with one there, the run resumes from it.
TEST_F(MegatronFlags, ExitOnMissingCheckpointRefusesAFirstStartAndResumes) {
  const std::string common = "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 --data-path " +
                             data("brown_gpt2_text_document") +
                             " --micro-batch-size 2 --global-batch-size 2 --lr 1e-3 --lr-decay-iters 3 --eval-iters 0 --log-interval 1 "
                             "--save-interval 2 --save " +
                             (tmp_ / "ckpt").string() + " --load " + (tmp_ / "ckpt").string() + " --run-dir " +
                             (tmp_ / "run").string();
  auto r = train(common + " --train-iters 2 --exit-on-missing-checkpoint");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("train: error: --exit-on-missing-checkpoint: " + (tmp_ / "ckpt").string() +
                          " (--load) holds no checkpoint"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(tmp_ / "run" / "metrics.h5")) << "nothing trained";
  r = train(common + " --train-iters 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = train(common + " --train-iters 3 --exit-on-missing-checkpoint");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("iteration        3/       3"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("iteration        1/"), std::string::npos) << "resumed at iteration 2\n" << r.output;
}

// Megatron's TensorBoard flags as its scripts give them: --tensorboard-log-interval 3 writes the
// training series at iterations 3 and 6 of 7 (metrics.h5 keeps all seven), the validation loss
// and its perplexity at each evaluation; --log-validation-ppl-to-tensorboard and
// --tensorboard-queue-size are taken. Read back by tests/tools/read_tfevents.py, an independent
// reader, against metrics.h5 read with h5py.
TEST_F(MegatronFlags, TensorBoardTakesTheTrainingSeriesAtTheIterationsItsIntervalDivides) {
  const fs::path run = tmp_ / "run", tb = tmp_ / "tb";
  auto r = train("--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4 "
                 "--global-batch-size 4 --train-iters 7 --lr 1e-3 --log-interval 2 --eval-interval 4 --eval-iters 1 "
                 "--data-path " +
                 data("brown_gpt2_text_document") + " --run-dir " + run.string() + " --tensorboard-dir " +
                 tb.string() +
                 " --tensorboard-log-interval 3 --log-validation-ppl-to-tensorboard --tensorboard-queue-size 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string event;
  for (const auto& e : fs::directory_iterator(tb)) event = e.path().string();
  r = mb::testing::run_command(
      "/usr/bin/python3 -c \"import sys, math, h5py; sys.path.insert(0, '" + mb::testing::source_dir() +
      "/tests/tools'); import read_tfevents as r\n"
      "s = r.read('" + event + "')['scalars']\n"
      "f = h5py.File('" + (run / "metrics.h5").string() + "', 'r')\n"
      "its = [int(i) for i in f['train/iteration']]\n"
      "assert its == list(range(1, 8)), its\n"
      "loss = [x for x in s if x[0] == 'train/lm_loss']\n"
      "assert [x[1] for x in loss] == [3, 6], loss\n"
      "assert all(abs(x[2] - f['train/lm_loss'][x[1] - 1]) < 1e-5 * x[2] for x in loss), loss\n"
      "lr = [x[1] for x in s if x[0] == 'train/learning_rate']\n"
      "assert lr == [3, 6], lr\n"
      "val = [x for x in s if x[0] == 'validation/lm_loss']\n"
      "ppl = [x for x in s if x[0] == 'validation/lm_loss_ppl']\n"
      "assert [x[1] for x in val] == [int(i) for i in f['validation/iteration']] == [4, 7], val\n"
      "assert all(abs(p[2] - math.exp(v[2])) < 1e-5 * p[2] for p, v in zip(ppl, val)) and len(ppl) == 2, ppl\n"
      "print('ok')\"");
  EXPECT_EQ(r.output, "ok\n") << r.output;
}

// The device's memory at every iteration line: Megatron's memory line once, after the first
// iteration line (report_memory: MB are MiB), and memory/allocated_bytes, max_allocated_bytes and
// reserved_bytes in metrics.h5 and TensorBoard (--log-memory-to-tensorboard is taken). On the CPU
// the tensors' bytes: at least the parameters, gradients and AdamW's two moments (16 bytes a
// parameter, from the model line's count) and at most the process's peak resident set (the
// kernel's ru_maxrss of the train process); reserved equals allocated (no cache).
TEST_F(MegatronFlags, MemoryIsReportedAsMegatronDoesAndWrittenAtEveryIterationLine) {
  const fs::path run = tmp_ / "run", tb = tmp_ / "tb";
  const auto r = mb::testing::run_command(
      "/usr/bin/python3 -c \"import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
      "print('maxrss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)\" " +
      mb::testing::bin_dir() +
      "/train --num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 --micro-batch-size 4 "
      "--global-batch-size 8 --train-iters 3 --lr 1e-3 --log-interval 1 --eval-iters 0 --data-path " +
      data("brown_gpt2_text_document") + " --run-dir " + run.string() + " --tensorboard-dir " + tb.string() +
      " --log-memory-to-tensorboard " + mb::testing::threads_flag());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_noted(r.output, {"--log-memory-to-tensorboard"});
  const std::regex line(
      R"(\n\[Rank 0\] \(after 1 iterations\) memory \(MB\) \| allocated: ([0-9.]+) \| max allocated: ([0-9.]+) \| )"
      R"(reserved: ([0-9.]+) \| max reserved: ([0-9.]+)\n)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, line)) << r.output;
  EXPECT_EQ(r.output.find("memory (MB)", static_cast<size_t>(m.position(0) + m.length(0))), std::string::npos)
      << "said once\n"
      << r.output;
  std::smatch params, rss;
  ASSERT_TRUE(std::regex_search(r.output, params, std::regex(R"(, ([0-9]+) parameters)"))) << r.output;
  ASSERT_TRUE(std::regex_search(r.output, rss, std::regex(R"(maxrss_kib ([0-9]+))"))) << r.output;
  std::string event;
  for (const auto& e : fs::directory_iterator(tb)) event = e.path().string();
  const auto check = mb::testing::run_command(
      "/usr/bin/python3 -c \"import sys, h5py; sys.path.insert(0, '" + mb::testing::source_dir() +
      "/tests/tools'); import read_tfevents as r\n"
      "f = h5py.File('" +
      (run / "metrics.h5").string() +
      "', 'r')\n"
      "it = [int(i) for i in f['memory/iteration']]\n"
      "assert it == [1, 2, 3], it\n"
      "a, mx, res, mres = (list(f['memory/' + n + '_bytes']) for n in ('allocated', 'max_allocated', 'reserved', "
      "'max_reserved'))\n"
      "assert all(x <= y for x, y in zip(a, mx)) and mx == sorted(mx), (a, mx)\n"
      "assert res == a and mres == mx, (res, a, mres, mx)\n"
      "line = [" +
      m[1].str() + ", " + m[2].str() + ", " + m[3].str() + ", " + m[4].str() +
      "]\n"
      "first = [a[0], mx[0], res[0], mres[0]]\n"
      "assert all(abs(x - y / 2**20) <= 0.051 for x, y in zip(line, first)), (line, first)\n"
      "assert mx[-1] >= 16 * " +
      params[1].str() + ", (mx, " + params[1].str() +
      ")\n"
      "assert mx[-1] <= " +
      rss[1].str() + " * 1024, (mx, " + rss[1].str() +
      ")\n"
      "s = r.read('" +
      event +
      "')['scalars']\n"
      "tb = [(x[1], x[2]) for x in s if x[0] == 'memory/max_allocated_bytes']\n"
      "assert tb == list(zip(it, mx)), (tb, mx)\n"
      "print('ok')\"");
  EXPECT_EQ(check.output, "ok\n") << check.output << r.output;
}

// Megatron's untied output layer: checkpointed as output_layer.weight beside the word
// embeddings, and, as Megatron's embedding-or-output tensor, stepped at --decoupled-lr. At
// --decoupled-lr 0 both tables stay at their initialization, bit for bit those of a run at
// --lr 0 (where nothing moves), while the rest of the model trains. A tied run's checkpoint,
// which has no output layer, is refused by an untied run.
TEST_F(MegatronFlags, AnUntiedOutputLayerIsCheckpointedByItsNameAndStepsAtTheDecoupledLr) {
  auto run = [&](const std::string& name, const std::string& args) {
    const auto r = train("--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 --data-path " +
                         data("brown_gpt2_text_document") +
                         " --micro-batch-size 2 --global-batch-size 2 --train-iters 2 --eval-iters 0 --weight-decay 0 "
                         "--save-interval 2 --save " +
                         (tmp_ / name).string() + " --run-dir " + (tmp_ / (name + "-run")).string() + " " + args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  const std::string untie = "--untie-embeddings-and-output-weights ";
  EXPECT_NE(
      run("frozen", untie + "--lr 0").find("; an output layer of its own (--untie-embeddings-and-output-weights)"),
      std::string::npos);
  run("decoupled", untie + "--lr 1e-3 --decoupled-lr 0");
  mb::testing::H5File frozen((tmp_ / "frozen" / "iter_0000002.h5").string(), mb::testing::H5File::kRead);
  mb::testing::H5File decoupled((tmp_ / "decoupled" / "iter_0000002.h5").string(), mb::testing::H5File::kRead);
  for (const std::string table : {"output_layer.weight", "embedding.word_embeddings.weight"})
    EXPECT_EQ(decoupled.read<float>("params/" + table), frozen.read<float>("params/" + table)) << table;
  EXPECT_NE(decoupled.read<float>("params/decoder.layers.0.mlp.linear_fc1.weight"),
            frozen.read<float>("params/decoder.layers.0.mlp.linear_fc1.weight"))
      << "the rest of the model trained";
  run("tied", "--lr 1e-3");
  const auto r =
      train("--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 --data-path " +
            data("brown_gpt2_text_document") + " --micro-batch-size 2 --global-batch-size 2 --train-iters 3 " +
            "--lr-decay-iters 2 --eval-iters 0 --weight-decay 0 --lr 1e-3 " + untie + "--load " +
            (tmp_ / "tied").string() + " --run-dir " + (tmp_ / "untied-run").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("iter_0000002.h5: this model has parameter 'output_layer.weight' that the checkpoint lacks"),
            std::string::npos)
      << r.output;
}
