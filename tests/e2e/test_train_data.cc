// `train`'s data end to end: datasets refused or said where they would mislead (no end of
// document tokens, cut short, a FIFO, the .bin named, another tokenizer's), per-document
// positions and attention, held-out samples, compact vocabularies, weighted blends, per-split
// data, data-args files and Megatron's batch ramp-up.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>

#include "tests/e2e/train_fixture.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
namespace fs = std::filesystem;
using mb::testing::kSmall;
using mb::testing::Train;

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

// A FIFO (or a device) where a dataset file should be is refused at once instead of blocking.
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
    return trained(dir, common + args, out);
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
    mb::testing::H5File f = trained(dir, common + args, output);
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
