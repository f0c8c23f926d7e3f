// `train`'s options end to end: Megatron flags and JSON configs with precise errors (the
// nearest valid name, the model family a flag belongs to, ranges, UTF-8), --check refusing what
// the run would, a config file with flags over it, --print-params and --help.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "tests/e2e/train_fixture.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
namespace fs = std::filesystem;
using mb::testing::kSmall;
using mb::testing::Train;

TEST_F(Train, BadOptionsNameTheFlagOrJsonPathAndTheNearestValidName) {
  // train given kSmall, 2 iterations at lr 1e-3 and `args`: exit 1, its output saying `message`
  auto refused = [&](const std::string& args, const std::string& message) {
    const auto run = mb::testing::run_command(train(kSmall + "--train-iters 2 --lr 1e-3 " + args));
    EXPECT_EQ(run.exit_code, 1) << args;
    EXPECT_NE(run.output.find(message), std::string::npos) << run.output;
  };
  refused("--hiden-size 64", "unknown option --hiden-size; did you mean '--hidden-size'?");
  auto r = mb::testing::run_command(train(kSmall + "--train-iters two --lr 1e-3"));
  EXPECT_NE(r.output.find("--train-iters: expected an integer, got 'two'"), std::string::npos) << r.output;
  mb::testing::write_text(tmp_ / "c.json", R"({"num_layers": 2, "lr": "fast", "train_iters": 3})");
  r = mb::testing::run_command(train("--config " + (tmp_ / "c.json").string()));
  EXPECT_NE(r.output.find((tmp_ / "c.json").string() + ".lr: expected a number, got \"fast\""), std::string::npos) << r.output;
  mb::testing::write_text(tmp_ / "d.json", R"({"global_batch": 8})");
  r = mb::testing::run_command(train("--config " + (tmp_ / "d.json").string()));
  EXPECT_NE(r.output.find("unknown option 'global_batch'; did you mean 'global_batch_size'?"), std::string::npos) << r.output;
  r = mb::testing::run_command(train(kSmall + "--train-iters 2 --lr 1e-3 --optimizer sgd --adam-beta1 0.8"));
  EXPECT_NE(r.output.find("adam_beta1 was given but optimizer plugin 'sgd' has no hyperparameter 'beta1'"), std::string::npos) << r.output;
  r = mb::testing::run_command(train(kSmall + "--train-iters 2 --lr 1e-3 --micro-batch-size 3 --global-batch-size 8"));
  EXPECT_NE(r.output.find("global_batch_size (8) must be a multiple of micro_batch_size (3)"), std::string::npos) << r.output;
  // a model without a preset and a size: the missing one named as its flag
  r = mb::testing::run_command(train("--train-iters 2 --lr 1e-3 --num-layers 2 --num-attention-heads 2"));
  EXPECT_NE(r.output.find("(missing --hidden-size)"), std::string::npos) << r.output;
  r = mb::testing::run_command(
      train(kSmall + "--train-iters 2 --lr 1e-3 --init-method-xavier-uniform --init-method-std 0.01"));
  EXPECT_NE(r.output.find("--init-method-std 0.01 is the normal initialization's, which --init-method-xavier-uniform "
                          "replaces, so it would be ignored; give one of them"),
            std::string::npos)
      << r.output;
  refused("--noise-scale-window 512",
          "--noise-scale-window averages the gradient noise scale, which only --log-noise-scale estimates");
  refused("--log-noise-scale --noise-scale-ema 0.9 --noise-scale-window 512",
          "--noise-scale-ema (a decay a step) and --noise-scale-window (a window in samples) are both set");
  // checkpoint options without the directory they act on: refused, where a run that meant to
  // checkpoint wrote nothing; --finetune from a directory with no checkpoint: refused, where
  // it trained from scratch
  refused("--save-interval 1", "train: error: --save-interval 1 writes checkpoints into --save, which is not given");
  refused("--no-load-optim", "train: error: --no-load-optim says how to load from --load, which is not given");
  fs::create_directories(tmp_ / "empty");
  r = mb::testing::run_command(train(kSmall + "--train-iters 2 --lr 1e-3 --finetune --run-dir " +
                                     (tmp_ / "ft").string() + " --load " + (tmp_ / "empty").string()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("train: error: --finetune: " + (tmp_ / "empty").string() +
                          " holds no checkpoint to fine-tune from"),
            std::string::npos)
      << r.output;
  // a warmup of the other count: refused, where it was dropped (no warmup at all)
  refused("--lr-warmup-samples 64",
          "train: error: --lr-warmup-samples counts samples, but this run counts iterations "
          "(--train-iters), which would ignore it; give --lr-warmup-fraction");
  // two sizes of a validation run: refused, where --eval-samples won unseen (0 batches stays
  // allowed: it says nothing)
  refused("--eval-iters 10 --eval-samples 16",
          "train: error: --eval-iters 10 and --eval-samples 16 both size a validation run");
  r = mb::testing::run_command(mb::testing::bin_dir() + "/train " + kSmall + "--train-iters 2 --lr 1e-3 --data-path " + (tmp_ / "nope").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find((tmp_ / "nope").string()), std::string::npos) << r.output;
}

// Options of one model family given to another, which ignored them (a GPT with
// --post-layernorm trained pre-LN; --encoder-num-layers beside --num-layers won unseen).
TEST_F(Train, OptionsOfAnotherModelFamilyAreRefusedNamingTheFamily) {
  const std::string common = "--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 48 --train-iters 1 "
                             "--lr 1e-3 --eval-iters 0 --check --run-dir " + (tmp_ / "run").string() + " ";
  auto check = [&](const std::string& args) {
    const bool gpt = args.find("--model-type") == std::string::npos;
    const fs::path data = brown() / (gpt ? "brown_gpt2_text_document" : "brown_bert_text_sentence");
    return mb::testing::run_command(mb::testing::bin_dir() + "/train " + common + args + " --data-path " +
                                    data.string());
  };
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--decoder-seq-length 16", "--decoder-seq-length is T5's, and this model is gpt, which would ignore it"},
           {"--encoder-num-layers 3",
            "--encoder-num-layers is T5's, and this model is gpt, which would ignore it; drop it (a gpt's layers and "
            "length are --num-layers and --seq-length)"},
           {"--post-layernorm", "--post-layernorm is BERT's, and this model is gpt, which would ignore it; drop it"},
           {"--mask-prob 0.3",
            "--mask-prob sets how BERT's and T5's samples are made, and a GPT's are windows of the documents with "
            "nothing masked, so it would be ignored; drop it"},
           {"--short-seq-prob 0", "--short-seq-prob sets how BERT's and T5's samples are made"},
           {"--model-type t5 --bert-masking whole-word",
            "--bert-masking is BERT's, and this model is t5, which would ignore it; drop it (T5's is --t5-masking)"},
           {"--t5-masking whole-word", "--t5-masking is T5's, and this model is gpt, which would ignore it; drop it"},
           {"--model-type bert --t5-masking span",
            "--t5-masking is T5's, and this model is bert, which would ignore it; drop it (BERT's is --bert-masking)"},
           {"--model-type t5 --t5-masking whole", "t5_masking: 'whole' is not span or whole-word"},
           {"--model-type bert --vocab-extra-ids 5", "--vocab-extra-ids is T5's, and this model is bert"},
           {"--model-type t5 --bert-no-binary-head", "--bert-no-binary-head is BERT's, and this model is t5"},
           {"--model-type bert --eod-mask-loss",
            "--eod-mask-loss is GPT's, and this model is bert, which would ignore it"},
           {"--model-type t5 --relative-attention-num-buckets 8",
            "--relative-attention-num-buckets sets T5's relative position buckets, which this run does not use (its "
            "positions are learned absolute embeddings); add --position-embedding-type relative, or drop it"},
           {"--model-type t5 --encoder-num-layers 2",
            "--num-layers and --encoder-num-layers both set the encoder's layers (1 and 2); give one"},
       }) {
    const auto r = check(args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("train: error: " + message), std::string::npos) << args << "\n" << r.output;
  }
  // each where it belongs; a false flag of another family is the default, and allowed
  for (const std::string args : {"--model-type bert --post-layernorm --bert-no-binary-head --mask-prob 0.3 "
                                 "--bert-masking whole-word",
                                 "--model-type t5 --decoder-seq-length 16 --short-seq-prob 0.5 --t5-masking whole-word",
                                 "--model-type t5 --decoder-seq-length 16 --position-embedding-type relative "
                                 "--relative-attention-num-buckets 8",
                                 "--post-layernorm=false", "--eod-mask-loss"}) {
    const auto r = check(args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("> warning: T5 samples"), std::string::npos) << args << "\n" << r.output;
  }
  // T5's spans at --mask-prob 0.5 fill a decoder of 16 long before the encoder's 48: said
  const auto r = check("--model-type t5 --decoder-seq-length 16 --mask-prob 0.5");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> warning: T5 samples at --mask-prob 0.5 take at most "), std::string::npos) << r.output;
}

