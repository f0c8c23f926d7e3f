// `train` end to end: Megatron flags and JSON configs with precise errors, the console
// line, metrics.h5 written and readable by h5py, and the loss going down on Brown.
#include <cblas.h>
#include <gtest/gtest.h>
#include <strings.h>
#include <sys/stat.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>

#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
namespace fs = std::filesystem;

namespace {
const std::string kSmall =
    "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 " + mb::testing::threads_flag();

class Train : public ::testing::Test {
 protected:
  // the default datasets (read only: a test writes what it makes under tmp_)
  static const fs::path& brown() { return mb::testing::brown_data(); }
  static std::string train(const std::string& args) {
    return mb::testing::bin_dir() + "/train --data-path " + (brown() / "brown_gpt2_text_document").string() +
           " " + args;
  }
  // Another GPT-2 corpus of 120 short documents, made under tmp_; its prefix.
  std::string ferry_corpus() {
    std::string text;
    for (int i = 0; i < 120; ++i)
      text += "In " + std::to_string(1800 + i) + " the ferry at mile " + std::to_string(7 * i % 53) + " carried " +
              std::to_string(13 * i % 97) + " carts across, and the keeper wrote each one down twice.\n\n";
    mb::testing::write_text(tmp_ / "b.txt", text);
    const auto r = mb::testing::run_command(mb::testing::bin_dir() + "/preprocess --input " +
                                            (tmp_ / "b.txt").string() + " --output-prefix " + (tmp_ / "b").string() +
                                            " --tokenizer-type GPT2BPETokenizer --append-eod");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return (tmp_ / "b").string() + "_text_document";
  }
  // One iteration of a small GPT on the ferry corpus (its documents several to a sample), no
  // dropout: a command to add flags and --run-dir to.
  std::string short_documents_gpt() {
    return mb::testing::bin_dir() + "/train " + kSmall +
           "--micro-batch-size 2 --global-batch-size 2 --train-iters 1 --lr 1e-3 --eval-iters 0 "
           "--hidden-dropout 0 --attention-dropout 0 --data-path " +
           ferry_corpus() + " ";
  }
  // The first iteration line's lm loss as printed ("none" where there is none).
  static std::string first_loss(const std::string& output) {
    const size_t at = output.find(" lm loss: ");
    return at == std::string::npos ? std::string("none") : output.substr(at + 10, 12);
  }
  mb::testing::TempDir tmp_;
};
}  // namespace

