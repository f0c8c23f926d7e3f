// Checkpoint and resume through the real `train` binary: a run stopped at a checkpoint and
// resumed reproduces the uninterrupted run bit for bit (losses, noise-scale estimates,
// final parameters and optimizer state) with every shipped plugin, for GPT, BERT and T5; a kill during a
// checkpoint write leaves the previous one loadable; SIGUSR1 checkpoints and exits 3;
// mismatched checkpoints are refused with the mismatch named, and damaged ones with the field named;
// a first start from --pretrained-checkpoint takes its weights, and a restart its own checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/io/checkpoint.h"
#include "core/util/files.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace fs = std::filesystem;
namespace mb = megabatch;

namespace {

class Checkpoint : public ::testing::Test {
 public:
  // A small GPT (or BERT) run of 6 iterations, 2 micro-batches per step (so the noise
  // scale runs), dropout on; its decay spans 6 iterations whatever --train-iters a test gives,
  // so that a run resumed at another length keeps the checkpoint's schedule (else refused).
  static std::string train(const fs::path& run, const std::string& extra, const std::string& type = "gpt") {
    const bool bert = type == "bert" || type == "t5";  // T5 reads the WordPiece dataset too
    return mb::testing::bin_dir() + "/train --model-type " + type +
           " --num-layers 2 --hidden-size 32 "
           "--num-attention-heads 2 --seq-length " +
           (bert ? "48" : "16") + (type == "t5" ? " --decoder-seq-length 16" : "") +
           " --micro-batch-size 2 --global-batch-size 4 --train-iters 6 --lr 3e-3 --lr-warmup-iters 2 --lr-decay-iters "
           "6 "
           "--lr-decay-style cosine --log-interval 1 --eval-iters 0 --threads 1 --log-noise-scale "
           "--hidden-dropout 0.1 --attention-dropout 0.1 --data-path " +
           (mb::testing::brown_data() / (bert ? "brown_bert_text_sentence" : "brown_gpt2_text_document")).string() +
           " --run-dir " + run.string() + " " + extra;
  }
};

std::vector<double> series(const fs::path& metrics, const std::string& name) {
  mb::testing::H5File f(metrics.string(), mb::testing::H5File::kRead);
  return f.read<double>(name);
}

// Every dataset under params/ and optimizer/ of two checkpoints, bitwise.
void expect_same_tensors(const fs::path& a, const fs::path& b) {
  const auto r = mb::testing::run_command(
      "/usr/bin/python3 -c \"import h5py, numpy as np\n"
      "a, b = h5py.File('" + a.string() + "'), h5py.File('" + b.string() + "')\n"
      "names = []\n"
      "a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) else None)\n"
      "bad = [n for n in names if n not in b or not np.array_equal(a[n][()], b[n][()])]\n"
      "print(len(names), 'tensors', 'differ:', bad[:3])\"");
  EXPECT_NE(r.output.find("differ: []"), std::string::npos) << r.output;
}

void resume_is_bitwise_for(const std::string& type, const std::string& optimizer, const std::string& params) {
  SCOPED_TRACE(type);
  mb::testing::TempDir tmp;
  const std::string opt = "--optimizer " + optimizer + " " + params;
  // The uninterrupted run.
  auto r = mb::testing::run_command(Checkpoint::train(tmp / "whole", opt + " --save " + (tmp / "whole" / "ckpt").string(), type));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Stopped after iteration 5, having checkpointed at 2 and 4 (and 5 on exit) ...
  const fs::path ckpt = tmp / "split" / "ckpt";
  r = mb::testing::run_command(Checkpoint::train(tmp / "split", opt + " --save " + ckpt.string() +
                                                                    " --save-interval 2 --exit-interval 5", type));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_NE(r.output.find("exiting after iteration 5"), std::string::npos) << r.output;
  // ... then the checkpoint of iteration 5 is lost, as if killed before writing it: the
  // resumed run starts from 4 and must drop the metrics row of iteration 5 it finds.
  fs::remove(ckpt / "iter_0000005.h5");
  fs::remove(ckpt / "latest_checkpointed_iteration.txt");
  r = mb::testing::run_command(Checkpoint::train(tmp / "split", opt + " --save " + ckpt.string() + " --save-interval 2 --load " +
                                                                    ckpt.string(), type));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_NE(r.output.find("loaded " + (ckpt / "iter_0000004.h5").string()), std::string::npos) << r.output;

  const fs::path a = tmp / "whole" / "metrics.h5", b = tmp / "split" / "metrics.h5";
  EXPECT_EQ(series(b, "train/iteration"), (std::vector<double>{1, 2, 3, 4, 5, 6})) << "no duplicated or missing rows";
  std::vector<std::string> compared = {"train/lm_loss", "train/grad_norm", "train/learning_rate", "train/consumed_samples",
                                      "noise_scale/b_simple", "noise_scale/grad_sq_norm"};
  if (type == "bert") compared.push_back("train/sop_loss");
  for (const std::string& s : compared)
    EXPECT_EQ(series(a, s), series(b, s)) << optimizer << ": " << s << " differs after resuming";
  expect_same_tensors(tmp / "whole" / "ckpt" / "iter_0000006.h5", ckpt / "iter_0000006.h5");
}

// Every shipped plugin, with GPT, BERT and T5.
void resume_is_bitwise(const std::string& optimizer, const std::string& params) {
  for (const std::string type : {"gpt", "bert", "t5"}) resume_is_bitwise_for(type, optimizer, params);
}

}  // namespace

TEST_F(Checkpoint, ResumeIsBitwiseWithSgd) { resume_is_bitwise("sgd", "--optimizer-params momentum=0.9 --optimizer-params nesterov=true"); }
TEST_F(Checkpoint, ResumeIsBitwiseWithAdamw) { resume_is_bitwise("adamw", ""); }
TEST_F(Checkpoint, ResumeIsBitwiseWithLamb) { resume_is_bitwise("lamb", ""); }
TEST_F(Checkpoint, ResumeIsBitwiseWithLars) { resume_is_bitwise("lars", "--optimizer-params trust_coefficient=0.02"); }
TEST_F(Checkpoint, ResumeIsBitwiseWithLambNoise) { resume_is_bitwise("lamb_noise", "--optimizer-params ref_batch=2"); }
TEST_F(Checkpoint, ResumeIsBitwiseWithLambEmbscale) { resume_is_bitwise("lamb_embscale", "--optimizer-params ref_batch=2"); }

// --short-seq-prob chooses which sentences make each BERT and T5 sample, and so does T5's
// --t5-masking (whole-word fills the encoder, span corruption what the decoder holds), so a
// resume at the checkpoint's data position under another one would count other samples:
// refused, naming it. --mask-prob masks the same samples otherwise, and may change on a resume.
TEST_F(Checkpoint, AResumeRefusesAnotherShortSeqProbOrT5MaskingAndTakesAnotherMaskProb) {
  struct Case {
    std::string type, saved_with, said, resumes_with;
  };
  for (const Case& k :
       {Case{"bert", "--short-seq-prob 0.3",
             "samples of 48 tokens, short ones at --short-seq-prob 0.3, and this run's training data is ",
             "--short-seq-prob 0.3 --mask-prob 0.3"},
        Case{"t5", "--t5-masking whole-word",
             " (decoder 16), --t5-masking whole-word, and this run's training data is ", "--t5-masking whole-word"}}) {
    SCOPED_TRACE(k.type);
    mb::testing::TempDir tmp;
    const std::string c = (tmp / "c").string();
    auto r = mb::testing::run_command(train(tmp / "a", k.saved_with + " --train-iters 2 --save " + c, k.type));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = mb::testing::run_command(train(tmp / "b", "--load " + c + " --check", k.type));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find(k.said), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("--seq-length, --short-seq-prob and --t5-masking), or start a new run"), std::string::npos)
        << r.output;
    r = mb::testing::run_command(train(tmp / "b", k.resumes_with + " --load " + c + " --check", k.type));
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
}