// A plugin hyperparameter given both by Megatron's flag (--weight-decay, --adam-beta1, ...) and
// in optimizer_params is refused naming both: optimizer_params won without a word, so a flag
// on the command line over a config file's optimizer_params, or a sweep's axis over
// weight_decay beside a base optimizer_params.weight_decay, changed nothing. Either alone works.
TEST_F(Train, AHyperparameterGivenByItsFlagAndInOptimizerParamsIsRefused) {
  const std::string common = kSmall + "--train-iters 1 --lr 1e-3 --eval-iters 0 --check --optimizer lamb --run-dir " +
                             (tmp_ / "run").string() + " ";
  auto r = mb::testing::run_command(train(common + "--adam-beta1 0.95 --optimizer-params beta1=0.8"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("train: error: the plugin's beta1 is given twice: adam_beta1 (--adam-beta1) 0.95 and "
                          "optimizer_params.beta1 (--optimizer-params beta1=...) 0.8; give it in one place"),
            std::string::npos)
      << r.output;
  mb::testing::write_text(tmp_ / "c.json", R"({"optimizer_params": {"weight_decay": 0.0}})");
  r = mb::testing::run_command(train(common + "--config " + (tmp_ / "c.json").string() + " --weight-decay 0.1"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the plugin's weight_decay is given twice: weight_decay (--weight-decay) 0.1 and "
                          "optimizer_params.weight_decay (--optimizer-params weight_decay=...) 0.0"),
            std::string::npos)
      << r.output;
  for (const std::string alone : {"--weight-decay 0.1", "--optimizer-params weight_decay=0.1",
                                  "--adam-beta1 0.95 --optimizer-params nvlamb=true"}) {
    r = mb::testing::run_command(train(common + alone));
    EXPECT_EQ(r.exit_code, 0) << alone << "\n" << r.output;
  }
}

// Every number is checked, on the command line and in config files: ranges, finiteness,
// integers that are integers and fit, UTF-8 text; each error names the flag or JSON path.
TEST_F(Train, NumbersAreRangeCheckedAndTextIsUtf8) {
  const std::string base = kSmall + "--train-iters 2 --lr 1e-3 ";
  const std::vector<std::pair<std::string, std::string>> flags = {
      {"--make-vocab-size-divisible-by 0", "--make-vocab-size-divisible-by: 0 is out of range: make_vocab_size_divisible_by must be >= 1"},
      {"--lr -1", "--lr: -1.0 is out of range: lr must be >= 0"},
      {"--lr nan", "--lr: nan is not a finite number"},
      {"--lr inf", "--lr: inf is not a finite number"},
      {"--clip-grad nan", "--clip-grad: nan is not a finite number"},
      {"--clip-grad -1", "--clip-grad: -1.0 is out of range: clip_grad must be >= 0"},
      {"--min-lr -1e-3", "min_lr must be >= 0"},
      {"--seed -5", "--seed: -5 is out of range: seed must be >= 0"},
      {"--seed 99999999999999999999", "--seed: expected an integer, got '99999999999999999999' (too large for a 64-bit integer)"},
      // the whole text is the number: no trailing text, no fraction for an integer, no spaces
      {"--lr 1e-3x", "--lr: expected a number, got '1e-3x' (trailing text 'x')"},
      {"--seed 12abc", "--seed: expected an integer, got '12abc' (trailing text 'abc')"},
      {"--seed 1.5", "--seed: expected an integer, got '1.5' (not a whole number)"},
      {"--lr ' 0.1'", "--lr: expected a number, got ' 0.1' (not a number)"},
      {"--lr 0x10", "--lr: expected a number, got '0x10' (trailing text 'x10')"},
      {"--lr 1e999", "--lr: expected a number, got '1e999' (out of the range of a double)"},
      {"--threads -1", "threads must be >= 0"},
      {"--threads 100000", "--threads: 100000 is more than the "},  // a segmentation fault before
      {"--log-interval 0", "log_interval must be >= 1"},
      {"--lr-warmup-iters -3", "lr_warmup_iters must be >= 0"},
      {"--lr-decay-iters 0", "lr_decay_iters must be >= 1"},
      {"--ffn-hidden-size 0", "ffn_hidden_size must be >= 1"},
      {"--hidden-dropout 1", "hidden_dropout must be in [0, 1)"},
      {"--noise-scale-window 0", "noise_scale_window must be >= 1"},
      {"--adam-eps 0", "adam_eps must be > 0"},
      {"--lr-warmup-fraction 1.5", "lr_warmup_fraction must be in [0, 1]"},
      {"--initial-loss-scale 0", "initial_loss_scale must be > 0"},
      {"--tensor-model-parallel-size 0", "tensor_model_parallel_size must be >= 1"},
  };
  for (const auto& [flag, message] : flags) {
    const auto r = mb::testing::run_command(train(base + flag));
    EXPECT_EQ(r.exit_code, 1) << flag << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << flag << "\n" << r.output;
    EXPECT_NE(r.output.find("train: error: " + flag.substr(0, flag.find(' ')) + ": "), std::string::npos)
        << "the flag is named: " << r.output;
  }
  const std::vector<std::pair<std::string, std::string>> files = {
      {R"({"num_layers": 2.0})", ".num_layers: expected an integer, got 2.0 (an integer option takes a whole number"},
      {R"({"num_layers": 1e30})", ".num_layers: expected an integer, got 1e+30"},
      {R"({"seed": 18446744073709551615})", ".seed: 18446744073709551615 is too large for an integer option"},
      {R"({"lr": -0.5})", ".lr: -0.5 is out of range: lr must be >= 0"},
      {R"({"weight_decay": -1})", ".weight_decay: -1 is out of range: weight_decay must be >= 0"},
      {"{\"run_dir\": \"a\xff\"}", "c.json: not valid JSON (parse error at line 1, column 15"},
      // a number beyond a double's range: nlohmann's out_of_range, not its parse_error
      {R"({"lr": 1e999})", "c.json: not valid JSON (number overflow parsing '1e999')"},
      // a key twice: refused, where the second value silently won
      {R"({"lr": 0.1, "seed": 3, "lr": 0.2})", "c.json: not valid JSON (the key \"lr\" appears twice in one object; give each key once)"},
      {R"({"optimizer_params": {"beta1": 0.9, "beta1": 0.8}})", "c.json: not valid JSON (the key \"beta1\" appears twice in one object"},
      // nested past any configuration (a stack overflow before): refused at parse time
      {"{\"optimizer_params\": " + std::string(100000, '[') + std::string(100000, ']') + "}",
       "c.json: not valid JSON (nested deeper than 64 levels)"},
  };
  for (const auto& [text, message] : files) {
    mb::testing::write_text(tmp_ / "c.json", text);
    const auto r = mb::testing::run_command(train(base + "--config " + (tmp_ / "c.json").string()));
    EXPECT_EQ(r.exit_code, 1) << text << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << text << "\n" << r.output;
  }
  // --split: each proportion a finite number, all of its text (spaces around it allowed, as
  // Megatron's float() allows them)
  for (const auto& [split, message] : std::vector<std::pair<std::string, std::string>>{
           {"969,30,1x", "split: '969,30,1x': '1x' is not a proportion (trailing text 'x')"},
           {"inf,1,1", "split: 'inf,1,1': 'inf' is not a proportion (not finite)"},
           {"98,,2", "split: '98,,2': '' is not a proportion (empty)"}}) {
    const auto r = mb::testing::run_command(train(base + "--split '" + split + "'"));
    EXPECT_EQ(r.exit_code, 1) << split << "\n" << r.output;
    EXPECT_NE(r.output.find("train: error: " + message), std::string::npos) << split << "\n" << r.output;
  }
  const auto spaced = mb::testing::run_command(train(base + "--eval-iters 1 --split ' 98, 1 ,1 ' --run-dir " + (tmp_ / "split").string()));
  EXPECT_EQ(spaced.exit_code, 0) << "spaces around the numbers: " << spaced.output;
  const auto r = mb::testing::run_command(train(base + "--run-dir $(printf '/tmp/a\\377b')"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--run-dir: the value is not valid UTF-8 (byte 6 of"), std::string::npos) << r.output;
}

// What a run refuses at its start, train --check (and so sweep run --dry-run) refuses too, and
// the run refuses it before it writes its run directory: an evaluation asked of an empty
// validation split, and the noise scale of a global batch of one micro-batch (both passed
// --check; the second was refused only once the run had written config.json and metrics.h5).
TEST_F(Train, CheckRefusesWhatTheRunWouldAtItsStart) {
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--split 100,0,0 --eval-iters 2", "--eval-iters asks for validation, but the validation split"},
           {"--log-noise-scale --micro-batch-size 4 --global-batch-size 4",
            "--log-noise-scale compares micro-batch and global-batch gradients, so a global batch needs at least 2 "
            "micro-batches (global batch 4, micro batch 4); lower --micro-batch-size"}}) {
    for (const std::string check : {" --check", ""}) {
      const fs::path run = tmp_ / "run";
      const auto r = mb::testing::run_command(
          train(kSmall + "--train-iters 1 --lr 1e-3 " + args + check + " --run-dir " + run.string()));
      EXPECT_EQ(r.exit_code, 1) << args << check << "\n" << r.output;
      EXPECT_NE(r.output.find("train: error: " + message), std::string::npos) << args << check << "\n" << r.output;
      EXPECT_FALSE(fs::exists(run / "config.json")) << args << check << ": refused before the run directory";
    }
  }
}

TEST_F(Train, ConfigFileWithFlagOverridesRunsAndWritesMetrics) {
  mb::testing::write_text(tmp_ / "run.json", R"({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
    "seq_length": 32, "micro_batch_size": 4, "global_batch_size": 8, "train_iters": 99, "lr": 3e-3,
    "lr_warmup_iters": 2, "lr_decay_style": "cosine", "log_interval": 4, "eval_interval": 4, "eval_iters": 1,
    "threads": )" + std::to_string(mb::testing::test_threads()) + R"(, "optimizer_params": {"beta2": 0.95}})");
  const fs::path run = tmp_ / "run";
  const auto r = mb::testing::run_command(train("--config " + (tmp_ / "run.json").string() + " --train-iters 8 --run-dir " + run.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Megatron's iteration line: fields in Megatron's order
  const std::regex line(R"(\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration +8/ +8 \| consumed samples: +64 \| elapsed time per iteration \(ms\): [\d.]+ \| throughput \(tokens/s\): \d+ \| learning rate: [\d.]+E[-+]\d+ \| global batch size: +8 \| lm loss: [\d.]+E[-+]\d+ \| loss scale: 1\.0 \| grad norm: [\d.]+ \| number of skipped iterations: +0 \| number of nan iterations: +0 \|)");
  EXPECT_TRUE(std::regex_search(r.output, line)) << r.output;
  EXPECT_NE(r.output.find("validation loss at iteration 4 | lm loss value: "), std::string::npos) << r.output;
  const auto py = mb::testing::run_command(
      "/usr/bin/python3 -c \"import h5py, json; f = h5py.File('" + (run / "metrics.h5").string() + "', 'r'); "
      "l = f['train/lm_loss'][()]; lr = f['train/learning_rate'][()]; "
      "print(len(l), f.attrs['train_iters'], f.attrs['optimizer'], json.loads(f.attrs['config'])['optimizer_params']['beta2'], "
      "len(f['validation/lm_loss'][()]), lr[0], lr[1] > lr[7], l[-1] < l[0])\"");
  ASSERT_EQ(py.exit_code, 0) << py.output;
  // 8 rows, flag beat the file, plugin param resolved, 2 validations (iteration 4 and the final), warmup from 0, cosine decay, learning
  EXPECT_EQ(py.output, "8 8 adamw 0.95 2 0.0 True True\n");
  const std::string cfg = mb::read_file(run / "config.json");
  EXPECT_NE(cfg.find("\"padded_vocab_size\": 50304"), std::string::npos) << cfg;
}

TEST_F(Train, PrintParamsNeedsNoDataAndHelpShowsExamples) {
  auto r = mb::testing::run_command(mb::testing::bin_dir() + "/train --model gpt-310.1b --tensor-model-parallel-size 8 --print-params");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("parameters:"), std::string::npos);
  EXPECT_NE(r.output.find("(310."), std::string::npos) << r.output;  // Megatron's table: 310.1B
  r = mb::testing::run_command(mb::testing::bin_dir() + "/train --help");
  EXPECT_NE(r.output.find("--micro-batch-size"), std::string::npos);
  EXPECT_NE(r.output.find("examples:"), std::string::npos);
}