TEST_F(Train, BadOptionsNameTheFlagOrJsonPathAndTheNearestValidName) {
  auto r = mb::testing::run_command(train(kSmall + "--train-iters 2 --lr 1e-3 --hiden-size 64"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("unknown option --hiden-size; did you mean '--hidden-size'?"), std::string::npos) << r.output;
  r = mb::testing::run_command(train(kSmall + "--train-iters two --lr 1e-3"));
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
  r = mb::testing::run_command(train(kSmall + "--train-iters 2 --lr 1e-3 --noise-scale-window 512"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--noise-scale-window averages the gradient noise scale, which only --log-noise-scale estimates"),
            std::string::npos) << r.output;
  r = mb::testing::run_command(
      train(kSmall + "--train-iters 2 --lr 1e-3 --log-noise-scale --noise-scale-ema 0.9 --noise-scale-window 512"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--noise-scale-ema (a decay a step) and --noise-scale-window (a window in samples) are both set"),
            std::string::npos) << r.output;
  // checkpoint options without the directory they act on: refused, where a run that meant to
  // checkpoint wrote nothing; --finetune from a directory with no checkpoint: refused, where
  // it trained from scratch
  r = mb::testing::run_command(train(kSmall + "--train-iters 2 --lr 1e-3 --save-interval 1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("train: error: --save-interval 1 writes checkpoints into --save, which is not given"),
            std::string::npos)
      << r.output;
  r = mb::testing::run_command(train(kSmall + "--train-iters 2 --lr 1e-3 --no-load-optim"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("train: error: --no-load-optim says how to load from --load, which is not given"),
            std::string::npos)
      << r.output;
  fs::create_directories(tmp_ / "empty");
  r = mb::testing::run_command(train(kSmall + "--train-iters 2 --lr 1e-3 --finetune --run-dir " +
                                     (tmp_ / "ft").string() + " --load " + (tmp_ / "empty").string()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("train: error: --finetune: " + (tmp_ / "empty").string() +
                          " holds no checkpoint to fine-tune from"),
            std::string::npos)
      << r.output;
  // a warmup of the other count: refused, where it was dropped (no warmup at all)
  r = mb::testing::run_command(train(kSmall + "--train-iters 2 --lr 1e-3 --lr-warmup-samples 64"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("train: error: --lr-warmup-samples counts samples, but this run counts iterations "
                          "(--train-iters), which would ignore it; give --lr-warmup-fraction"),
            std::string::npos)
      << r.output;
  // two sizes of a validation run: refused, where --eval-samples won unseen (0 batches stays
  // allowed: it says nothing)
  r = mb::testing::run_command(train(kSmall + "--train-iters 2 --lr 1e-3 --eval-iters 10 --eval-samples 16"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("train: error: --eval-iters 10 and --eval-samples 16 both size a validation run"),
            std::string::npos)
      << r.output;
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

// A FIFO (or a device) where a dataset file should be is refused at once instead of blocking.
// Evaluation on an empty validation split: with the default --eval-iters a warning (the run
// trains, and says no validation loss will be logged), asked for by name an error; before, the
// run never evaluated and said nothing.
TEST_F(Train, EvaluationOnAnEmptyValidationSplitIsSaid) {
  const std::string data = (brown() / "brown_gpt2_text_document").string();
  auto r = mb::testing::run_command(train(kSmall + "--train-iters 1 --lr 1e-3 --split 100,0,0 --run-dir " + (tmp_ / "a").string()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> warning: no validation loss will be logged: the validation split of --split '100,0,0' holds "
                          "no document of " + data + "'s 500 (--eval-iters 0 says there is none to take)"),
            std::string::npos) << r.output;
  for (const std::string asked : {"--eval-iters 5", "--eval-samples 16"}) {
    r = mb::testing::run_command(train(kSmall + "--train-iters 1 --lr 1e-3 --micro-batch-size 8 --split 100,0,0 " + asked +
                                       " --run-dir " + (tmp_ / "b").string()));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("train: error: " + asked.substr(0, asked.find(' ')) + " asks for validation, but the validation "
                            "split of --split '100,0,0' holds no document of " + data + "'s 500; give the validation split "
                            "a share (e.g. --split 969,30,1), or drop " + asked.substr(0, asked.find(' '))),
              std::string::npos) << r.output;
  }
  r = mb::testing::run_command(train(kSmall + "--train-iters 1 --lr 1e-3 --split 100,0,0 --eval-iters 0 --run-dir " +
                                     (tmp_ / "c").string()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("warning"), std::string::npos) << "no evaluation asked for, nothing to say: " << r.output;
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

// A GPT dataset made without --append-eod runs its documents together with no token between:
// the run (and train --check, so sweep run --dry-run) says so and trains; one made with it,
// or a BERT's sentences, says nothing. Before, such a dataset trained without a word.
TEST_F(Train, AGptDatasetWithoutEndOfDocumentTokensIsSaid) {
  std::string text;
  for (int i = 0; i < 40; ++i)
    text += "Letter " + std::to_string(i) + " of the harbour log. The tide came in at " + std::to_string(i % 12 + 1) +
            " and the boats went out.\n\n";
  mb::testing::write_text(tmp_ / "log.txt", text);
  const std::string eod_text =
      "end-of-document token (50256, <|endoftext|>), so GPT samples run from one document "
      "into the next with no token between them; make the dataset with preprocess --append-eod";
  for (const bool eod : {false, true}) {
    const fs::path prefix = tmp_ / (eod ? "with" : "without");
    auto r = mb::testing::run_command(mb::testing::bin_dir() + "/preprocess --input " + (tmp_ / "log.txt").string() +
                                      " --output-prefix " + prefix.string() + " --tokenizer-type GPT2BPETokenizer" +
                                      (eod ? " --append-eod" : ""));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string data = prefix.string() + "_text_document";
    r = mb::testing::run_command(mb::testing::bin_dir() + "/preprocess inspect " + data +
                                 " --tokenizer-type GPT2BPETokenizer --documents 0");
    EXPECT_NE(r.output.find(std::string("end of doc   ") + (eod ? "40" : "0") +
                            " of 40 documents end in <|endoftext|> (50256)"),
              std::string::npos)
        << r.output;
    for (const char* check : {" --check", ""}) {
      r = mb::testing::run_command(mb::testing::bin_dir() + "/train " + kSmall +
                                   "--train-iters 1 --lr 1e-3 --micro-batch-size 2 --eval-iters 0 --split 100,0,0 "
                                   "--data-path " +
                                   data + check + " --run-dir " + (tmp_ / "run").string());
      EXPECT_EQ(r.exit_code, 0) << r.output;
      const std::string said =
          "> warning: " + data + ": none of the 40 training documents looked at ends in the " + eod_text;
      EXPECT_EQ(r.output.find(said) != std::string::npos, !eod) << "--append-eod " << eod << check << "\n" << r.output;
      EXPECT_EQ(r.output.find("warning"), eod ? std::string::npos : r.output.find(said) + 2) << r.output;
      fs::remove_all(tmp_ / "run");
    }
  }
  const auto r = mb::testing::run_command(mb::testing::bin_dir() + "/train " + kSmall +
                                          "--model-type bert --train-iters 1 --lr 1e-3 --micro-batch-size 2 "
                                          "--eval-iters 0 --check --data-path " +
                                          (brown() / "brown_bert_text_sentence").string() + " --run-dir " +
                                          (tmp_ / "bert").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("warning"), std::string::npos) << "BERT's sentences end in no EOD: " << r.output;
}

// The dataset cut short in place while the run reads it (truncate, or a copy over it): an
// error naming the .bin, exit 1, where the run died of SIGBUS. The run is long by its
// configuration; the cut comes once it has logged an iteration.
TEST_F(Train, ADatasetCutShortUnderTheRunIsAnErrorNamingIt) {
  const fs::path copy = tmp_ / "copy_text_document";
  for (const char* ext : {".bin", ".idx"})
    fs::copy_file((brown() / "brown_gpt2_text_document").string() + ext, copy.string() + ext);
  const std::string log = (tmp_ / "log").string();
  const auto r = mb::testing::run_command(
      mb::testing::bin_dir() + "/train " + kSmall + "--train-iters 1000000 --lr 1e-3 --log-interval 1 --eval-iters 0 "
      "--data-path " + copy.string() + " --run-dir " + (tmp_ / "run").string() + " > " + log + " 2>&1 & pid=$!; " +
      mb::testing::wait_for_line(log, "iteration  *1/", 300, "$pid") + "truncate -s 4096 " + copy.string() + ".bin; wait $pid; echo exit=$?");
  const std::string out = mb::testing::read_text(log);
  EXPECT_NE(r.output.find("exit=1"), std::string::npos) << "an error, not a signal (135 was SIGBUS): " << r.output << out;
  EXPECT_NE(out.find("train: error: " + copy.string() + ".bin: the file is shorter than when this run opened it"),
            std::string::npos) << out;
}

TEST_F(Train, AFifoAsDataIsRefusedNotWaitedOn) {
  const fs::path prefix = tmp_ / "fifo";
  ASSERT_EQ(::mkfifo((prefix.string() + ".idx").c_str(), 0644), 0);
  mb::testing::write_text(prefix.string() + ".bin", "");
  auto r = mb::testing::run_command("timeout 300 " + mb::testing::bin_dir() + "/train " + kSmall +
                                    "--train-iters 2 --lr 1e-3 --data-path " + prefix.string());
  EXPECT_EQ(r.exit_code, 1) << "an error, not a hang (124) or a crash:\n" << r.output;
  EXPECT_NE(r.output.find(prefix.string() + ".idx: not a regular file (a FIFO)"), std::string::npos) << r.output;
  fs::create_symlink("/dev/zero", tmp_ / "dev.idx");
  fs::create_symlink("/dev/zero", tmp_ / "dev.bin");
  r = mb::testing::run_command("timeout 300 " + mb::testing::bin_dir() + "/train " + kSmall +
                               "--train-iters 2 --lr 1e-3 --data-path " + (tmp_ / "dev").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("dev.idx: not a regular file (a device or socket)"), std::string::npos) << r.output;
}

// A dataset given as one of its files (PREFIX.bin, as a file browser offers it) is named by its
// prefix in the error; a missing default dataset given so still gets the command that makes it;
// a missing one given by a relative path is said to be looked for in the working directory.
// Before, the first said "PREFIX.bin.idx: dataset index not found", the second named
// "PREFIX.bin.bin/.idx".
TEST_F(Train, ADatasetGivenAsItsBinFileIsRefusedNamingItsPrefix) {
  const std::string prefix = (brown() / "brown_gpt2_text_document").string();
  for (const char* ext : {".bin", ".idx"}) {
    const auto r = mb::testing::run_command(mb::testing::bin_dir() + "/train " + kSmall +
                                            "--train-iters 2 --lr 1e-3 --check --data-path " + prefix + ext);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("train: error: " + prefix + ext +
                            ": this is one of a dataset's two files; a dataset is named by their prefix, without " +
                            ext + ": give " + prefix + "\n"),
              std::string::npos)
        << r.output;
  }
  const std::string missing = (tmp_ / "nowhere" / "brown_gpt2_text_document").string();
  const auto r = mb::testing::run_command(mb::testing::bin_dir() + "/train " + kSmall +
                                          "--train-iters 2 --lr 1e-3 --check --data-path " + missing + ".bin");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("train: error: data_path: " + missing +
                          ".bin/.idx are missing; the default Brown corpus is "
                          "made by `"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("preprocess brown --output-dir " + (tmp_ / "nowhere").string() + "`, run it first"),
            std::string::npos)
      << r.output;
  // named by a relative path (a sweep file's data/..., run from elsewhere): the working
  // directory it was looked for in is said
  const fs::path cwd = fs::canonical(tmp_.path());
  for (const std::string name : {"brown_gpt2_text_document", "corpus_text_document"}) {
    const auto rel = mb::testing::run_command("cd " + cwd.string() + " && " + mb::testing::bin_dir() + "/train " +
                                              kSmall + "--train-iters 2 --lr 1e-3 --check --data-path data/" + name);
    EXPECT_EQ(rel.exit_code, 1) << rel.output;
    EXPECT_NE(rel.output.find("; data/" + name + " is relative to the working directory, " + cwd.string()),
              std::string::npos)
        << rel.output;
  }
}

// A run that cannot fit stops before allocating, with what it needs against what there is
// (gpt-7.5b needs about 175 GiB in fp32 on one rank; no CI machine has that).
TEST_F(Train, AModelThatCannotFitIsRefusedBeforeAllocating) {
  const auto r = mb::testing::run_command("timeout 300 " + train("--model gpt-7.5b --micro-batch-size 1 --train-iters 2 --lr 1e-3 --run-dir " +
                                                                (tmp_ / "big").string()));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // 7.5 G parameters in fp32: 4 bytes each for weights and gradients, 8 for two optimizer states
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("train: error: this run needs about ([0-9.]+) GiB on cpu \\(parameters "
                                                         "([0-9.]+) GiB, gradients ([0-9.]+) GiB, optimizer state ([0-9.]+) GiB, "
                                                         "activations [0-9.]+ GiB for micro batch 1, LM-head logits [0-9.]+ MiB\\) but ")))
      << r.output;
  const double need = std::stod(m[1]), params = std::stod(m[2]), state = std::stod(m[4]);
  EXPECT_NEAR(params, 7.5e9 * 4 / (1 << 30), 0.1 * 7.5e9 * 4 / (1 << 30));
  EXPECT_EQ(m[3].str(), m[2].str());
  EXPECT_NEAR(state, 2 * params, 0.11);
  EXPECT_GT(need, 4 * params);
  EXPECT_NE(r.output.find("is available (MemAvailable in /proc/meminfo"), std::string::npos) << r.output;
  // --log-noise-scale keeps the gradients before each micro-batch: one more gradient's size
  const auto n = mb::testing::run_command("timeout 300 " + train("--model gpt-7.5b --micro-batch-size 1 --global-batch-size 2 "
                                                                "--log-noise-scale --train-iters 2 --lr 1e-3 --run-dir " +
                                                                (tmp_ / "big").string()));
  std::smatch k;
  ASSERT_TRUE(std::regex_search(n.output, k, std::regex("needs about ([0-9.]+) GiB .*optimizer state [0-9.]+ GiB, "
                                                         "noise-scale buffer ([0-9.]+) GiB, activations")))
      << n.output;
  EXPECT_EQ(k[2].str(), m[3].str()) << "the size of the gradients";
  EXPECT_NEAR(std::stod(k[1]) - need, std::stod(m[3]), 0.11);
  // Ten million layers: counted at once, not declared one by one (declaring them was
  // quadratic in their number, and never reached this refusal); sizes whose products would
  // wrap an int64 are refused by name
  const auto deep = mb::testing::run_command("timeout 300 " + train(kSmall + "--num-layers 10000000 --train-iters 1 --lr 1e-3 "
                                                                   "--run-dir " + (tmp_ / "deep").string()));
  EXPECT_EQ(deep.exit_code, 1) << deep.output;
  EXPECT_NE(deep.output.find("train: error: this run needs about "), std::string::npos) << deep.output;
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--num-layers 2000000000 --hidden-size 1048576 --num-attention-heads 2",
            "the model's 2000000000 layers of hidden size 1048576 add up to more parameters than any machine holds"},
           {"--hidden-size 2000000000 --num-attention-heads 2",
            "parameter 'decoder.layers.0.self_attention.linear_qkv.weight': 6000000000 x 2000000000 elements is more "
            "than any machine holds"},
           {"--hidden-size 4611686018427387904 --num-attention-heads 2",
            "hidden_size is 4611686018427387904; sizes above 2147483647 (2^31 - 1) are not supported"}}) {
    const auto absurd = mb::testing::run_command("timeout 300 " + train("--num-layers 2 --seq-length 32 " + mb::testing::threads_flag() +
                                                                          flags + " --train-iters 1 --lr 1e-3 --run-dir " +
                                                                          (tmp_ / "absurd").string()));
    EXPECT_EQ(absurd.exit_code, 1) << flags << "\n" << absurd.output;
    EXPECT_NE(absurd.output.find(message), std::string::npos) << flags << "\n" << absurd.output;
  }
  // a small run says its estimate and runs
  const auto ok = mb::testing::run_command(train(kSmall + "--train-iters 1 --lr 1e-3 --eval-iters 0 --run-dir " + (tmp_ / "small").string()));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("> memory: about "), std::string::npos) << ok.output;
}

// Megatron's console: iteration 1 is logged as well as every log interval; the optional
// throughput per GPU, num zeros and params norm fields; the end-of-training evaluation on
// the validation set and on the test set (also in metrics.h5: validation/, test/).
TEST_F(Train, LogLinesAsMegatronPrintsThem) {
  const fs::path run = tmp_ / "log", ckpt = tmp_ / "ckpt";
  const auto r = mb::testing::run_command(train(kSmall + "--micro-batch-size 4 --global-batch-size 8 --train-iters 4 --lr 1e-3 "
                                                "--log-interval 2 --eval-interval 2 --eval-iters 2 --log-throughput "
                                                "--log-params-norm --log-num-zeros-in-grad --save " + ckpt.string() +
                                                " --run-dir " + run.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::regex line(R"( \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration +(\d+)/ +4 \| consumed samples: +\d+ \| )"
                        R"(elapsed time per iteration \(ms\): [0-9.]+ \| throughput per GPU \(TFLOP/s/GPU\): [0-9.]+ \|.*)"
                        R"( grad norm: [0-9.]+ \| num zeros: \d+ \| params norm: ([0-9.]+) \| number of skipped)");
  std::vector<int> logged;
  std::string last_norm;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), line); it != std::sregex_iterator(); ++it) {
    logged.push_back(std::stoi((*it)[1]));
    last_norm = (*it)[2];
  }
  EXPECT_EQ(logged, (std::vector<int>{1, 2, 4})) << r.output;
  EXPECT_NE(r.output.find(" validation loss at iteration 2 | lm loss value: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" validation loss at iteration 4 on validation set | lm loss value: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" validation loss at iteration 4 on test set | lm loss value: "), std::string::npos) << r.output;
  // params norm: the L2 norm of the parameters after iteration 4, as the checkpoint holds them
  const auto norm = mb::testing::run_command(
      "/usr/bin/python3 -c \"import h5py, numpy as np\n"
      "f = h5py.File('" + (ckpt / "iter_0000004.h5").string() + "', 'r')\n"
      "print('%.3f' % np.sqrt(sum(float(np.sum(np.asarray(f['params'][k], np.float64) ** 2)) for k in f['params'])))\"");
  ASSERT_EQ(norm.exit_code, 0) << norm.output;
  EXPECT_EQ(last_norm + "\n", norm.output);
  const auto t = mb::testing::run_command("/usr/bin/python3 -c \"import h5py; f = h5py.File('" + (run / "metrics.h5").string() +
                                          "', 'r'); print(list(f['test/iteration']), len(f['validation/iteration']))\"");
  EXPECT_EQ(t.output, "[4.0] 2\n") << t.output;
}

// Megatron's --skip-train: the training run's own command with --skip-train and --load prints
// the evaluation the run printed at that checkpoint's iteration, to the last digit, and writes
// it to its own run directory's metrics.h5 (whatever schedule flags it is given: it takes no
// step); it trains nothing, saves nothing, and refuses the training run's directory (whose
// config.json and metrics.h5 it would replace).
TEST_F(Train, SkipTrainEvaluatesACheckpointAsTheRunDidAtItsIteration) {
  const fs::path run = tmp_ / "run", ckpt = tmp_ / "ckpt";
  const std::string base = kSmall +
                           "--micro-batch-size 4 --global-batch-size 8 --train-iters 4 --lr 1e-3 "
                           "--hidden-dropout 0.1 --eval-interval 2 --eval-iters 2 --save-interval 2 --save " +
                           ckpt.string();
  const auto trained = mb::testing::run_command(train(base + " --run-dir " + run.string()));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  // the evaluation line after `prefix` (the losses and perplexities), or "none"
  auto after = [](const std::string& output, const std::string& prefix) {
    const auto at = output.find(prefix);
    return at == std::string::npos ? std::string("none")
                                   : output.substr(at + prefix.size(), output.find('\n', at) - at - prefix.size());
  };
  const std::string at2 = after(trained.output, " validation loss at iteration 2 |");
  const std::string valid4 = after(trained.output, " validation loss at iteration 4 on validation set |");
  const std::string test4 = after(trained.output, " validation loss at iteration 4 on test set |");
  ASSERT_NE(valid4, "none") << trained.output;
  ASSERT_NE(test4, "none") << trained.output;
  const auto saved = mb::testing::run_command("ls -l --time-style=full-iso " + ckpt.string());

  const fs::path eval = tmp_ / "eval";
  auto r = mb::testing::run_command(train(base + " --skip-train --load " + ckpt.string() + " --run-dir " +
                                          eval.string() + " --tensorboard-dir " + (tmp_ / "tb").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\nskipping training (--skip-train is on) ...\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> note: --skip-train saves no checkpoint; --save " + ckpt.string() + " is left as it is"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(after(r.output, " validation loss at iteration 4 on validation set |"), valid4) << r.output;
  EXPECT_EQ(after(r.output, " validation loss at iteration 4 on test set |"), test4) << r.output;
  EXPECT_EQ(r.output.find("elapsed time per iteration"), std::string::npos) << "nothing trained:\n" << r.output;
  EXPECT_EQ(mb::testing::run_command("ls -l --time-style=full-iso " + ckpt.string()).output, saved.output)
      << "nothing saved";
  EXPECT_FALSE(fs::exists(tmp_ / "tb")) << "no TensorBoard events, as Megatron's --skip-train";
  const auto h5 =
      mb::testing::run_command("/usr/bin/python3 -c \"import h5py; f = h5py.File('" + (eval / "metrics.h5").string() +
                               "', 'r')\n"
                               "print(sorted(f.keys()), list(f['validation/iteration']), list(f['test/iteration']), "
                               "'%.6E' % f['validation/lm_loss'][0])\"");
  EXPECT_EQ(h5.output, "['test', 'validation'] [4.0] [4.0] " + valid4.substr(16, 12) + "\n") << h5.output << valid4;
  EXPECT_TRUE(nlohmann::json::parse(mb::read_file(eval / "config.json"))["skip_train"].get<bool>());

  // another schedule's flags: an evaluation takes no step, so the checkpoint's is kept, unrefused
  r = mb::testing::run_command(train(base + " --lr 5e-4 --lr-decay-style cosine --skip-train --load " + ckpt.string() +
                                     " --run-dir " + (tmp_ / "eval-lr").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(after(r.output, " validation loss at iteration 4 on validation set |"), valid4) << r.output;

  // an earlier checkpoint: the evaluation the run made at its iteration, during training
  r = mb::testing::run_command(
      train(base + " --skip-train --load " + (ckpt / "iter_0000002.h5").string() + " --run-dir " + eval.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(after(r.output, " validation loss at iteration 2 on validation set |"), at2) << r.output;
  EXPECT_NE(r.output.find("> note: " + eval.string() +
                          " held the metrics of an earlier run (an evaluation at "
                          "iteration 4), which this run, starting afresh, would replace; they are kept in " +
                          (eval / "earlier" / "1").string()),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(eval / "earlier" / "1" / "metrics.h5"));

  // the training run's directory: refused, its metrics intact
  r = mb::testing::run_command(train(base + " --skip-train --load " + ckpt.string() + " --run-dir " + run.string()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(run.string() +
                          " holds the metrics.h5 and config.json of a run that trained, which this "
                          "evaluation (--skip-train) would replace; give the evaluation a --run-dir of its own"),
            std::string::npos)
      << r.output;
  mb::testing::H5File f((run / "metrics.h5").string(), mb::testing::H5File::kRead);
  EXPECT_EQ(f.read<double>("train/lm_loss").size(), 4u);
  EXPECT_FALSE(nlohmann::json::parse(mb::read_file(run / "config.json"))["skip_train"].get<bool>());

  // nothing to evaluate: said before anything runs (a --load without a checkpoint would have
  // evaluated the model as initialized)
  r = mb::testing::run_command(
      train(base + " --skip-train --load " + (tmp_ / "empty").string() + " --run-dir " + eval.string()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--skip-train: " + (tmp_ / "empty").string() +
                          " (--load) holds no checkpoint to evaluate; give --load the run's --save directory"),
            std::string::npos)
      << r.output;
  r = mb::testing::run_command(train(base + " --skip-train --eval-iters 0 --run-dir " + eval.string()));
  EXPECT_NE(r.output.find("--skip-train evaluates the validation and test splits, but --eval-iters is 0"),
            std::string::npos)
      << r.output;
  r = mb::testing::run_command(train(base + " --skip-train --split 100,0,0 --check"));
  EXPECT_NE(r.output.find("--skip-train asks for validation, but the validation split of --split '100,0,0' holds"),
            std::string::npos)
      << r.output;
}

// A run that starts afresh in a --run-dir that holds an earlier run's metrics (train's default
// runs/train, a command run again with another flag) keeps that run's config.json and metrics.h5
// in RUN_DIR/earlier/N, and says so; a resumed run continues its own metrics.h5 in place.
TEST_F(Train, AFreshStartKeepsTheEarlierRunsMetricsInItsDirectory) {
  const fs::path run = tmp_ / "run", ckpt = tmp_ / "ckpt";
  const std::string base =
      kSmall + "--micro-batch-size 4 --global-batch-size 4 --lr-decay-style constant --eval-iters 0 --run-dir " +
      run.string();
  auto losses = [](const fs::path& metrics) {
    mb::testing::H5File f(metrics.string(), mb::testing::H5File::kRead);
    return f.read<double>("train/lm_loss");
  };
  auto r = mb::testing::run_command(train(base + " --train-iters 3 --lr 1e-3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("earlier run"), std::string::npos) << r.output;
  const std::vector<double> first = losses(run / "metrics.h5");
  ASSERT_EQ(first.size(), 3u);

  r = mb::testing::run_command(train(base + " --train-iters 2 --lr 2e-3 --save " + ckpt.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> note: " + run.string() + " held the metrics of an earlier run (iterations 1 to 3), " +
                          "which this run, starting afresh, would replace; they are kept in " +
                          (run / "earlier" / "1").string() + "\n"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(losses(run / "earlier" / "1" / "metrics.h5"), first);
  EXPECT_EQ(nlohmann::json::parse(mb::read_file(run / "earlier" / "1" / "config.json"))["lr"].get<double>(), 1e-3);
  EXPECT_EQ(nlohmann::json::parse(mb::read_file(run / "config.json"))["lr"].get<double>(), 2e-3);
  const std::vector<double> second = losses(run / "metrics.h5");
  ASSERT_EQ(second.size(), 2u);

  // resumed from its checkpoint: the same metrics.h5 continued, nothing moved
  r = mb::testing::run_command(
      train(base + " --train-iters 4 --lr 2e-3 --save " + ckpt.string() + " --load " + ckpt.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("earlier run"), std::string::npos) << r.output;
  const std::vector<double> resumed = losses(run / "metrics.h5");
  ASSERT_EQ(resumed.size(), 4u);
  EXPECT_EQ(std::vector<double>(resumed.begin(), resumed.begin() + 2), second);
  EXPECT_FALSE(fs::exists(run / "earlier" / "2"));

  // the next fresh start: the next free number
  r = mb::testing::run_command(train(base + " --train-iters 1 --lr 1e-3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("held the metrics of an earlier run (iterations 1 to 4)"), std::string::npos) << r.output;
  EXPECT_EQ(losses(run / "earlier" / "2" / "metrics.h5"), resumed);
  EXPECT_EQ(losses(run / "earlier" / "1" / "metrics.h5"), first);
}

// --reset-position-ids reaches a GPT run's batches (the model's part is test_gpt.cc's
// ABatchsOwnPositionIdsGivePyTorchsLossAndGradients): on a corpus of short documents, several to
// a sample, the first iteration's loss at the same weights and tokens is another; with rotary
// positions the flag would do nothing and is refused.
TEST_F(Train, ResetPositionIdsRestartsTheLearnedPositionsOfEachDocument) {
  const std::string gpt = short_documents_gpt();
  ASSERT_FALSE(HasFailure());
  const auto plain = mb::testing::run_command(gpt + "--run-dir " + (tmp_ / "plain").string());
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto reset = mb::testing::run_command(gpt + "--reset-position-ids --run-dir " + (tmp_ / "reset").string());
  ASSERT_EQ(reset.exit_code, 0) << reset.output;
  EXPECT_NE(reset.output.find("; each document's positions from 0 (--reset-position-ids)"), std::string::npos)
      << reset.output;
  ASSERT_NE(first_loss(plain.output), "none") << plain.output;
  EXPECT_NE(first_loss(reset.output), first_loss(plain.output)) << reset.output;
  const auto rope = mb::testing::run_command(gpt + "--check --reset-position-ids --position-embedding-type rope");
  EXPECT_EQ(rope.exit_code, 1) << rope.output;
  EXPECT_NE(rope.output.find("--reset-position-ids restarts the learned position embeddings at each document"),
            std::string::npos)
      << rope.output;
}

// --reset-attention-mask on a corpus of short documents (several to a sample): the model line
// says it, the first iteration's loss differs from attending across the documents, with rotary
// positions too (which the mask does not touch, as Megatron's); BERT refuses it by name.
TEST_F(Train, ResetAttentionMaskKeepsEachDocumentsAttentionWithinIt) {
  const std::string gpt = short_documents_gpt();
  ASSERT_FALSE(HasFailure());
  for (const std::string positions : {"", "--position-embedding-type rope "}) {
    SCOPED_TRACE(positions);
    const auto plain = mb::testing::run_command(gpt + positions + "--run-dir " + (tmp_ / "plain").string());
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    const auto reset =
        mb::testing::run_command(gpt + positions + "--reset-attention-mask --run-dir " + (tmp_ / "reset").string());
    ASSERT_EQ(reset.exit_code, 0) << reset.output;
    EXPECT_NE(reset.output.find("; each document attends within itself (--reset-attention-mask)"), std::string::npos)
        << reset.output;
    ASSERT_NE(first_loss(plain.output), "none") << plain.output;
    EXPECT_NE(first_loss(reset.output), first_loss(plain.output)) << reset.output;
  }
  const auto bert = mb::testing::run_command(mb::testing::bin_dir() +
                                             "/train --model bert-mini --check "
                                             "--reset-attention-mask --run-dir " +
                                             (tmp_ / "bert").string());
  EXPECT_EQ(bert.exit_code, 1) << bert.output;
  EXPECT_NE(bert.output.find("--reset-attention-mask is GPT's, and this model is bert, which would ignore it"),
            std::string::npos)
      << bert.output;
}

// The sgemm kernel sets a CPU run's speed and the last bits of its results, so the device
// line names the one this run got: the one OpenBLAS reports to this test process, loaded
// with the same environment, and where OPENBLAS_CORETYPE is set, the kernel it names. The
// OpenBLAS variables are left as they are: some machines set them because OpenBLAS's own
// pick computes wrong results there with older OpenBLAS builds.
TEST_F(Train, TheDeviceLineNamesTheSgemmKernelThisRunGot) {
  const auto r = mb::testing::run_command(train(kSmall + "--micro-batch-size 2 --global-batch-size 2 --train-iters 1 "
                                                         "--lr 1e-3 --eval-iters 0 --run-dir " + (tmp_ / "k").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::regex device(
      R"(> device: cpu[^\n]*; OpenBLAS [0-9.]+ sgemm kernel ([A-Za-z0-9]+)( \(megabatch's choice [^\n]*\))?\n)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, device)) << r.output;
  EXPECT_EQ(m[1].str(), std::string(openblas_get_corename()));
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"); forced && *forced) {
    EXPECT_EQ(strcasecmp(m[1].str().c_str(), forced), 0) << "OPENBLAS_CORETYPE=" << forced << ", the line says " << m[1];
  }
}

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

// --eval-samples: the same held-out samples whatever the batch size and seed. With lr 0 the
// model stays at its initialization (or at the checkpoint it was fine-tuned from), so equal
// validation losses mean equal samples.
TEST_F(Train, EvalSamplesMeasureEveryPointOnTheSameHeldOutSamples) {
  auto valid = [&](const std::string& args) {
    const auto r = mb::testing::run_command(train(kSmall + "--micro-batch-size 4 --train-iters 1 --lr 0 --run-dir " +
                                                  (tmp_ / "ev").string() + " " + args));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const auto at = r.output.find("on validation set | lm loss value: ");
    return at == std::string::npos ? std::string("none") : r.output.substr(at + 35, 12);
  };
  EXPECT_EQ(valid("--global-batch-size 4 --eval-samples 16"), valid("--global-batch-size 8 --eval-samples 16"));
  EXPECT_NE(valid("--global-batch-size 4 --eval-iters 2"), valid("--global-batch-size 8 --eval-iters 2"))
      << "eval_iters global batches: a different number of samples per batch size";
  EXPECT_NE(valid("--global-batch-size 4 --eval-samples 16"), valid("--global-batch-size 4 --eval-samples 8"));
  // and whatever the seed: the same weights (--finetune from one checkpoint) under seeds 1 and 2
  const fs::path ckpt = tmp_ / "ev_ckpt";
  valid("--global-batch-size 4 --eval-samples 16 --seed 1 --save " + ckpt.string());
  const std::string from = "--global-batch-size 4 --eval-samples 16 --finetune --load " + ckpt.string();
  EXPECT_EQ(valid(from + " --seed 1"), valid(from + " --seed 2"));
  EXPECT_NE(valid("--global-batch-size 4 --eval-iters 4 --finetune --load " + ckpt.string() + " --seed 1"),
            valid("--global-batch-size 4 --eval-iters 4 --finetune --load " + ckpt.string() + " --seed 2"))
      << "without --eval-samples the held-out order follows the seed";
  const auto bad = mb::testing::run_command(train(kSmall + "--micro-batch-size 4 --eval-samples 6 --train-iters 1 --lr 0"));
  EXPECT_NE(bad.output.find("--eval-samples (6) must be a multiple of --micro-batch-size (4)"), std::string::npos)
      << bad.output;
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

// The default sweep's dataset: Brown in the 32,735 GPT-2 tokens it uses. The model's
// vocabulary is the corpus's (padded to 32,768), so the untrained loss is ln(32,768), not
// ln(50,304) as on the full dataset, and the run says which vocabulary it has.
TEST_F(Train, ACompactDatasetBringsItsOwnVocabulary) {
  auto first_loss = [&](const std::string& data, const std::string& dir, std::string* out) {
    const auto r = mb::testing::run_command(mb::testing::bin_dir() + "/train " + kSmall + "--data-path " +
                                            (brown() / data).string() + " --micro-batch-size 4 " +
                                            "--global-batch-size 4 --train-iters 1 --lr 0 --log-interval 1 --eval-iters 0 "
                                            "--run-dir " + (tmp_ / dir).string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (out) *out = r.output;
    const auto at = r.output.find("| lm loss: ");
    return at == std::string::npos ? 0.0 : std::stod(r.output.substr(at + 11, 12));
  };
  std::string out;
  EXPECT_NEAR(first_loss("brown_gpt2_compact_text_document", "c", &out), std::log(32768.0), 0.05);
  EXPECT_NE(out.find("vocabulary: its own 32735 GPT2BPETokenizer tokens (" +
                     (brown() / "brown_gpt2_compact_text_document.vocab.json").string() + ")"),
            std::string::npos) << out;
  EXPECT_NE(out.find("vocab 32735 (padded 32768)"), std::string::npos) << out;
  EXPECT_NE(mb::read_file(tmp_ / "c" / "config.json").find("\"padded_vocab_size\": 32768"), std::string::npos);
  EXPECT_NEAR(first_loss("brown_gpt2_text_document", "f", &out), std::log(50304.0), 0.05);
  EXPECT_EQ(out.find("vocabulary: its own"), std::string::npos) << out;

  // BERT and T5 on a compact WordPiece dataset: their sample builders insert [CLS] [SEP]
  // [MASK] and sentinels, which the compact vocabulary keeps.
  for (const std::string model : {"bert", "t5"}) {  // T5's 100 sentinels make another vocabulary
    const fs::path wp = tmp_ / ("brown_" + model + "_compact_text_sentence");
    auto r = mb::testing::run_command(mb::testing::bin_dir() + "/preprocess compact " +
                                      (brown() / "brown_bert_text_sentence").string() + " " + wp.string() +
                                      " --tokenizer-type BertWordPieceLowerCase --vocab-extra-ids " +
                                      (model == "t5" ? "100" : "0"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = mb::testing::run_command(mb::testing::bin_dir() + "/train --model-type " + model + " " + kSmall +
                                 "--seq-length 48" + (model == "t5" ? " --decoder-seq-length 16" : "") +
                                 " --micro-batch-size 2 --global-batch-size 2 --train-iters 2 --lr 1e-3 --eval-iters 0 "
                                 "--log-interval 1 --data-path " + wp.string() + " --run-dir " + (tmp_ / model).string());
    EXPECT_EQ(r.exit_code, 0) << model << "\n" << r.output;
    EXPECT_NE(r.output.find("vocabulary: its own"), std::string::npos) << r.output;
  }
}

// --data-path W1 A W2 B: a weighted blend (core/data/blend.h). With the learning rate 0 each
// iteration's loss is that of its samples under the initial weights, so the order shows in the
// losses: a 1:1 blend of A and B takes A0 B0 A1 B1 ..., so its batch k of two has the mean of
// sample k's losses in runs on A and on B alone, batches of one.
TEST_F(Train, AWeightedBlendTakesItsSamplesInTheOrderItsWeightsSay) {
  const fs::path a = brown() / "brown_gpt2_text_document";
  const std::string bb = ferry_corpus();
  ASSERT_FALSE(HasFailure());
  const std::string common = kSmall +
                             "--hidden-dropout 0 --attention-dropout 0 --train-iters 6 --lr 0 --log-interval 1 "
                             "--eval-iters 1 --eval-interval 3 ";
  auto run = [&](const std::string& dir, const std::string& data, const std::string& args, std::string* out = nullptr) {
    const auto rr = mb::testing::run_command(mb::testing::bin_dir() + "/train " + common + "--data-path " + data + " " +
                                             args + " --run-dir " + (tmp_ / dir).string());
    EXPECT_EQ(rr.exit_code, 0) << rr.output;
    if (out) *out = rr.output;
    mb::testing::H5File f((tmp_ / dir / "metrics.h5").string(), mb::testing::H5File::kRead);
    return f.read<double>("train/lm_loss");
  };
  // "N training samples per epoch" of a run's data line
  auto samples = [](const std::string& out) {
    const auto end = out.find(" training samples per epoch");
    return end == std::string::npos ? std::string("?")
                                    : out.substr(out.rfind(' ', end - 1) + 1, end - out.rfind(' ', end - 1) - 1);
  };
  const std::string one = "--micro-batch-size 1 --global-batch-size 1",
                    two = "--micro-batch-size 2 --global-batch-size 2";
  std::string out_a, out_b, out;
  const auto on_a = run("a", a.string(), one, &out_a), on_b = run("b", bb, one, &out_b);
  ASSERT_EQ(on_a.size(), 6u);
  ASSERT_EQ(on_b.size(), 6u);
  EXPECT_EQ(run("weight_one", "1.0 " + a.string(), one), on_a) << "a blend of one dataset is that dataset";
  const auto halves = run("halves", "1 " + a.string() + " 1 " + bb, two, &out);
  ASSERT_EQ(halves.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_NE(on_a[i], on_b[i]);
    EXPECT_NEAR(halves[i], (on_a[i] + on_b[i]) / 2, 1e-5 * halves[i]) << "iteration " << i + 1;
  }
  EXPECT_NE(out.find("> data: a blend of 2 datasets: 50.0% of the samples from " + a.string() + ": 500 documents"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(" | 50.0% of the samples from " + bb + ": 120 documents"), std::string::npos) << out;
  EXPECT_NE(out.find("validation loss at iteration 3"), std::string::npos) << "the validation splits blended: " << out;
  // without weights, each weighs as many samples as it has (B's few come later than 1:1's)
  const auto sized = run("sized", a.string() + " " + bb, two);
  EXPECT_EQ(sized, run("by_samples", samples(out_a) + " " + a.string() + " " + samples(out_b) + " " + bb, two));
  EXPECT_NE(sized, halves);
  // stopped and resumed: the same samples
  const std::string ckpt = (tmp_ / "ckpt").string(), blend = "1 " + a.string() + " 1 " + bb;
  run("resumed", blend, two + " --save " + ckpt + " --exit-interval 4");
  EXPECT_EQ(run("resumed", blend, two + " --save " + ckpt + " --load " + ckpt), halves);

  // refused, naming what to do: a compact dataset (its own token ids), a dataset of another
  // tokenizer (its record), a weight without its dataset
  const fs::path compact = brown() / "brown_gpt2_compact_text_document",
                 bert = brown() / "brown_bert_text_sentence";
  for (const auto& [data, message] :
       {std::pair{"0.5 " + a.string() + " 0.5 " + compact.string(),
                  "data_path: " + compact.string() + " has a vocabulary of its own"},
        std::pair{
            "0.5 " + a.string() + " 0.5 " + bert.string(),
            bert.string() + ".tokenizer.json: the dataset " + bert.string() + " was made by BertWordPieceLowerCase"},
        std::pair{"0.5 " + a.string() + " 0.5", std::string("data_path: 3 items, but a weighted blend is pairs")}}) {
    const auto r = mb::testing::run_command(mb::testing::bin_dir() + "/train " + common + one +
                                            " --check --data-path " + data + " --run-dir " + (tmp_ / "bad").string());
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
}

// Megatron's --train-data-path, --valid-data-path and --test-data-path: each split takes its
// own datasets (a prefix or a blend), whole, as --data-path's training split takes its share.
// Training on them is training on --data-path with --split 100,0,0, bit for bit; a validation
// (test) dataset gives the samples training on it whole gives under the evaluation's seed
// (1234 + 1, + 2 with --eval-samples), so from the same weights (--finetune at lr 0) the
// validation and test losses are those first training losses.
TEST_F(Train, EachSplitTakesItsOwnDataWholeByMegatronsPerSplitFlags) {
  const std::string a = (brown() / "brown_gpt2_text_document").string(), b = ferry_corpus();
  ASSERT_FALSE(HasFailure());
  const std::string common = kSmall +
                             "--hidden-dropout 0 --attention-dropout 0 --micro-batch-size 8 "
                             "--global-batch-size 8 --log-interval 1 ";
  auto run = [&](const std::string& dir, const std::string& args, std::string* out = nullptr) {
    const auto r = mb::testing::run_command(mb::testing::bin_dir() + "/train " + common + args + " --run-dir " +
                                            (tmp_ / dir).string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (out) *out = r.output;
    return mb::testing::H5File((tmp_ / dir / "metrics.h5").string(), mb::testing::H5File::kRead);
  };
  // training: the blend of both, whole
  const std::string blend = "1 " + a + " 2 " + b;
  std::string out;
  const auto whole = run("whole", "--train-iters 3 --lr 1e-3 --eval-iters 0 --data-path " + blend + " --split 100,0,0")
                         .read<double>("train/lm_loss");
  ASSERT_EQ(whole.size(), 3u);
  EXPECT_EQ(
      run("per_split", "--train-iters 3 --lr 1e-3 --train-data-path " + blend, &out).read<double>("train/lm_loss"),
      whole);
  EXPECT_NE(out.find("> data: training: a blend of 2 datasets: 33.3% of the samples from " + a +
                     ": 500 documents, 1268237 tokens; 39632 training samples per epoch | 66.7% of the samples from " +
                     b + ": 120 documents"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("> warning: no validation loss will be logged: no --valid-data-path was given"), std::string::npos)
      << out;

  // validation on b and test on a, from one checkpoint's weights
  const std::string ckpt = (tmp_ / "ckpt").string();
  run("start", "--train-iters 1 --lr 0 --eval-iters 0 --data-path " + a + " --save " + ckpt);
  const std::string from = "--train-iters 1 --lr 0 --finetune --load " + ckpt + " ";
  auto evaluated = run("evaluated",
                       from + "--eval-samples 8 --eval-interval 1 --train-data-path " + a + " --valid-data-path " + b +
                           " --test-data-path " + a,
                       &out);
  const auto valid = evaluated.read<double>("validation/lm_loss"), test = evaluated.read<double>("test/lm_loss");
  ASSERT_EQ(valid.size(), 1u);
  ASSERT_EQ(test.size(), 1u);
  EXPECT_NE(out.find("; validation: " + b + ": 120 documents, "), std::string::npos) << out;
  EXPECT_NE(out.find("> warning: " + a + " is both training and test data (--train-data-path and --test-data-path)"),
            std::string::npos)
      << out;
  const auto on_b =
      run("on_b", from + "--eval-iters 0 --seed 1235 --train-data-path " + b).read<double>("train/lm_loss");
  const auto on_a =
      run("on_a", from + "--eval-iters 0 --seed 1236 --train-data-path " + a).read<double>("train/lm_loss");
  ASSERT_EQ(on_b.size(), 1u);
  ASSERT_EQ(on_a.size(), 1u);
  EXPECT_NEAR(valid[0], on_b[0], 1e-6 * on_b[0]);
  EXPECT_NEAR(test[0], on_a[0], 1e-6 * on_a[0]);
  EXPECT_GT(std::abs(valid[0] - test[0]), 1e-3) << "two datasets, two losses";

  // refused, naming the flags: what Megatron passes over without a word, and what is missing
  for (const auto& [args, message] :
       {std::pair{"--data-path " + a + " --train-data-path " + a,
                  std::string("--data-path and --train-data-path both give the data")},
        std::pair{"--train-data-path " + a + " --split 90,10,0",
                  std::string("--split cuts --data-path's documents, but --train-data-path gives each split its "
                              "own data, whole; drop --split")},
        std::pair{"--valid-data-path " + a + " --test-data-path " + b,
                  std::string("--valid-data-path, --test-data-path without --train-data-path: give the training "
                              "data by --train-data-path")},
        std::pair{"--train-data-path " + a + " --eval-samples 8",
                  std::string("--eval-samples asks for validation, but no --valid-data-path was given; give the "
                              "validation data by --valid-data-path, or drop --eval-samples")},
        std::pair{
            "--train-data-path " + a + " --valid-data-path " + (brown() / "brown_gpt2_compact_text_document").string(),
            "valid_data_path: " + (brown() / "brown_gpt2_compact_text_document").string() +
                " has a vocabulary of its own"},
        std::pair{"--train-data-path " + a + " --valid-data-path " + (tmp_ / "nowhere").string(),
                  "valid_data_path: " + (tmp_ / "nowhere").string() + ".idx: dataset index not found"}}) {
    const auto r = mb::testing::run_command(mb::testing::bin_dir() + "/train " + common +
                                            "--train-iters 1 --lr 1e-3 --check " + args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("train: error: " + message), std::string::npos) << r.output;
  }
}

// Megatron's --data-args-path (--data-path's list in a file, for blends too long for a command
// line) and --per-split-data-args-path (each split's, in JSON): a run given the file trains and
// evaluates as one given the flags; a mistake in the file is named by the file.
TEST_F(Train, DataArgsFilesGiveTheDataAsTheirFlagsWould) {
  const std::string a = (brown() / "brown_gpt2_text_document").string(), b = ferry_corpus();
  ASSERT_FALSE(HasFailure());
  const std::string common = kSmall +
                             "--hidden-dropout 0 --attention-dropout 0 --micro-batch-size 4 "
                             "--global-batch-size 4 --train-iters 3 --lr 1e-3 --log-interval 1 ";
  auto losses = [&](const std::string& dir, const std::string& args, std::string* output = nullptr) {
    const auto r = mb::testing::run_command(mb::testing::bin_dir() + "/train " + common + args + " --run-dir " +
                                            (tmp_ / dir).string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (output) *output = r.output;
    mb::testing::H5File f((tmp_ / dir / "metrics.h5").string(), mb::testing::H5File::kRead);
    std::vector<double> out = f.read<double>("train/lm_loss");
    if (f.has("validation/lm_loss"))
      for (double x : f.read<double>("validation/lm_loss")) out.push_back(x);
    return out;
  };
  const fs::path whole = tmp_ / "blend.txt", per_split = tmp_ / "splits.json";
  mb::testing::write_text(whole, "1 " + a + "\n2 " + b + "\n");
  const auto by_file = losses("by_file", "--eval-iters 0 --data-args-path " + whole.string());
  ASSERT_EQ(by_file.size(), 3u);
  EXPECT_EQ(by_file, losses("by_flag", "--eval-iters 0 --data-path 1 " + a + " 2 " + b));
  mb::testing::write_text(per_split, "{\"train\": \"1 " + a + " 2 " + b + "\", \"valid\": [\"" + b + "\"]}");
  std::string said;
  const auto splits_by_file = losses(
      "splits_by_file", "--eval-samples 8 --eval-interval 3 --per-split-data-args-path " + per_split.string(), &said);
  ASSERT_EQ(splits_by_file.size(), 4u) << "3 training losses and a validation loss";
  // the warning of a dataset in two splits names the file that put it there, not flags not given
  EXPECT_NE(said.find("> warning: " + b + " is both training and validation data (\"train\" and \"valid\" of " +
                      per_split.string() + " (--per-split-data-args-path))"),
            std::string::npos)
      << said;
  EXPECT_EQ(splits_by_file, losses("splits_by_flag", "--eval-samples 8 --eval-interval 3 --train-data-path 1 " + a +
                                                         " 2 " + b + " --valid-data-path " + b));

  const fs::path bad_count = tmp_ / "bad.txt", bad_key = tmp_ / "bad.json", missing = tmp_ / "missing.json";
  mb::testing::write_text(bad_count, "0.5 " + a + " 0.5\n");
  mb::testing::write_text(missing, "{\"train\": [\"" + a + "\"], \"test\": [\"" + (tmp_ / "nowhere").string() + "\"]}");
  mb::testing::write_text(bad_key, "{\"train\": [\"" + a + "\"], \"validation\": [\"" + b + "\"]}");
  for (const auto& [args, message] :
       {std::pair{"--data-args-path " + bad_count.string(),
                  bad_count.string() + " (--data-args-path): 3 items, but a weighted blend is pairs"},
        std::pair{"--per-split-data-args-path " + bad_key.string(),
                  bad_key.string() + " (--per-split-data-args-path): unknown key 'validation'; the splits are "
                                     "train, valid and test"},
        std::pair{"--per-split-data-args-path " + missing.string(),
                  missing.string() + " (--per-split-data-args-path): test: " + (tmp_ / "nowhere").string() +
                      ".idx: dataset index not found"},
        std::pair{"--data-args-path " + whole.string() + " --data-path " + a,
                  "--data-args-path " + whole.string() + " gives the data, and so does --data-path; give one"},
        std::pair{"--data-args-path " + whole.string() + " --per-split-data-args-path " + per_split.string(),
                  std::string("--data-args-path and --per-split-data-args-path both give the data; give one")}}) {
    const auto r = mb::testing::run_command(mb::testing::bin_dir() + "/train " + common + "--check " + args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("train: error: " + message), std::string::npos) << r.output;
  }
}

// A dataset made by another tokenizer than the run's. Every WordPiece id lies below GPT-2's
// 50,257, so a GPT given BERT's sentences would train on them without a word; the record
// `preprocess` writes beside the dataset refuses it at `train --check` (what sweep run
// --dry-run runs for every point), and the tokenizer it names is taken.
// --rampup-batch-size 2 2 24 to a global batch of 8 over 64 samples: n = 3 increments, one
// every 8 samples, so the steps take 2, 2, 2, 2 (0..7 consumed), 4, 4 (8..15), 6, 6 (16..23:
// 16 and 22), then 8 (28 > 24) to the end, and Megatron counts 8 iterations to 28 samples and
// (64 - 28) / 8 = 4 more. At lr 0 without dropout a step's loss is the mean over its
// micro-batches, so each step's loss names the samples it took: those of a run in batches of 2.
TEST_F(Train, ARampedBatchTakesTheSamplesMegatronsRampGivesEachStep) {
  const std::vector<int64_t> batch = {2, 2, 2, 2, 4, 4, 6, 6, 8, 8, 8, 8};
  const std::string common = kSmall + "--micro-batch-size 2 --log-interval 1 --eval-iters 0 ";
  const std::string ramp = "--global-batch-size 8 --rampup-batch-size 2 2 24 --train-samples 64 ";
  auto run = [&](const std::string& dir, const std::string& args, std::string* out = nullptr) {
    const auto r = mb::testing::run_command(train(common + args + " --run-dir " + (tmp_ / dir).string()));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (out) *out = r.output;
    return mb::testing::H5File((tmp_ / dir / "metrics.h5").string(), mb::testing::H5File::kRead);
  };
  const std::string still = "--hidden-dropout 0 --attention-dropout 0 --lr 0 ";
  const auto pairs = run("pairs", still + "--global-batch-size 2 --train-samples 60").read<double>("train/lm_loss");
  ASSERT_EQ(pairs.size(), 30u);
  std::string out;
  auto f = run("ramped", still + ramp, &out);
  const auto loss = f.read<double>("train/lm_loss"), consumed = f.read<double>("train/consumed_samples");
  ASSERT_EQ(loss.size(), batch.size()) << out;
  EXPECT_EQ(f.read<double>("train/global_batch_size"), std::vector<double>(batch.begin(), batch.end()));
  int64_t at = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    double mean = 0;
    for (int64_t j = at / 2; j < (at + batch[i]) / 2; ++j) mean += pairs[static_cast<size_t>(j)];
    mean /= static_cast<double>(batch[i] / 2);
    EXPECT_NEAR(loss[i], mean, 1e-5 * mean)
        << "iteration " << i + 1 << " takes samples " << at << " to " << at + batch[i] - 1;
    at += batch[i];
    EXPECT_EQ(consumed[i], static_cast<double>(at)) << "iteration " << i + 1;
  }
  EXPECT_NE(out.find("> 12 iterations x global batch 2 to 8 by 2 over 24 samples (--rampup-batch-size), then 8 "
                     "(micro batch 2, 4 accumulation steps"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("iteration        5/      12 | consumed samples:           12 |"), std::string::npos) << out;
  EXPECT_NE(out.find("global batch size:     4 |"), std::string::npos) << out;

  // Training: the learning rate counts samples (linear decay over the 64 of the run), so step i
  // has lr 1e-3 x (1 - samples before it / 64). Stopped after iteration 5 (the first of batch 4)
  // and resumed, the run takes the same batches: the same losses, bit for bit.
  const std::string moving = "--lr 1e-3 --lr-decay-style linear " + ramp;
  auto whole = run("whole", moving);
  const auto lr = whole.read<double>("train/learning_rate"), trained = whole.read<double>("train/lm_loss");
  ASSERT_EQ(lr.size(), batch.size());
  at = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    EXPECT_NEAR(lr[i], 1e-3 * (1.0 - static_cast<double>(at) / 64.0), 1e-15) << "iteration " << i + 1;
    at += batch[i];
  }
  const std::string ckpt = (tmp_ / "ckpt").string();
  run("resumed", moving + "--save " + ckpt + " --exit-interval 5");
  EXPECT_EQ(run("resumed", moving + "--save " + ckpt + " --load " + ckpt).read<double>("train/lm_loss"), trained);

  // refused, naming what to give
  for (const auto& [args, message] : {
           std::pair<std::string, std::string>{
               "--lr 1e-3 --global-batch-size 8 --rampup-batch-size 2 2 24 --train-iters 10",
               "--rampup-batch-size ramps the batch over samples, and needs a run counted in samples: give "
               "--train-samples instead of --train-iters"},
           {"--lr 1e-3 --global-batch-size 8 --rampup-batch-size 2 24 --train-samples 64",
            "--rampup-batch-size takes three numbers, START INCREMENT SAMPLES (got 2: [2,24])"},
           {"--lr 1e-3 --global-batch-size 8 --rampup-batch-size 2 4 24 --train-samples 64",
            "the increment 4 does not divide the ramp from 2 to --global-batch-size 8"},
           {"--lr 1e-3 --global-batch-size 8 --rampup-batch-size 3 5 24 --train-samples 64",
            "must be multiples of micro_batch_size x data-parallel size (2 x 1 = 2)"},
           {"--lr 1e-3 --global-batch-size 8 --rampup-batch-size 2 2 24 --train-samples 64 --log-noise-scale",
            "a global batch needs at least 2 micro-batches (global batch 2 at the start of the ramp, micro batch 2)"},
       }) {
    const auto r = mb::testing::run_command(train(common + args + " --run-dir " + (tmp_ / "refused").string()));
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
  }
}

TEST_F(Train, ADatasetMadeByAnotherTokenizerIsRefusedByItsRecord) {
  const fs::path bert = brown() / "brown_bert_text_sentence";
  const std::string check = mb::testing::bin_dir() + "/train " + kSmall + "--train-iters 2 --lr 1e-3 --check " +
                            "--data-path " + bert.string() + " --run-dir " + (tmp_ / "r").string();
  auto r = mb::testing::run_command(check);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(bert.string() + ".tokenizer.json: the dataset " + bert.string() +
                          " was made by BertWordPieceLowerCase with a vocabulary of 30524 tokens"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("but this run's tokenizer is GPT2BPETokenizer; set tokenizer_type (--tokenizer-type) to "
                          "BertWordPieceLowerCase"),
            std::string::npos) << r.output;
  r = mb::testing::run_command(check + " --tokenizer-type BertWordPieceLowerCase");
  EXPECT_EQ(r.exit_code, 0) << r.output;
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

TEST_F(Train, ProfileStepsPrintsWhereTheStepTimeWentByOpFamily) {
  auto r = mb::testing::run_command(train(kSmall + "--train-iters 6 --lr 1e-3 --micro-batch-size 2 --global-batch-size 4 " +
                                          "--eval-iters 0 --profile-steps 3 --run-dir " + (tmp_ / "run").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto t = mb::testing::parse_profile(r.output);
  ASSERT_GT(t.step_ms, 0) << r.output;
  EXPECT_EQ(t.clock, "host");
  // the families of a GPT step
  for (const char* family : {"attention forward", "attention backward", "GEMMs (linear layers)", "LM head + loss",
                             "LayerNorm", "optimizer", "embedding", "outside ops (host)"})
    EXPECT_EQ(t.rows.count(family), 1u) << family << "\n" << r.output;
  EXPECT_EQ(t.rows.at("attention forward").count, 4.0) << r.output;  // 2 layers x 2 micro-batches
  // the rows and the time outside ops add up to the step
  double sum = 0, share = 0;
  for (const auto& [name, row] : t.rows) sum += row.ms, share += row.share;
  EXPECT_NEAR(sum, t.step_ms, 0.001 * 12) << r.output;  // each row rounded to 0.001 ms
  EXPECT_NEAR(share, 100.0, 0.1 * 12) << r.output;
  // a run too short to profile anything is refused, by --check too (before, it ran and said so
  // at its end); one resumed with no more than the warm-up left says so at its end
  for (const std::string check : {"", " --check"}) {
    r = mb::testing::run_command(train(kSmall +
                                       "--train-iters 2 --lr 1e-3 --eval-iters 0 --profile-steps 3 --run-dir " +
                                       (tmp_ / "run2").string() + check));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("train: error: --profile-steps 3 times the iterations after the first 2 (warm-up), but the "
                            "run has 2 in all (--train-iters), so it would profile nothing; ask for at least 3 "
                            "iterations, or drop --profile-steps"),
              std::string::npos)
        << check << "\n"
        << r.output;
  }
  const std::string resumed = kSmall + "--lr 1e-3 --lr-decay-style constant --eval-iters 0 --save " +
                              (tmp_ / "ckpt").string() + " --load " + (tmp_ / "ckpt").string() + " --run-dir " +
                              (tmp_ / "run3").string();
  r = mb::testing::run_command(train(resumed + " --train-iters 3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(train(resumed + " --train-iters 5 --profile-steps 3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(iteration 3, "), std::string::npos) << "resumed\n" << r.output;
  EXPECT_NE(r.output.find("--profile-steps 3: nothing was profiled, the run ended within its first 2 iterations"),
            std::string::npos)
      << r.output;
}