// Rewinding a run (Megatron's --ckpt-step N: iteration N of --load's directory, not the newest;
// or --load naming an older file): the later checkpoints there are another trajectory's, set
// aside in DIR/earlier/1, so that --keep-checkpoints keeps this run's own (before, it kept the
// stale iteration 6 and removed the 3 just written, and the resume after failed) and the latest
// file names this run's; the metrics.h5 as it was (rows 1 to 6) is kept in RUN/earlier/1 before
// the rewound run drops its rows past 2. The rewound run resumed again finishes as the first
// did, bit for bit (a run is deterministic). A run started afresh into a --save directory sets
// aside what it holds; --ckpt-step's mistakes are named, and a run that would set aside the
// checkpoint it starts from (--finetune from its own --save) is refused.
TEST_F(Checkpoint, RewindingToAnEarlierCheckpointSetsTheLaterCheckpointsAndMetricsAside) {
  mb::testing::TempDir tmp;
  const fs::path c = tmp / "c", run = tmp / "run";
  auto r = mb::testing::run_command(train(run, "--save " + c.string() + " --save-interval 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> first = series(run / "metrics.h5", "train/lm_loss");
  r = mb::testing::run_command(train(run, "--save " + c.string() + " --save-interval 2 --load " + c.string() +
                                              " --ckpt-step 2 --exit-interval 3 "
                                              "--keep-checkpoints 1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(
      r.output.find("> note: " + c.string() +
                    " held checkpoints past iteration 2, where this run starts "
                    "(iterations 4, 6): another trajectory's, which this run's would mix with; they are kept in " +
                    (c / "earlier" / "1").string() + " ("),
      std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(" MiB; remove it when you no longer need them); " + (run / "metrics.h5").string() +
                          " as it was (iterations 1 to 6), whose rows past iteration 2 this run drops, is kept in " +
                          (run / "earlier" / "1").string()),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("loaded " + (c / "iter_0000002.h5").string()), std::string::npos) << r.output;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(c)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{".megabatch.lock", "earlier", "iter_0000003.h5",
                                             "latest_checkpointed_iteration.txt"}));
  EXPECT_TRUE(fs::exists(c / "earlier" / "1" / "iter_0000004.h5"));
  EXPECT_TRUE(fs::exists(c / "earlier" / "1" / "iter_0000006.h5"));
  EXPECT_EQ(series(run / "earlier" / "1" / "metrics.h5", "train/lm_loss"), first) << "the metrics as they were";
  EXPECT_EQ(series(run / "metrics.h5", "train/iteration"), (std::vector<double>{1, 2, 3}));
  // resumed: from this run's iteration 3, to the end the first run reached, bit for bit
  r = mb::testing::run_command(train(run, "--save " + c.string() + " --save-interval 2 --load " + c.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("loaded " + (c / "iter_0000003.h5").string()), std::string::npos) << r.output;
  EXPECT_EQ(series(run / "metrics.h5", "train/lm_loss"), first);
  expect_same_tensors(c / "earlier" / "1" / "iter_0000006.h5", c / "iter_0000006.h5");

  // afresh into a --save directory that holds checkpoints: all of them set aside
  r = mb::testing::run_command(train(tmp / "fresh", "--save " + c.string() + " --train-iters 1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(c.string() + " held checkpoints past iteration 0, where this run starts (iterations 3, 4, "
                                       "6): another trajectory's"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(c / "earlier" / "2" / "iter_0000006.h5"));

  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--load " + c.string() + " --ckpt-step 5",
            "--ckpt-step 5: " + c.string() +
                " holds no checkpoint of iteration 5 (it holds iterations 1); give one "
                "of them, or drop --ckpt-step to resume from the newest"},
           {"--load " + (c / "iter_0000001.h5").string() + " --ckpt-step 1",
            "--ckpt-step 1 picks a checkpoint of --load's directory, and --load names the file"},
           {"--ckpt-step 1",
            "--ckpt-step 1 picks a checkpoint of --load's directory, which is not given; add --load DIR"},
           // its starting weights would be set aside with the rest of --save's checkpoints
           {"--finetune --load " + c.string() + " --save " + c.string(),
            (c / "iter_0000001.h5").string() +
                ": this run starts at iteration 0 from its weights (--finetune), and "
                "they lie in its own --save directory, where its checkpoints would mix with the ones before it; give "
                "--save another directory"},
       }) {
    r = mb::testing::run_command(train(tmp / "mistake", args + " --check"));
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("train: error: " + message), std::string::npos) << args << "\n" << r.output;
  }
}

// Megatron's --iterations-to-skip: iterations 3 and 4 pass over their batches (samples 8 to 15)
// untrained: before them the run is the plain run bit for bit; after them its data position is
// the plain run's (consumed samples) while its learning rate is two steps behind (the schedule
// counts the steps taken, as Megatron's); no metrics row for them. Stopped at iteration 4 (a
// skipped one, checkpointed) and resumed, it gives the same bits; an iteration past the run's
// last is refused.
TEST_F(Checkpoint, IterationsToSkipPassOverTheirBatchesAndResumeBitwise) {
  mb::testing::TempDir tmp;
  auto r = mb::testing::run_command(train(tmp / "plain", ""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(train(tmp / "skip", "--iterations-to-skip 3 4"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> iteration 3 skipped (--iterations-to-skip): samples 8 to 11 passed over untrained\n"
                          "> iteration 4 skipped (--iterations-to-skip): samples 12 to 15 passed over untrained\n"),
            std::string::npos)
      << r.output;
  const fs::path plain = tmp / "plain" / "metrics.h5", skip = tmp / "skip" / "metrics.h5";
  EXPECT_EQ(series(skip, "train/iteration"), (std::vector<double>{1, 2, 5, 6}));
  EXPECT_EQ(series(skip, "train/consumed_samples"), (std::vector<double>{4, 8, 20, 24}));
  const auto lr = series(plain, "train/learning_rate"), loss = series(plain, "train/lm_loss");
  EXPECT_EQ(series(skip, "train/learning_rate"), (std::vector<double>{lr[0], lr[1], lr[2], lr[3]}));
  const auto skip_loss = series(skip, "train/lm_loss");
  ASSERT_EQ(skip_loss.size(), 4u);
  EXPECT_EQ(skip_loss[0], loss[0]);
  EXPECT_EQ(skip_loss[1], loss[1]);

  const fs::path c = tmp / "c";
  r = mb::testing::run_command(
      train(tmp / "split", "--iterations-to-skip 3 4 --save " + c.string() + " --save-interval 2 --exit-interval 4"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(fs::exists(c / "iter_0000004.h5"));
  r = mb::testing::run_command(train(
      tmp / "split", "--iterations-to-skip 3 4 --save " + c.string() + " --save-interval 2 --load " + c.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string s : {"train/iteration", "train/lm_loss", "train/learning_rate", "train/consumed_samples"})
    EXPECT_EQ(series(tmp / "split" / "metrics.h5", s), series(skip, s)) << s;

  r = mb::testing::run_command(train(tmp / "past", "--iterations-to-skip 2 7 --check"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("train: error: --iterations-to-skip 7 is past the run's last iteration (6), so it would "
                          "skip nothing; drop it"),
            std::string::npos)
      << r.output;
}

// Megatron's --use-checkpoint-args: an evaluation of a checkpoint given no model flag takes the
// model from it (family, sizes, positions, norms, MLP, heads' groups, biases, BERT's post-LN
// and heads, T5's relative buckets, their distances and its decoder, the tokenizer) and gives
// the validation loss the same evaluation gets with every flag given; a flag that contradicts
// the checkpoint is refused, naming both, as is a run with no checkpoint to take from. (Before,
// T5's buckets were not recorded: taken as the defaults, or loaded with other distances.)
TEST_F(Checkpoint, UseCheckpointArgsTakesTheModelFromTheCheckpoint) {
  mb::testing::TempDir tmp;
  const std::string gpt_arch =
      " --position-embedding-type rope --rotary-percent 0.5 --swiglu --group-query-attention --num-query-groups 1 "
      "--normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights "
      "--make-vocab-size-divisible-by 256";
  for (const auto& [type, arch] : {std::pair<std::string, std::string>{"gpt", gpt_arch},
                                   {"bert", " --post-layernorm --bert-no-binary-head"},
                                   {"t5",
                                    " --position-embedding-type relative --relative-attention-num-buckets 16 "
                                    "--relative-attention-max-distance 64"}}) {
    SCOPED_TRACE(type);
    const fs::path c = tmp / (type + "-ckpt");
    auto r =
        mb::testing::run_command(train(tmp / (type + "-run"), arch + " --train-iters 2 --save " + c.string(), type));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string data =
        (mb::testing::brown_data() / (type == "gpt" ? "brown_gpt2_text_document" : "brown_bert_text_sentence"))
            .string();
    const std::string eval = " --skip-train --load " + c.string() + " --micro-batch-size 2 --global-batch-size 4 " +
                             "--train-iters 2 --lr 1e-3 --eval-iters 2 --threads 1 --data-path " + data;
    // the reference: the training command's own flags
    r = mb::testing::run_command(train(tmp / (type + "-flags"), arch + eval, type));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = mb::testing::run_command(mb::testing::bin_dir() + "/train --use-checkpoint-args" + eval + " --run-dir " +
                                 (tmp / (type + "-taken")).string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("> model from " + (c / "iter_0000002.h5").string() +
                            " (--use-checkpoint-args): "
                            "--model-type " +
                            type + " --num-layers 2 --hidden-size 32 --num-attention-heads 2"),
              std::string::npos)
        << r.output;
    const auto taken = series(tmp / (type + "-taken") / "metrics.h5", "validation/lm_loss");
    ASSERT_EQ(taken.size(), 1u);
    EXPECT_EQ(taken, series(tmp / (type + "-flags") / "metrics.h5", "validation/lm_loss"));
    if (type == "t5") {  // other distances in the same buckets: the same names and shapes (before, it loaded)
      r = mb::testing::run_command(
          train(tmp / "t5-other",
                " --position-embedding-type relative --relative-attention-num-buckets 16" + eval + " --check", type));
      EXPECT_EQ(r.exit_code, 1) << r.output;
      EXPECT_NE(r.output.find((c / "iter_0000002.h5").string() +
                              ": it was trained with --relative-attention-max-distance 64 and this run has "
                              "--relative-attention-max-distance 128 (which distances between tokens share a row of "
                              "T5's position bias)"),
                std::string::npos)
          << r.output;
    }
    if (type != "gpt") continue;
    // a checkpoint from before the padding's multiple was recorded: one that pads to the same
    // size (the padding rows take part in the softmax)
    const auto edited = mb::testing::run_command(
        "/usr/bin/python3 -c \"import h5py, json\n"
        "f = h5py.File('" +
        (c / "iter_0000002.h5").string() +
        "', 'r+')\n"
        "m = json.loads(f.attrs['model']); del m['make_vocab_size_divisible_by']; f.attrs['model'] = json.dumps(m)\"");
    ASSERT_EQ(edited.exit_code, 0) << edited.output;
    r = mb::testing::run_command(mb::testing::bin_dir() + "/train --use-checkpoint-args" + eval + " --run-dir " +
                                 (tmp / "gpt-older").string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("--make-vocab-size-divisible-by 50432"), std::string::npos) << r.output;
    EXPECT_EQ(series(tmp / "gpt-older" / "metrics.h5", "validation/lm_loss"), taken);
  }
  const fs::path c = tmp / "gpt-ckpt";
  auto r = mb::testing::run_command(
      train(tmp / "mistake", "--use-checkpoint-args --load " + c.string() + " --check --hidden-size 48"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(
      r.output.find("train: error: --hidden-size 48 contradicts the model of " + (c / "iter_0000002.h5").string() +
                    ", whose hidden_size is 32 (--use-checkpoint-args takes the model from it); drop "
                    "--hidden-size, or --use-checkpoint-args"),
      std::string::npos)
      << r.output;
  r = mb::testing::run_command(
      train(tmp / "mistake", "--use-checkpoint-args --load " + (tmp / "none").string() + " --check"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("train: error: --use-checkpoint-args takes the model's options from the checkpoint the run "
                          "loads, and --load and --pretrained-checkpoint hold none"),
            std::string::npos)
      << r.output;
}

// io::set_aside_later_checkpoints alone: the files past the iteration move (a symlink stays,
// never followed), the latest file then names the newest left, or is gone where none is left;
// a second call takes the next earlier/N.
TEST(CheckpointFiles, SetAsideMovesTheLaterOnesAndTheLatestFileNamesTheNewestLeft) {
  mb::testing::TempDir tmp;
  const fs::path d = tmp / "c";
  fs::create_directories(d);
  for (const char* name : {"iter_0000002.h5", "iter_0000004.h5", "iter_0000006.h5", "notes.txt"})
    mb::write_file_atomic(d / name, name);
  fs::create_symlink(d / "iter_0000006.h5", d / "iter_0000008.h5");
  mb::write_file_atomic(d / "latest_checkpointed_iteration.txt", "6\n");
  auto aside = mb::io::set_aside_later_checkpoints(d, 3);
  EXPECT_EQ(aside.iterations, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(aside.to, d / "earlier" / "1");
  EXPECT_EQ(aside.bytes, 30) << "two files of 15 bytes";
  EXPECT_EQ(mb::read_file(d / "earlier" / "1" / "iter_0000006.h5"), "iter_0000006.h5");
  EXPECT_FALSE(fs::exists(d / "iter_0000004.h5"));
  EXPECT_TRUE(fs::exists(d / "notes.txt"));
  EXPECT_TRUE(fs::is_symlink(d / "iter_0000008.h5"));
  EXPECT_EQ(mb::read_file(d / "latest_checkpointed_iteration.txt"), "2\n");
  aside = mb::io::set_aside_later_checkpoints(d, 3);
  EXPECT_TRUE(aside.iterations.empty()) << "nothing past 3 is left (the symlink is not moved)";
  aside = mb::io::set_aside_later_checkpoints(d, 0);
  EXPECT_EQ(aside.iterations, (std::vector<int64_t>{2}));
  EXPECT_EQ(aside.to, d / "earlier" / "2");
  EXPECT_FALSE(fs::exists(d / "latest_checkpointed_iteration.txt"));
}

TEST_F(Checkpoint, KeepsTheNewestKCheckpoints) {
  mb::testing::TempDir tmp;
  const auto r = mb::testing::run_command(
      train(tmp / "run", "--save " + (tmp / "c").string() + " --save-interval 1 --keep-checkpoints 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(tmp / "c")) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{".megabatch.lock", "iter_0000005.h5", "iter_0000006.h5",
                                            "latest_checkpointed_iteration.txt"}));  // the lock: one run at a time
}

// --save-retain-interval R (Megatron's): the checkpoints of R's multiples stay for good; of the
// others, the newest (Megatron's) or, with --keep-checkpoints K, the newest K. R must be a
// multiple of --save-interval, which Megatron asserts, and needs --save.
TEST_F(Checkpoint, SaveRetainIntervalKeepsItsMultiplesForGood) {
  mb::testing::TempDir tmp;
  auto files = [](const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".h5") out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  };
  auto r = mb::testing::run_command(
      train(tmp / "r1", "--save " + (tmp / "c1").string() + " --save-interval 1 --save-retain-interval 4"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files(tmp / "c1"), (std::vector<std::string>{"iter_0000004.h5", "iter_0000006.h5"}));
  r = mb::testing::run_command(
      train(tmp / "r2",
            "--save " + (tmp / "c2").string() + " --save-interval 1 --save-retain-interval 2 --keep-checkpoints 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files(tmp / "c2"),
            (std::vector<std::string>{"iter_0000002.h5", "iter_0000004.h5", "iter_0000005.h5", "iter_0000006.h5"}));
  r = mb::testing::run_command(
      train(tmp / "r3", "--save " + (tmp / "c3").string() + " --save-interval 2 --save-retain-interval 3 --check"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--save-retain-interval 3 keeps the checkpoints of its multiples, which --save-interval 2 "
                          "does not write (Megatron asserts the same); make it a multiple of --save-interval"),
            std::string::npos)
      << r.output;
  r = mb::testing::run_command(train(tmp / "r4", "--save-retain-interval 2 --check"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--save-retain-interval 2 keeps checkpoints in --save, which is not given"),
            std::string::npos)
      << r.output;
}

// Each refusal is said by train --check too (and so by sweep run --dry-run), from the
// checkpoint's header and its datasets' shapes, before anything is loaded or trained.
TEST_F(Checkpoint, MismatchedModelOrOptimizerIsRefusedWithTheMismatchNamed) {
  mb::testing::TempDir tmp;
  const std::string c = (tmp / "c").string();
  auto r = mb::testing::run_command(train(tmp / "run", "--optimizer lamb --save " + c + " --train-iters 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(train(tmp / "r1", "--optimizer lamb --load " + c + " --check"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> check: configuration"), std::string::npos) << r.output;

  for (const std::string check : {"", " --check"}) {
    SCOPED_TRACE("refused" + check);
    // a run of `flags` that loads the checkpoint fails, saying `said`
    auto refused = [&](const std::string& flags, const std::string& said) {
      const auto f = mb::testing::run_command(train(tmp / "refused", flags + " --load " + c + check));
      EXPECT_EQ(f.exit_code, 1) << flags << ":\n" << f.output;
      EXPECT_NE(f.output.find(said), std::string::npos) << flags << ":\n" << f.output;
    };
    const std::string file = c + "/iter_0000002.h5: ";
    // another shape, or other names: the settings that differ named, and how to load it
    const std::string remedy =
        "; give the model flags it was trained with (or --use-checkpoint-args in their place, which takes them from "
        "the checkpoint)";
    refused("--optimizer lamb --ffn-hidden-size 64",
            file +
                "parameter 'decoder.layers.0.mlp.linear_fc1.weight' has shape [128, 32] in the checkpoint but "
                "[64, 32] in this run; its model has ffn_hidden_size 128 (this run: 64)" +
                remedy);
    refused("--optimizer lamb --untie-embeddings-and-output-weights",
            file +
                "this model has parameter 'output_layer.weight' that the checkpoint lacks; its model has "
                "untie_embeddings_and_output_weights false (this run: true)" +
                remedy);
    refused("--optimizer lamb --num-layers 1",
            file +
                "the checkpoint has parameter 'decoder.layers.1.input_layernorm.bias' that this model lacks (12 "
                "in all); its model has num_layers 2 (this run: 1)" +
                remedy);
    refused("--optimizer adamw",
            "optimizer state is from plugin 'lamb' but this run uses 'adamw'; resume with --optimizer lamb, or load "
            "only the model with --no-load-optim");
    refused("--optimizer lamb --seed 7", "written with --seed 1234 but this run has --seed 7");
    // the same names and shapes, another meaning: norm weights stored as the scale, read as 1 + w
    refused("--optimizer lamb --apply-layernorm-1p",
            file +
                "its norms' weights are stored as the scale itself and this run's as w, applied as 1 + w "
                "(--apply-layernorm-1p), so every norm would scale by 1 more or less; load it without "
                "--apply-layernorm-1p");
    // and another activation: GELU's weights read through a squared ReLU
    refused("--optimizer lamb --squared-relu",
            file +
                "it was trained without --squared-relu and this run has --squared-relu (the MLP's activation: "
                "squared ReLU, else GELU), which the weights' names and shapes do not tell, so they would load "
                "into another model; load it without --squared-relu");
    // and other heads: the same projections' rows, split into twice as many (before, it loaded)
    refused("--optimizer lamb --num-attention-heads 4",
            file +
                "it was trained with --num-attention-heads 2 and this run has --num-attention-heads 4 (which rows "
                "of the attention's projections make each head), which the weights' names and shapes do not "
                "tell, so they would load into another model; load it with --num-attention-heads 2");
    refused("--optimizer lamb --apply-residual-connection-post-layernorm",
            "it was trained without --apply-residual-connection-post-layernorm and this run has "
            "--apply-residual-connection-post-layernorm (the residual each block adds to: its norm's output, else its "
            "input)");
  }
  // other training data: the data position would count other samples; the weights alone may
  // start a run on any data
  r = mb::testing::run_command(train(tmp / "r9", "--optimizer lamb --split 80,10,10 --load " + c + " --check"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(c + "/iter_0000002.h5: its run trained on " + mb::testing::brown_data().string() +
                          "/brown_gpt2_text_document (500 documents, "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("training documents 0 to 400); samples of 16 tokens; the data position it resumes at (8 "
                          "samples) would count other samples than the run's own. Resume with the checkpoint's data"),
            std::string::npos)
      << r.output;
  r = mb::testing::run_command(
      train(tmp / "r9", "--optimizer lamb --split 80,10,10 --finetune --load " + c + " --check"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // rotary settings: which channels turn is the weights' meaning; the base may change (a longer
  // context's fine-tuning)
  const std::string rope = "--optimizer lamb --position-embedding-type rope --rotary-percent 0.5 ";
  r = mb::testing::run_command(train(tmp / "rope", rope + "--save " + c + "-rope --train-iters 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(train(tmp / "r8", rope + "--rotary-base 500000 --load " + c + "-rope --check"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(
      train(tmp / "r8", "--optimizer lamb --position-embedding-type rope --load " + c + "-rope --check"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("it was trained with --rotary-percent 0.5 and this run has --rotary-percent 1 (how many of "
                          "each head's channels turn)"),
            std::string::npos)
      << r.output;

  r = mb::testing::run_command(train(tmp / "r4", "--optimizer adamw --no-load-optim --load " + c));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(series(tmp / "r4" / "metrics.h5", "train/iteration"), (std::vector<double>{3, 4, 5, 6}));

  r = mb::testing::run_command(train(tmp / "r5", "--optimizer adamw --finetune --load " + c));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("starting at iteration 0"), std::string::npos) << r.output;
  EXPECT_EQ(series(tmp / "r5" / "metrics.h5", "train/iteration").size(), 6u);

  // Into a run on the compact dataset (32,735 tokens): only the vocabulary's padding may differ
  // (as between tensor-parallel sizes), not the tokens its rows stand for. Before, the first
  // 32,768 of GPT-2's rows loaded as the compact tokens' without a word.
  for (const auto& [dir, how] : {std::pair{"r7", "--optimizer lamb"}, std::pair{"r8", "--optimizer lamb --finetune"},
                                 std::pair{"r8", "--optimizer lamb --check"}}) {
    SCOPED_TRACE(how);
    std::string compact = train(tmp / dir, std::string(how) + " --load " + c);
    const std::string full = "brown_gpt2_text_document";
    compact.replace(compact.find(full), full.size(), "brown_gpt2_compact_text_document");
    r = mb::testing::run_command(compact);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(
        r.output.find(c + "/iter_0000002.h5: its model has a vocabulary of 50257 tokens, but this run's has 32735"),
        std::string::npos)
        << r.output;
  }

  // Into a run whose vocabulary has as many tokens but other ones (GPT-2's encoder.json with
  // the ids of "!" and '"' swapped, over a copy of the dataset without its tokenizer record):
  // refused by the tokenizer the checkpoint names, where it loaded before. The same
  // vocabulary from another path loads: the tokens decide, not the file's name.
  const fs::path plain = tmp / "plain";
  fs::create_directories(plain);
  for (const char* ext : {".bin", ".idx"})
    fs::copy_file(mb::testing::brown_data() / (std::string("brown_gpt2_text_document") + ext),
                  plain / (std::string("brown_gpt2_text_document") + ext));
  const std::string encoder_text = mb::testing::read_text(mb::asset_dir() / "gpt2" / "encoder.json");
  nlohmann::json encoder = nlohmann::json::parse(encoder_text);
  ASSERT_EQ(encoder["!"], 0);
  ASSERT_EQ(encoder["\""], 1);
  encoder["!"] = 1;
  encoder["\""] = 0;
  mb::testing::write_text(tmp / "swapped.json", encoder.dump());
  mb::testing::write_text(tmp / "same.json", encoder_text);
  for (const auto& [dir, vocab, refused] :
       {std::tuple{"r9", "swapped.json", true}, std::tuple{"r10", "same.json", false}}) {
    SCOPED_TRACE(vocab);
    std::string cmd = train(tmp / dir, "--optimizer lamb --load " + c + " --vocab-file " + (tmp / vocab).string());
    const std::string data = (mb::testing::brown_data() / "brown_gpt2_text_document").string();
    cmd.replace(cmd.find(data), data.size(), (plain / "brown_gpt2_text_document").string());
    r = mb::testing::run_command(cmd);
    EXPECT_EQ(r.exit_code, refused ? 1 : 0) << r.output;
    const std::string message = c +
                                "/iter_0000002.h5: its model was trained with a GPT2BPETokenizer vocabulary of 50257 "
                                "tokens (fnv1a64:";
    EXPECT_EQ(r.output.find(message) != std::string::npos, refused) << r.output;
    if (refused) {
      EXPECT_NE(r.output.find("vocabulary has as many but other ones (fnv1a64:"), std::string::npos) << r.output;
    }
  }
}

// --pretrained-checkpoint (Megatron's): a first start takes the weights of another run's
// checkpoint, as --finetune --load would, and a restart resumes from the run's own --load
// instead, so a sweep point can start from an earlier sweep's weights and still resume.
TEST_F(Checkpoint, APretrainedCheckpointStartsAFirstRunAndARestartResumesFromItsOwn) {
  mb::testing::TempDir tmp;
  const std::string a = (tmp / "a").string();
  auto r = mb::testing::run_command(train(tmp / "ra", "--optimizer lamb --save " + a + " --train-iters 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // the reference: the same weights through --finetune
  r = mb::testing::run_command(train(tmp / "finetuned", "--optimizer adamw --finetune --load " + a));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto reference = series(tmp / "finetuned" / "metrics.h5", "train/lm_loss");
  ASSERT_EQ(reference.size(), 6u);

  const std::string own = (tmp / "own").string();
  const std::string pretrained = "--optimizer adamw --pretrained-checkpoint " + a + " --save " + own + " --load " + own;
  r = mb::testing::run_command(train(tmp / "run", pretrained + " --save-interval 2 --exit-interval 3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> no checkpoint in " + own + "; a first start, from --pretrained-checkpoint"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("> loaded the model from " + a + "/iter_0000002.h5 (iteration 2, 8 samples); starting at iteration 0"),
            std::string::npos)
      << r.output;
  // restarted: its own checkpoint of iteration 3, not the pretrained weights again
  r = mb::testing::run_command(train(tmp / "run", pretrained));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> loaded " + own + "/iter_0000003.h5 (iteration 3, 12 samples)"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("loaded the model from"), std::string::npos) << r.output;
  EXPECT_EQ(series(tmp / "run" / "metrics.h5", "train/iteration"), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(series(tmp / "run" / "metrics.h5", "train/lm_loss"), reference)
      << "started from the pretrained weights with a fresh optimizer, and resumed bitwise";

  // refused: a directory with no checkpoint (a wrong path, not a first start), also by
  // --check; --finetune beside it (which of --load and it holds the weights?)
  fs::create_directories(tmp / "empty");
  for (const std::string check : {"", " --check"}) {
    r = mb::testing::run_command(train(tmp / "r2", "--pretrained-checkpoint " + (tmp / "empty").string() + check));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("train: error: --pretrained-checkpoint: " + (tmp / "empty").string() +
                            " holds no checkpoint to start from"),
              std::string::npos)
        << r.output;
  }
  r = mb::testing::run_command(train(tmp / "r3", "--pretrained-checkpoint " + a + " --finetune --load " + own));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("with --pretrained-checkpoint the model comes from there and --load is this run's own "
                          "checkpoints to resume from; drop --finetune"),
            std::string::npos)
      << r.output;
  // --check reads the checkpoint's header: another vocabulary (the compact dataset's) is refused
  std::string compact = train(tmp / "r4", "--pretrained-checkpoint " + a + " --check");
  const std::string full = "brown_gpt2_text_document";
  compact.replace(compact.find(full), full.size(), "brown_gpt2_compact_text_document");
  r = mb::testing::run_command(compact);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(a + "/iter_0000002.h5: its model has a vocabulary of 50257 tokens, but this run's has 32735"),
            std::string::npos)
      << r.output;
}

// --pretrained-optimizer-state: the first start takes the checkpoint's optimizer state too, with
// a fresh step count, as NVIDIA's BERT recipe carries LAMB's moments into phase 2 (and zeroes
// its step). Checked against AdamW's arithmetic over every tensor: at step 1 (learning rate 0
// in the warmup) B's moments are the checkpoint's decayed once plus what a start without them
// (C) adds, m_B = b1 m_A + m_C and v_B = b2 v_A + v_C, since both see the same weights, data
// and dropout; step 2's update of B's weights has the bias corrections of t = 2, not t = 4.
TEST_F(Checkpoint, APretrainedOptimizerStateCarriesTheMomentsAndRestartsTheStepCount) {
  mb::testing::TempDir tmp;
  const std::string a = (tmp / "a").string(), b = (tmp / "b").string(), c = (tmp / "c").string();
  const std::string adamw = "--optimizer adamw --weight-decay 0 ";
  auto r = mb::testing::run_command(train(tmp / "ra", adamw + "--save " + a + " --train-iters 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string from = "--pretrained-checkpoint " + a + " --train-iters 2 --save-interval 1 --save ";
  r = mb::testing::run_command(train(tmp / "rb", adamw + from + b + " --pretrained-optimizer-state"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> loaded the model and optimizer state from " + a +
                          "/iter_0000002.h5 (iteration 2, 8 samples); starting at iteration 0"),
            std::string::npos)
      << r.output;
  r = mb::testing::run_command(train(tmp / "rc", adamw + from + c));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lr = series(tmp / "rb" / "metrics.h5", "train/learning_rate");
  ASSERT_EQ(lr.size(), 2u);
  ASSERT_EQ(lr[0], 0.0) << "the warmup's first step";
  ASSERT_GT(lr[1], 0.0);
  const auto check = mb::testing::run_command(
      "/usr/bin/python3 -c \"import h5py, numpy as np\n"
      "A, B1, B2, C1 = (h5py.File(f) for f in ('" +
      a + "/iter_0000002.h5', '" + b + "/iter_0000001.h5', '" + b + "/iter_0000002.h5', '" + c +
      "/iter_0000001.h5'))\n"
      "b1, b2, eps, lr, t = 0.9, 0.999, 1e-8, " +
      nlohmann::json(lr[1]).dump() +
      ", 2\n"
      "g = lambda f, n: f[n][()].astype(np.float64)\n"
      "worst = {'m': 0.0, 'v': 0.0, 'w': 0.0}\n"
      "for name in A['params']:\n"
      "  m, v = 'optimizer/' + name + '/exp_avg', 'optimizer/' + name + '/exp_avg_sq'\n"
      "  for key, k, beta in (('m', m, b1), ('v', v, b2)):\n"
      "    ref = beta * g(A, k) + g(C1, k)\n"
      "    worst[key] = max(worst[key], np.max(np.abs(g(B1, k) - ref)) / max(np.max(np.abs(ref)), 1e-30))\n"
      "  w = g(B1, 'params/' + name) - lr / (1 - b1 ** t) * g(B2, m) / (np.sqrt(g(B2, v)) / np.sqrt(1 - b2 ** t) + "
      "eps)\n"
      "  worst['w'] = max(worst['w'], np.max(np.abs(g(B2, 'params/' + name) - w)))\n"
      "print('worst', worst['m'], worst['v'], worst['w'], 'of', len(A['params']), 'tensors')\n"
      "assert worst['m'] < 1e-5 and worst['v'] < 1e-5 and worst['w'] < 1e-6, worst\n"
      "print('moments carried, step count from 1')\"");
  EXPECT_NE(check.output.find("moments carried, step count from 1"), std::string::npos) << check.output;

  // refused: without --pretrained-checkpoint; from a checkpoint of another plugin, by --check too
  r = mb::testing::run_command(train(tmp / "r1", "--pretrained-optimizer-state"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--pretrained-optimizer-state takes the optimizer state from --pretrained-checkpoint, "
                          "which is not given"),
            std::string::npos)
      << r.output;
  for (const std::string check_flag : {"", " --check"}) {
    r = mb::testing::run_command(train(
        tmp / "r2", "--optimizer lamb --pretrained-checkpoint " + a + " --pretrained-optimizer-state" + check_flag));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(a + "/iter_0000002.h5: --pretrained-optimizer-state takes its optimizer state, which is "
                                "from plugin 'adamw', but this run uses 'lamb'; give --optimizer adamw"),
              std::string::npos)
        << check_flag << "\n"
        << r.output;
  }
}

// sgd with --pretrained-optimizer-state carries its momentum buffer: step 1 adds the gradient
// undamped to the checkpoint's, b_B = mu b_A + g, where a start without it (C) ends step 1 with
// b_C = g (torch.optim.SGD's seeding of an empty buffer), since both see the same weights, data
// and dropout. Before, step 1 overwrote the loaded buffer with g and carried nothing.
TEST_F(Checkpoint, APretrainedOptimizerStateCarriesSgdsMomentumBuffer) {
  mb::testing::TempDir tmp;
  const std::string a = (tmp / "a").string(), b = (tmp / "b").string(), c = (tmp / "c").string();
  const std::string sgd = "--optimizer sgd --optimizer-params momentum=0.8 --weight-decay 0 ";
  auto r = mb::testing::run_command(train(tmp / "ra", sgd + "--save " + a + " --train-iters 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string from = "--pretrained-checkpoint " + a + " --train-iters 1 --save-interval 1 --save ";
  r = mb::testing::run_command(train(tmp / "rb", sgd + from + b + " --pretrained-optimizer-state"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(train(tmp / "rc", sgd + from + c));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto check = mb::testing::run_command(
      "/usr/bin/python3 -c \"import h5py, numpy as np\n"
      "A, B, C = (h5py.File(f) for f in ('" +
      a + "/iter_0000002.h5', '" + b + "/iter_0000001.h5', '" + c +
      "/iter_0000001.h5'))\n"
      "g = lambda f, n: f['optimizer/' + n + '/momentum_buffer'][()].astype(np.float64)\n"
      "worst, carried = 0.0, 0.0\n"
      "for n in A['params']:\n"
      "  ref = 0.8 * g(A, n) + g(C, n)\n"
      "  worst = max(worst, np.max(np.abs(g(B, n) - ref)) / max(np.max(np.abs(ref)), 1e-30))\n"
      "  carried = max(carried, np.max(np.abs(0.8 * g(A, n))) / max(np.max(np.abs(ref)), 1e-30))\n"
      "print('worst', worst, 'carried', carried, 'of', len(A['params']), 'tensors')\n"
      "assert worst < 1e-6 and carried > 1e-2, (worst, carried)\n"
      "print('momentum carried')\"");
  EXPECT_NE(check.output.find("momentum carried"), std::string::npos) << check.output;
}

// A weight-decay schedule resumes where it was: a run stopped at iteration 2 and resumed goes
// on as the uninterrupted one, bit for bit. A resumed run whose flags give another schedule,
// or a constant weight decay for a scheduled one, is refused naming both values (Megatron's
// OptimizerParamScheduler checks start_wd, end_wd and the style), unless a flag says which
// to keep.
TEST_F(Checkpoint, AWeightDecayScheduleResumesWhereItWasAndAnotherOneIsRefused) {
  mb::testing::TempDir tmp;
  const std::string linear = "--weight-decay-incr-style linear --start-weight-decay 0 --end-weight-decay 0.3 ";
  auto r = mb::testing::run_command(train(tmp / "whole", linear));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto wd = series(tmp / "whole" / "metrics.h5", "train/weight_decay");
  ASSERT_EQ(wd.size(), 6u);
  for (size_t i = 0; i < 6; ++i)  // 4 samples an iteration over 24: 0.3 x 4i / 24
    EXPECT_NEAR(wd[i], 0.05 * static_cast<double>(i), 1e-15) << "iteration " << i + 1;
  r = mb::testing::run_command(train(tmp / "first", linear + "--save " + (tmp / "c").string() + " --exit-interval 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto resume = [&](const std::string& name, const std::string& flags) {
    const fs::path c = tmp / ("c_" + name);
    fs::copy(tmp / "c", c, fs::copy_options::recursive);
    return mb::testing::run_command(train(tmp / name, flags + " --load " + c.string()));
  };
  r = resume("resumed", linear);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* s : {"train/weight_decay", "train/lm_loss", "train/grad_norm"}) {
    const auto whole = series(tmp / "whole" / "metrics.h5", s);
    EXPECT_EQ(series(tmp / "resumed" / "metrics.h5", s), std::vector<double>(whole.begin() + 2, whole.end())) << s;
  }

  const std::pair<std::string, std::string> refused[] = {
      {"--weight-decay-incr-style linear --start-weight-decay 0 --end-weight-decay 0.2",
       " was trained with another learning-rate or weight-decay schedule than this run's flags give, so the resumed "
       "run would go on with another one: --end-weight-decay 0.3 in the checkpoint, 0.2 in this run. Give the flags"},
      {"",  // the constant weight decay, adamw's 0.01
       "--weight-decay-incr-style linear in the checkpoint, constant in this run; --start-weight-decay 0 in the "
       "checkpoint, 0.01 in this run; --end-weight-decay 0.3 in the checkpoint, 0.01 in this run"}};
  for (size_t k = 0; k < std::size(refused); ++k) {
    r = resume("refused" + std::to_string(k), refused[k].first);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(refused[k].second), std::string::npos) << r.output;
  }
  r = resume("taken",
             "--weight-decay-incr-style linear --start-weight-decay 0 --end-weight-decay 0.2 "
             "--override-opt-param-scheduler");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto taken = series(tmp / "taken" / "metrics.h5", "train/weight_decay");
  ASSERT_EQ(taken.size(), 4u);
  for (size_t i = 0; i < 4; ++i)  // iterations 3 to 6 of this run's schedule: 0.2 x 4 (i + 2) / 24
    EXPECT_NEAR(taken[i], 0.2 * static_cast<double>(i + 2) / 6.0, 1e-15) << "iteration " << i + 3;

  // A constant weight decay kept from the checkpoint is the one the plugin decays by: the run
  // goes on as the uninterrupted one (adamw's 0.01), not at this run's --weight-decay.
  r = mb::testing::run_command(train(tmp / "plain", ""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string plain = (tmp / "plain_c").string();
  r = mb::testing::run_command(train(tmp / "plain_first", "--save " + plain + " --exit-interval 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(
      train(tmp / "kept", "--weight-decay 0.05 --use-checkpoint-opt-param-scheduler --load " + plain));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> learning-rate and weight-decay schedule: the checkpoint's "
                          "(--use-checkpoint-opt-param-scheduler), where weight decay (--weight-decay) 0.01 in the "
                          "checkpoint, 0.05 in this run"),
            std::string::npos)
      << r.output;
  const auto whole = series(tmp / "plain" / "metrics.h5", "train/lm_loss");
  EXPECT_EQ(series(tmp / "kept" / "metrics.h5", "train/lm_loss"), std::vector<double>(whole.begin() + 2, whole.end()));
}

// --exit-duration-in-mins (Megatron's): a run made long by its configuration (100000
// iterations) with a budget below any iteration's time (60 microseconds) stops after its first
// iteration, checkpoints it and exits 3 (resumable, as a stop by signal), whatever the machine's
// speed; resumed, it goes on to its end.
TEST_F(Checkpoint, ExitDurationStopsAtACheckpointAndTheRunResumesFromIt) {
  mb::testing::TempDir tmp;
  const std::string ckpt = (tmp / "c").string();
  auto r = mb::testing::run_command(
      train(tmp / "first", "--train-iters 100000 --exit-duration-in-mins 1e-6 --save " + ckpt));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find(" exiting after iteration 1, "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" minutes into training (--exit-duration-in-mins 1e-06); resume with --load " + ckpt),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(tmp / "c" / "iter_0000001.h5")) << r.output;
  EXPECT_EQ(series(tmp / "first" / "metrics.h5", "train/iteration"), (std::vector<double>{1}));
  r = mb::testing::run_command(train(tmp / "second", "--train-iters 3 --load " + ckpt));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("iter_0000001.h5 (iteration 1,"), std::string::npos) << r.output;
  EXPECT_EQ(series(tmp / "second" / "metrics.h5", "train/iteration"), (std::vector<double>{2, 3}));
}

// A checkpoint's attributes edited by hand (h5py) or damaged, or the file cut short: each is
// refused naming the file, the attribute and the field, with what to do; before, the JSON library's type or
// parse error surfaced as "internal error" (exit 2) naming nothing. Put back, it resumes.
// A resumed run whose flags give another learning-rate schedule than its checkpoint was
// trained with is refused, naming the settings (Megatron's OptimizerParamScheduler check); the
// checkpoint's schedule is kept with --use-checkpoint-opt-param-scheduler (the run then goes on
// as the uninterrupted one, bit for bit), this run's taken with --override-opt_param-scheduler
// (Megatron's spelling).
TEST_F(Checkpoint, AResumeWithAnotherScheduleIsRefusedUnlessAFlagSaysWhichToKeep) {
  mb::testing::TempDir tmp;
  auto r = mb::testing::run_command(train(tmp / "whole", ""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto whole = [&](const char* s) {  // iterations 3 to 6 of the uninterrupted run
    const auto v = series(tmp / "whole" / "metrics.h5", s);
    return std::vector<double>(v.begin() + 2, v.end());
  };
  ASSERT_EQ(whole("train/learning_rate").size(), 4u);
  r = mb::testing::run_command(train(tmp / "first", "--save " + (tmp / "c").string() + " --exit-interval 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // each resumed run from its own copy of the checkpoint of iteration 2
  auto resume = [&](const std::string& name, const std::string& flags) {
    const fs::path c = tmp / ("c_" + name);
    fs::copy(tmp / "c", c, fs::copy_options::recursive);
    return mb::testing::run_command(train(tmp / name, flags + " --load " + c.string()));
  };

  for (const std::string check : {"", " --check"}) {  // train --check refuses it too
    const std::string name = check.empty() ? "refused" : "refused_by_check";
    r = resume(name, "--lr 6e-3 --min-lr 1e-4" + check);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find((tmp / ("c_" + name) / "iter_0000002.h5").string() +
                            " was trained with another learning-rate or weight-decay schedule than this run's flags "
                            "give, so the resumed run would go on with another one: peak learning rate (--lr, after "
                            "--lr-scaling) 0.003 in "
                            "the checkpoint, 0.006 in this run; --min-lr (after --lr-scaling) 0 in the checkpoint, "
                            "1e-04 in this run. Give the flags the checkpoint was trained with, or "
                            "--use-checkpoint-opt-param-scheduler to keep its schedule, or "
                            "--override-opt-param-scheduler to take this run's"),
              std::string::npos)
        << r.output;
    EXPECT_FALSE(fs::exists(tmp / name / "config.json")) << "refused before the run directory is written";
  }

  r = resume("kept", "--lr 6e-3 --use-checkpoint-opt-param-scheduler");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> learning-rate and weight-decay schedule: the checkpoint's "
                          "(--use-checkpoint-opt-param-scheduler), where "
                          "peak learning rate (--lr, after --lr-scaling) 0.003 in the checkpoint, 0.006 in this run"),
            std::string::npos)
      << r.output;
  for (const char* s : {"train/learning_rate", "train/lm_loss"})
    EXPECT_EQ(series(tmp / "kept" / "metrics.h5", s), whole(s)) << s;

  r = resume("taken", "--lr 6e-3 --override-opt_param-scheduler");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto taken = series(tmp / "taken" / "metrics.h5", "train/learning_rate"), lr = whole("train/learning_rate");
  ASSERT_EQ(taken.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(taken[i], 2 * lr[i]) << "iteration " << i + 3;

  // Only the settings that move the learning rate count: a constant schedule has no decay span
  // (8 samples, then the fixture's 24), so it resumes as it is.
  const std::string constant = (tmp / "c_constant").string();
  r = mb::testing::run_command(
      train(tmp / "constant", "--lr-decay-style constant --lr-decay-iters 2 --train-iters 2 --save " + constant));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(train(tmp / "constant", "--lr-decay-style constant --load " + constant));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("iter_0000002.h5 (iteration 2,"), std::string::npos) << r.output;

  // the two flags together, and either without --load
  r = resume("both", "--override-opt-param-scheduler --use-checkpoint-opt-param-scheduler");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--override-opt-param-scheduler takes this run's learning-rate schedule and "
                          "--use-checkpoint-opt-param-scheduler the checkpoint's; give one of them"),
            std::string::npos)
      << r.output;
  r = mb::testing::run_command(train(tmp / "alone", "--use-checkpoint-opt-param-scheduler"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--use-checkpoint-opt-param-scheduler says how to load from --load, which is not given"),
            std::string::npos)
      << r.output;
}

// Megatron's WSD schedule (--lr-decay-style WSD) with --lr-warmup-init: the learning rates the
// run logs are those of Megatron's formula, worked out by hand, and a run stopped in its stable
// phase resumes bit for bit; a resume with another WSD decay is refused, naming it.
TEST_F(Checkpoint, AWsdRunFollowsMegatronsScheduleAndResumesBitwise) {
  mb::testing::TempDir tmp;
  // batch 4: warmup 8 samples from 1e-3, decay span 24, its last 12 linear to 0
  const std::string wsd =
      "--lr-decay-style WSD --lr-wsd-decay-iters 3 --lr-wsd-decay-style linear --lr-warmup-init 1e-3";
  auto r = mb::testing::run_command(train(tmp / "whole", wsd));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(
      r.output.find("lr 0.003 WSD (stable until sample 12, then linear over 12) to 0, warmup 8 samples from 0.001"),
      std::string::npos)
      << r.output;
  // iteration k at the 4 (k - 1) samples before it: warmup 1e-3 + 2e-3 s / 8, the peak to
  // sample 12, then 3e-3 (1 - (s - 12) / 12)
  const std::vector<double> expected = {1e-3, 2e-3, 3e-3, 3e-3, 2e-3, 1e-3};
  const auto lr = series(tmp / "whole" / "metrics.h5", "train/learning_rate");
  ASSERT_EQ(lr.size(), expected.size());
  for (size_t i = 0; i < lr.size(); ++i) EXPECT_NEAR(lr[i], expected[i], 1e-15) << "iteration " << i + 1;

  const std::string c = (tmp / "c").string();
  r = mb::testing::run_command(train(tmp / "first", wsd + " --save " + c + " --exit-interval 3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = mb::testing::run_command(train(tmp / "other",
                                     "--lr-decay-style WSD --lr-wsd-decay-iters 2 --lr-wsd-decay-style "
                                     "linear --lr-warmup-init 1e-3 --load " +
                                         c));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("WSD's decay (samples: --lr-wsd-decay-*) 12 in the checkpoint, 8 in this run"),
            std::string::npos)
      << r.output;
  r = mb::testing::run_command(train(tmp / "resumed", wsd + " --load " + c));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* name : {"train/learning_rate", "train/lm_loss"}) {
    const auto whole = series(tmp / "whole" / "metrics.h5", name);
    EXPECT_EQ(series(tmp / "resumed" / "metrics.h5", name), std::vector<double>(whole.begin() + 3, whole.end()))
        << name;
  }
}

TEST_F(Checkpoint, ADamagedAttributeIsNamedWithTheFileAndTheField) {
  mb::testing::TempDir tmp;
  const std::string c = (tmp / "c").string();
  auto r = mb::testing::run_command(train(tmp / "run", "--save " + c + " --train-iters 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string file = (tmp / "c" / "iter_0000002.h5").string();
  fs::copy_file(file, (tmp / "original.h5"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a.attrs['iteration'] = 'two'", "attribute 'iteration' is \"two\", not an integer >= 0"},
      {"a.attrs['consumed_samples'] = -4", "attribute 'consumed_samples' is -4, not an integer >= 0"},
      {"a.attrs['seed'] = 1.5", "attribute 'seed' is 1.5, not an integer"},
      {"a.attrs['model'] = '{bad'", "attribute 'model': not valid JSON (parse error at line 1, column 2"},
      {"a.attrs['model'] = '[1, 2]'", "attribute 'model' is [1,2], not a JSON object"},
      {"a.attrs['optimizer'] = 3", "attribute 'optimizer' is 3, not a string"},
      {"m = json.loads(a.attrs['model']); m['tokenizer'] = {'tokenizer_type': 'GPT2BPETokenizer'}; "
       "a.attrs['model'] = json.dumps(m)",
       "attribute 'model': tokenizer is {\"tokenizer_type\":\"GPT2BPETokenizer\"}, not an object of a tokenizer_type "
       "and a vocab_fingerprint string"},
      {"t = json.loads(a.attrs['trainer']); t['loss_scaler']['scale'] = 'x'; a.attrs['trainer'] = json.dumps(t)",
       "attribute 'trainer': loss_scaler.scale is \"x\", not a number"},
      {"t = json.loads(a.attrs['trainer']); t['lr_samples'] = 2.5; a.attrs['trainer'] = json.dumps(t)",
       "attribute 'trainer': lr_samples is 2.5, not an integer"},
      {"t = json.loads(a.attrs['trainer']); del t['noise_scale']['count']; a.attrs['trainer'] = json.dumps(t)",
       "attribute 'trainer': no 'noise_scale.count'"},
      {"t = json.loads(a.attrs['trainer']); t['lr_schedule']['style'] = 'zigzag'; a.attrs['trainer'] = json.dumps(t)",
       "attribute 'trainer': lr_schedule.style is \"zigzag\", not a decay style"},
      {"t = json.loads(a.attrs['trainer']); t['lr_schedule']['max_lr'] = 'x'; a.attrs['trainer'] = json.dumps(t)",
       "attribute 'trainer': lr_schedule.max_lr is \"x\", not a number"},
  };
  for (const auto& [edit, expected] : cases) {
    SCOPED_TRACE(edit);
    fs::copy_file(tmp / "original.h5", file, fs::copy_options::overwrite_existing);
    r = mb::testing::run_command("/usr/bin/python3 -c \"import h5py, json\na = h5py.File('" + file + "', 'r+')\n" + edit +
                                 "\"");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = mb::testing::run_command(train(tmp / "resumed", "--load " + c + " --train-iters 3"));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(file + ": " + expected), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("edited or damaged: move it away"), std::string::npos) << r.output;
  }
  // cut short (a disk that failed, a copy that stopped), said with the sizes; not HDF5 at all
  const auto size = fs::file_size(file);
  fs::resize_file(file, 3000);
  r = mb::testing::run_command(train(tmp / "resumed", "--load " + c + " --train-iters 3"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(file + ": cut short: 3000 of its " + std::to_string(size) +
                          " bytes are there; the file was edited or damaged: move it away"),
            std::string::npos)
      << r.output;
  mb::testing::write_text(file, "not a checkpoint\n");
  r = mb::testing::run_command(train(tmp / "resumed", "--load " + c + " --train-iters 3"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(file + ": not a readable HDF5 file; the file was edited or damaged: move it away"),
            std::string::npos)
      << r.output;
  fs::copy_file(tmp / "original.h5", file, fs::copy_options::overwrite_existing);
  r = mb::testing::run_command(train(tmp / "resumed", "--load " + c + " --train-iters 3"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("iter_0000002.h5 (iteration 2,"), std::string::npos) << r.output;
}

// Tensor data altered on disk (one byte of a chunk, as a failing disk or a bad copy does)
// is refused naming the file and the tensor: every tensor carries HDF5's Fletcher-32
// checksum, which h5py checks too. --load DIR then offers the newest intact checkpoint, and
// --load-fallback takes it; --load FILE loads that file (before, it trained from scratch).
TEST_F(Checkpoint, ADamagedTensorIsRefusedAndTheNewestIntactCheckpointIsOffered) {
  mb::testing::TempDir tmp;
  const std::string c = (tmp / "c").string();
  auto r = mb::testing::run_command(train(tmp / "run", "--save " + c + " --save-interval 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string newest = (tmp / "c" / "iter_0000006.h5").string(), older = (tmp / "c" / "iter_0000004.h5").string();
  // flip one byte in the middle of the first chunk of the largest parameter
  r = mb::testing::run_command(
      "/usr/bin/python3 -c \"import h5py\n"
      "f = h5py.File('" + newest + "', 'r')\n"
      "sets = []\n"
      "f['params'].visititems(lambda n, d: sets.append((d.size, 'params/' + n)) if isinstance(d, h5py.Dataset) else None)\n"
      "name = max(sets)[1]; chunk = f[name].id.get_chunk_info(0)\n"
      "f.close()\n"
      "with open('" + newest + "', 'r+b') as out:\n"
      "    out.seek(chunk.byte_offset + chunk.size // 2); b = out.read(1); out.seek(-1, 1); out.write(bytes([b[0] ^ 0x10]))\n"
      "print(name)\n"
      "try:\n"
      "    h5py.File('" + newest + "', 'r')[name][()]\n"
      "except OSError as e:\n"
      "    print('h5py:', e)\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string tensor = r.output.substr(0, r.output.find('\n'));
  EXPECT_NE(r.output.find("h5py: Can't read data"), std::string::npos) << "h5py verifies the checksum too: " << r.output;

  r = mb::testing::run_command(train(tmp / "resumed", "--load " + c + " --train-iters 8"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("train: error: " + newest + ": tensor '" + tensor +
                          "' does not match its checksum: the file was damaged after it was written; the newest intact "
                          "checkpoint in " + c + " is " + older + " (iteration 4): resume from it with --load-fallback (or "
                          "--load " + older + ")"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(tmp / "resumed" / "metrics.h5")) << "refused before anything was written";

  r = mb::testing::run_command(train(tmp / "resumed", "--load " + c + " --load-fallback --train-iters 8"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> warning: " + newest + ": tensor '" + tensor + "' does not match its checksum"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resuming from the newest intact checkpoint, " + older + " (iteration 4) (--load-fallback)"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> loaded " + older + " (iteration 4, 16 samples)"), std::string::npos) << r.output;
  EXPECT_EQ(series(tmp / "resumed" / "metrics.h5", "train/iteration"), (std::vector<double>{5, 6, 7, 8}));

  // --load FILE: that checkpoint, whatever is newer beside it
  const std::string oldest = (tmp / "c" / "iter_0000002.h5").string();
  r = mb::testing::run_command(train(tmp / "from_file", "--load " + oldest + " --train-iters 3"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> loaded " + oldest + " (iteration 2, 8 samples)"), std::string::npos) << r.output;
  r = mb::testing::run_command(train(tmp / "from_file", "--load " + newest + " --train-iters 8"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(newest + ": tensor '" + tensor + "' does not match its checksum"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("give --load another checkpoint"), std::string::npos) << r.output;
  // the weights a run starts from, damaged: the intact one is offered as that option's value,
  // with no fallback (a first start should not silently take older weights)
  r = mb::testing::run_command(train(tmp / "pretrained", "--pretrained-checkpoint " + c));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the newest intact checkpoint in " + c + " is " + older +
                          " (iteration 4): start from it with --pretrained-checkpoint " + older),
            std::string::npos)
      << r.output;
  // the latest file damaged: refused naming it (before, read as no number, and the run
  // started from scratch or from whichever checkpoint was newest)
  mb::testing::write_text(tmp / "c" / "latest_checkpointed_iteration.txt", "6x\n");
  r = mb::testing::run_command(train(tmp / "latest", "--load " + c + " --train-iters 8"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find((tmp / "c" / "latest_checkpointed_iteration.txt").string() +
                          ": '6x' is not an iteration number (it was damaged); remove it to fall back"),
            std::string::npos) << r.output;
}

TEST_F(Checkpoint, SigusrOneCheckpointsAtTheEndOfTheIterationAndExitsThree) {
  mb::testing::TempDir tmp;
  const std::string log = (tmp / "log").string(), c = (tmp / "c").string();
  const auto r = mb::testing::run_command(
      "(" + train(tmp / "run", "--train-iters 100000 --save " + c) + " > " + log + " 2>&1 & echo $! > " + (tmp / "pid").string() +
      "; wait $!; echo exit=$? >> " + log + ") & " + mb::testing::wait_for_line(log, "iteration  *3/") +
      "kill -USR1 $(cat " + (tmp / "pid").string() + "); wait; cat " + log);
  EXPECT_NE(r.output.find("exit=3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stopped by signal 10"), std::string::npos) << r.output;
  // The checkpoint is of the last finished iteration, and the run continues from it.
  const auto iters = series(tmp / "run" / "metrics.h5", "train/iteration");
  ASSERT_FALSE(iters.empty());
  const auto resumed = mb::testing::run_command(train(tmp / "run", "--train-iters " + std::to_string(static_cast<int>(iters.back()) + 2) +
                                                                       " --save " + c + " --load " + c));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("(iteration " + std::to_string(static_cast<int>(iters.back())) + ","), std::string::npos)
      << resumed.output;
}

// Ctrl-C: the first SIGINT checkpoints at the end of the iteration and exits 3, as SIGUSR1;
// a second one, sent while the first is being handled, ends the process at once.
TEST_F(Checkpoint, CtrlCCheckpointsAndASecondCtrlCExitsAtOnce) {
  mb::testing::TempDir tmp;
  const std::string log = (tmp / "log").string(), c = (tmp / "c").string();
  // `set -m`: a background job of a script otherwise starts with SIGINT ignored (and train
  // then leaves it so)
  auto run = [&](const std::string& cmd, const std::string& signals) {
    return mb::testing::run_command("bash -c 'set -m; " + cmd + " > " + log +
                                    " 2>&1 & pid=$!; for i in $(seq 6000); do grep -q \"iteration  *3/\" " + log +
                                    " && break; sleep 0.05; done; " + signals + "; wait $pid; echo exit=$? >> " + log +
                                    "; cat " + log + "'");
  };
  auto r = run(train(tmp / "run", "--train-iters 100000 --save " + c), "kill -INT $pid");
  EXPECT_NE(r.output.find("received SIGINT"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stopped by signal 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exit=3"), std::string::npos) << r.output;
  const auto iters = series(tmp / "run" / "metrics.h5", "train/iteration");
  ASSERT_FALSE(iters.empty());
  EXPECT_EQ(mb::testing::read_text(fs::path(c) / "latest_checkpointed_iteration.txt"), std::to_string(static_cast<int>(iters.back())) + "\n")
      << "the checkpoint is of the last finished iteration";
  // The second Ctrl-C is sent as soon as the first has been heard ("received SIGINT" in the
  // log), while the run finishes its iteration: iterations of a few seconds here (gpt-mini,
  // two micro-batches of 8), so the rest of one and the checkpoint that would follow are far
  // longer than the wait for that line, on any machine. It ends the process (128 + 2) before
  // it writes a checkpoint.
  const std::string c2 = (tmp / "c2").string();
  r = run(mb::testing::bin_dir() + "/train --model gpt-mini --micro-batch-size 8 --global-batch-size 16 --train-iters 1000 "
          "--lr 1e-4 --log-interval 1 --eval-iters 0 " + mb::testing::threads_flag() + "--save " + c2 + " --data-path " +
          (mb::testing::brown_data() / "brown_gpt2_text_document").string() + " --run-dir " + (tmp / "run2").string(),
          "kill -INT $pid; for i in $(seq 12000); do grep -q \"received SIGINT\" " + log +
              " && break; sleep 0.005; done; kill -INT $pid");
  EXPECT_NE(r.output.find("received SIGINT"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exit=130"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(fs::path(c2) / "latest_checkpointed_iteration.txt")) << r.output;
  EXPECT_GE(series(tmp / "run2" / "metrics.h5", "train/iteration").size(), 3u) << "the metrics logged before stay readable";
}

// SIGKILL while the checkpoint of iteration 4 is being written (its .tmp exists): the
// checkpoint of iteration 2 stays the latest, loads, and the run continues from it.
TEST_F(Checkpoint, KillDuringAWriteLeavesThePreviousCheckpointLoadable) {
  mb::testing::TempDir tmp;
  const std::string c = (tmp / "c").string(), log = (tmp / "log").string(), pid = (tmp / "pid").string();
  // gpt-mini's shapes: a checkpoint of 16 M parameters and two AdamW buffers takes a while to write.
  const std::string cmd = mb::testing::bin_dir() +
                          "/train --model gpt-mini --micro-batch-size 1 --seq-length 32 "
                          "--lr 1e-4 --lr-decay-style constant --log-interval 1 --eval-iters 0 " +
                          mb::testing::threads_flag() + "--save " + c + " --save-interval 2 --data-path " +
                          (mb::testing::brown_data() / "brown_gpt2_text_document").string() + " --run-dir " +
                          (tmp / "run").string();
  bool caught = false;
  for (int attempt = 0; attempt < 3 && !caught; ++attempt) {
    fs::remove_all(c);
    const auto r = mb::testing::run_command(
        "(" + cmd + " --train-iters 1000 > " + log + " 2>&1 & echo $! > " + pid + ") ; for i in $(seq 20000); do "
        "if [ -e " + c + "/iter_0000004.h5.tmp ]; then kill -9 $(cat " + pid + "); echo caught; break; fi; "
        "sleep 0.001; done; kill -9 $(cat " + pid + ") 2>/dev/null; while kill -0 $(cat " + pid +
        ") 2>/dev/null; do sleep 0.01; done; true");
    caught = r.output.find("caught") != std::string::npos && !fs::exists(fs::path(c) / "iter_0000004.h5");
  }
  ASSERT_TRUE(caught) << "never killed the process during the write of iteration 4's checkpoint";
  std::ifstream latest(fs::path(c) / "latest_checkpointed_iteration.txt");
  int it = 0;
  latest >> it;
  EXPECT_EQ(it, 2);
  const auto resumed = mb::testing::run_command(cmd + " --train-iters 3 --load " + c);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("iter_0000002.h5 (iteration 2,"), std::string::npos) << resumed.output;
}
