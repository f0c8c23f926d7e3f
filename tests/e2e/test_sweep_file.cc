// The sweep file and its points, checked before anything runs (sweep run --dry-run and
// train --check per point): invalid points, point ids, numbers and sizes, the random axis, null
// keys, derived learning rates and iterations, ramped batches and schedules in samples under a
// sample budget, blends as an axis, the noise-scale warning, points of several ranks, points
// that start from an earlier sweep's checkpoints, and every shipped sweep file.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <tuple>

#include "sweeps/sweep.h"
#include "tests/e2e/sweep_fixture.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace fs = std::filesystem;
namespace mb = megabatch;
using megabatch::testing::Sweep;

TEST_F(Sweep, InvalidPointsAreRefusedBeforeAnythingRuns) {
  mb::testing::TempDir tmp;
  const auto file = write_sweep(tmp.path(), "bad", 32, R"("adamw")", R"(, "hiden_size": 64)");
  auto r = mb::testing::run_command(sweep("run " + file.string() + " --runs-dir " + (tmp / "runs").string()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("point adamw-bs4-lr0.002-s3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("hiden_size"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("hidden_size"), std::string::npos) << "the nearest valid name: " << r.output;
  EXPECT_FALSE(fs::exists(tmp / "runs"));
  // a budget that a batch size does not divide
  const auto odd = write_sweep(tmp.path(), "odd", 30, R"("adamw")");
  r = mb::testing::run_command(sweep("run " + odd.string() + " --runs-dir " + (tmp / "runs").string()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("sample budget 30 is not a multiple of global_batch_size 4"), std::string::npos) << r.output;
  // refused by what they would have done, each named with its point:
  // - a decay in iterations beside a warmup in samples, which makes a point of a sample budget
  //   count samples (its train_samples): the run would ignore the decay's count;
  // - a train_iters the sample budget replaced;
  // - keys the sweep sets for each point, and loading options that would act on the point's
  //   own checkpoints: a point meant to fine-tune from another run's trained from scratch, one
  //   with a ckpt_step rewound at every resume;
  // - an exit_interval, and the switches that end train without training (check, skip_train, the
  //   print_ and list_ ones): each point stopped early and was marked done;
  // - train's lr_scaling in a point as well as derive.lr_scaling: lr scaled twice
  for (const auto& [name, extra, message] :
       {std::tuple{"mixed", R"(, "lr_warmup_samples": 16, "lr_decay_iters": 6)",
                   "lr_decay_iters counts iterations, but this run counts samples (train_samples, from "
                   "derive.sample_budget, as lr_warmup_samples counts samples), which would ignore it; give "
                   "lr_decay_samples instead"},
        std::tuple{"length", R"(, "train_iters": 100)",
                   "train_iters 100 would be replaced by derive.sample_budget (32 samples / global batch 4 = 8 "
                   "iterations)"},
        std::tuple{"owned", R"(, "finetune": true)",
                   "finetune would apply to the point's own checkpoints when it resumes"},
        std::tuple{"owned", R"(, "load": "/pretrained/ckpt")", "load is the sweep's to set"},
        std::tuple{"owned", R"(, "run_dir": "elsewhere")", "run_dir is the sweep's to set"},
        std::tuple{"owned", R"(, "ckpt_step": 2)",
                   "ckpt_step 2 would rewind the point to that iteration each time it resumes (setting its later "
                   "checkpoints aside), so it would never finish; drop it"},
        std::tuple{"early", R"(, "exit_interval": 2)",
                   "exit_interval 2 would stop the point before its end, and the sweep would take it for finished"},
        std::tuple{"early", R"(, "check": true)",
                   "check makes train end without training, and the sweep would take the point for finished"},
        std::tuple{"early", R"(, "skip_train": true)",
                   "skip_train makes train end without training, and the sweep would take the point for finished"},
        std::tuple{"twice", R"(, "lr_scaling": "sqrt", "lr_scaling_ref_batch": 4)",
                   "lr_scaling \"sqrt\" and derive.lr_scaling both scale lr with the batch, so it would be scaled "
                   "twice"}}) {
    const auto refused = write_sweep(tmp.path(), name, 32, R"("adamw")", extra);
    r = mb::testing::run_command(sweep("run " + refused.string() + " --runs-dir " + (tmp / "runs").string()));
    EXPECT_EQ(r.exit_code, 2) << extra;
    EXPECT_NE(r.output.find(std::string(name) + ".json: point adamw-bs4-lr0.002-s3: " + message), std::string::npos)
        << r.output;
  }
  // batch sizes the derived values would divide by (0: a division by zero, found by the
  // fuzz preset), a number beyond a double's range, a seed that is not one
  const std::string text = mb::testing::read_text(odd);
  using Edits = std::vector<std::pair<std::string, std::string>>;
  const std::vector<std::pair<Edits, std::string>> cases = {
      {{{R"("global_batch_size": [4, 8])", R"("global_batch_size": [0, 8])"}},
       "point adamw-bs0-lr0.002-s3: global_batch_size: expected an integer >= 1, got 0"},
      {{{R"("global_batch_size": [4, 8])", R"("global_batch_size": ["4", 8])"}},
       "global_batch_size: expected an integer >= 1, got \"4\""},
      {{{R"("lr": 0.002)", R"("lr": 1e999)"}}, "case.json: not valid JSON (number overflow parsing '1e999')"},
      {{{R"("seeds": [3],)", ""}, {R"("eval_iters": 2,)", R"("eval_iters": 2, "seed": "3",)"}},
       "case.json: base.seed: expected an integer >= 0, got \"3\""},
  };
  for (const auto& [edits, message] : cases) {
    std::string changed = text;
    for (const auto& [from, to] : edits) {
      ASSERT_NE(changed.find(from), std::string::npos) << from;
      changed.replace(changed.find(from), from.size(), to);
    }
    mb::testing::write_text(tmp / "case.json", changed);
    r = mb::testing::run_command(sweep("run " + (tmp / "case.json").string() + " --runs-dir " + (tmp / "runs").string()));
    EXPECT_EQ(r.exit_code, 2) << message << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << message << "\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(tmp / "runs"));
}

// A sweep file's tensorboard_dir gives each point a directory of its own under it, which
// TensorBoard shows as a run of its own (points writing one directory would be one run, their
// curves interleaved).
TEST_F(Sweep, EachPointWritesTensorBoardIntoADirectoryOfItsOwn) {
  mb::testing::TempDir tmp;
  const fs::path tb = tmp / "tb";
  const auto file =
      write_tiny_sweep(tmp.path(), "boards", R"("train_iters": 2, "tensorboard_dir": ")" + tb.string() + "\"",
                       R"("grid": {"optimizer": ["adamw", "sgd"]}, "seeds": [1], "threads": 1)");
  const auto r = run_sweep(file, tmp / "runs");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> points, boards;
  for (const auto& e : fs::directory_iterator(tmp / "runs" / "boards"))
    if (e.is_directory()) points.push_back(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(tb)) {
    ASSERT_TRUE(e.is_directory()) << e.path() << ": an event file beside the points' directories";
    boards.push_back(e.path().filename().string());
    int files = 0;
    for (const auto& f : fs::directory_iterator(e.path()))
      files += f.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
    EXPECT_EQ(files, 1) << e.path();
  }
  std::sort(points.begin(), points.end());
  std::sort(boards.begin(), boards.end());
  EXPECT_EQ(points, (std::vector<std::string>{"adamw-s1", "sgd-s1"}));
  EXPECT_EQ(boards, points);
}

// Swept strings never steer where points go: a path contributes its last component, other
// characters become '_', ids are length-limited; nothing is created outside runs/<name>/.
TEST_F(Sweep, PointIdsAreFileNamesOfTheirOwn) {
  mb::testing::TempDir tmp;
  const std::string data = (mb::testing::brown_data() / "brown_gpt2_text_document").string();
  const fs::path file = tmp / "ids.json";
  mb::testing::write_text(file, R"({"name": "ids",
  "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "seq_length": 16, "micro_batch_size": 2,
           "global_batch_size": 2, "lr": 0.002, "train_iters": 1, "eval_iters": 0, "data_path": [")" + data + R"("]},
  "grid": {"optimizer": ["../../../escape", "..", "a b\u0001c", ")" + std::string(200, 'x') + R"("],
           "tokenizer_type": ["GPT2BPETokenizer"]}})");
  const fs::path runs = tmp / "nested" / "runs";
  auto r = run_sweep(file, runs, " --jobs 1");
  EXPECT_EQ(r.exit_code, 1) << "the optimizers do not exist: " << r.output;
  std::vector<std::string> made;
  for (const auto& e : fs::directory_iterator(runs / "ids"))
    if (e.is_directory()) made.push_back(e.path().filename().string());
  std::sort(made.begin(), made.end());
  ASSERT_EQ(made.size(), 4u) << r.output;
  EXPECT_EQ(made[0], "_.-ttGPT2BPETokenizer");
  EXPECT_EQ(made[1], "a_b_c-ttGPT2BPETokenizer");
  EXPECT_EQ(made[2], "escape-ttGPT2BPETokenizer");
  EXPECT_EQ(made[3].size(), 120u);
  EXPECT_EQ(made[3].substr(0, 10), "xxxxxxxxxx");
  std::vector<std::string> outside;
  for (const auto& e : fs::recursive_directory_iterator(tmp.path()))
    if (e.path().filename().string().find("escape") != std::string::npos) outside.push_back(e.path().string());
  EXPECT_EQ(outside, std::vector<std::string>{(runs / "ids" / "escape-ttGPT2BPETokenizer").string()});
}

// Sweep-level numbers: jobs and threads in files and flags, seeds, and a point limit that
// refuses a runaway grid before it is expanded.
TEST_F(Sweep, SweepNumbersAndSizeAreChecked) {
  mb::testing::TempDir tmp;
  const auto file = write_sweep(tmp.path(), "n", 32, R"("adamw")");
  auto r = mb::testing::run_command(sweep("run " + file.string() + " --dry-run --jobs -1"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--jobs: must be >= 1"), std::string::npos) << r.output;
  // more threads per point than this machine's CPUs: every point's train would refuse them
  // (train --threads 100000 ended in a segmentation fault)
  r = mb::testing::run_command(sweep("run " + file.string() + " --dry-run --threads 4096"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--threads: 4096 is more than the "), std::string::npos) << r.output;
  std::string text = mb::testing::read_text(file);  // its "threads": 1 made 4096 (a second key would be refused)
  ASSERT_NE(text.find("\"threads\": 1"), std::string::npos);
  mb::testing::write_text(tmp / "t.json", text.replace(text.find("\"threads\": 1"), 12, "\"threads\": 4096"));
  r = mb::testing::run_command(sweep("run " + (tmp / "t.json").string() + " --dry-run"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find((tmp / "t.json").string() + ": threads: 4096 is more than the "), std::string::npos)
      << r.output;
  r = mb::testing::run_command(sweep("run " + file.string() + " --dry-run --max-points 1"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("the sweep has 2 points (grid x zip groups x seeds), more than the limit of 1; raise it with --max-points N"), std::string::npos)
      << r.output;
  std::string big = "[";
  for (int i = 0; i < 1000; ++i) big += (i ? "," : "") + std::to_string(i + 1);
  big += "]";
  mb::testing::write_text(tmp / "huge.json", R"({"name": "huge", "base": {"lr": 0.001, "train_iters": 1},
    "grid": {"num_layers": )" + big + R"(, "hidden_size": )" + big + R"(, "seq_length": )" + big + R"(}})");
  r = mb::testing::run_command(sweep("run " + (tmp / "huge.json").string() + " --dry-run"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("the sweep has 1000000000 points (grid x zip groups x seeds), more than the limit of 10000"),
            std::string::npos) << r.output;
  mb::testing::write_text(tmp / "j.json", R"({"name": "j", "base": {"lr": 0.001, "train_iters": 1}, "jobs": 1.5})");
  r = mb::testing::run_command(sweep("run " + (tmp / "j.json").string() + " --dry-run"));
  EXPECT_NE(r.output.find("jobs: expected an integer in [1, 4096], got 1.5"), std::string::npos) << r.output;
  mb::testing::write_text(tmp / "s.json", R"({"name": "s", "base": {"lr": 0.001, "train_iters": 1}, "seeds": [-1]})");
  r = mb::testing::run_command(sweep("run " + (tmp / "s.json").string() + " --dry-run"));
  EXPECT_NE(r.output.find("seeds: -1 is not an integer >= 0"), std::string::npos) << r.output;
}

// The dry run says what a point's run would: a validation split that holds nothing, with
// --eval-iters given, is refused (train --check passed it, and every point then failed at
// its start); with the default --eval-iters it is a warning, said in full once and by
// reference for the points after.
TEST_F(Sweep, DryRunRefusesAndWarnsOfAnEmptyValidationSplitAsThePointsWould) {
  mb::testing::TempDir tmp;
  auto write = [&](const std::string& name, const std::string& eval) {
    const fs::path f = tmp / (name + ".json");
    mb::testing::write_text(f, R"({"name": ")" + name + R"(", "base": {"num_layers": 1, "hidden_size": 32,
      "num_attention_heads": 2, "seq_length": 16, "micro_batch_size": 2, "train_iters": 2, "lr": 0.001,
      "split": "100,0,0", )" + eval +
                                   R"("data_path": [")" +
                                   (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("]},
      "seeds": [1, 2]})");
    return f;
  };
  const std::string data = (mb::testing::brown_data() / "brown_gpt2_text_document").string();
  const std::string why = "the validation split of --split '100,0,0' holds no document of " + data + "'s 500";
  auto r = run_sweep(write("asked", R"("eval_iters": 3, )"), tmp / "runs", " --dry-run");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("    cannot run: train: error: --eval-iters asks for validation, but " + why),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("> 2 point(s) cannot run (above)"), std::string::npos) << r.output;
  r = run_sweep(write("default", ""), tmp / "runs", " --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string warned = "    warning: no validation loss will be logged: " + why;
  const size_t first = r.output.find(warned);
  EXPECT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(warned, first + 1), std::string::npos) << "said once: " << r.output;
  EXPECT_NE(r.output.find("    warning: as s1 above"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> every point checked"), std::string::npos) << r.output;
}

// Local sweeps are checked point by point (train --check) from a directory whose data/ holds
// the Brown corpus, as after the README's first command; cluster sweeps only expand here.
TEST(SweepFiles, EveryShippedSweepExpandsAndValidates) {
  mb::testing::TempDir cwd;
  fs::create_directory_symlink(mb::testing::brown_data(), cwd / "data");
  size_t files = 0;
  for (const fs::path& dir : {fs::path(mb::testing::source_dir()) / "experiments",
                             fs::path(mb::testing::source_dir()) / "experiments" / "paper"})
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() != ".json") continue;
      ++files;
      const auto r = mb::testing::run_command("cd " + cwd.path().string() + " && " + mb::testing::bin_dir() + "/sweep run " +
                                              e.path().string() + " --dry-run");
      EXPECT_EQ(r.exit_code, 0) << e.path() << "\n" << r.output;
      EXPECT_NE(r.output.find(" points (runs in "), std::string::npos) << r.output;
      EXPECT_TRUE(r.output.find("> every point checked") != std::string::npos ||
                  r.output.find("> sized for {") != std::string::npos) << r.output;
      EXPECT_EQ(r.output.find("log the noise scale averaged by 0.99 a step"), std::string::npos)
          << "a shipped sweep averages B_simple alike at every batch size: " << r.output;
    }
  EXPECT_GE(files, 7u);
}

// The shipped phase 2 names phase 1's points by their ids, under the runs directory given.
TEST(SweepFiles, BertLargePhaseTwoStartsFromEachPhaseOnePoint) {
  const fs::path paper = fs::path(mb::testing::source_dir()) / "experiments" / "paper";
  auto dry_run = [&](const char* file) {
    const auto r = mb::testing::run_command(mb::testing::bin_dir() + "/sweep run " + (paper / file).string() +
                                            " --dry-run --runs-dir /nonexistent");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  const std::string first = dry_run("bert_large_lamb.json"), second = dry_run("bert_large_lamb_phase2.json");
  const std::regex id("\n  (bs[0-9]+-[^ ]+)  [{]");
  int ids = 0;
  for (auto it = std::sregex_iterator(first.begin(), first.end(), id); it != std::sregex_iterator(); ++it, ++ids) {
    const std::string named =
        "\"pretrained_checkpoint\":\"/nonexistent/bert_large_lamb/" + (*it)[1].str() + "/checkpoints\"";
    EXPECT_NE(second.find(named), std::string::npos) << named << "\n" << second;
  }
  EXPECT_EQ(ids, 3) << first;
}

// The random axis: count draws, uniform or log-uniform within the bounds, the same points
// for the same seed (ids and values), others for another seed; bad specs name the key.
TEST_F(Sweep, RandomAxisIsReproducibleBySeed) {
  // The expansion itself (sweeps::load_sweep, what sweep run reads): no train --check per point,
  // which the other tests here cover (72 of them took 49 s under the sanitizers).
  mb::testing::TempDir tmp;
  auto write = [&](int seed, const std::string& params) {
    const fs::path f = tmp / ("r" + std::to_string(seed) + ".json");
    mb::testing::write_text(f, R"({"name": "rnd", "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
      "seq_length": 16, "micro_batch_size": 4, "global_batch_size": 4, "train_iters": 4, "lr": 0.001},
      "random": {"count": 24, "seed": )" +
                                   std::to_string(seed) + R"(, "params": )" + params + "}}");
    return f;
  };
  const std::string params = R"({"lr": {"log_uniform": [1e-4, 1e-2]}, "weight_decay": {"uniform": [0, 0.1]},
                                  "num_layers": {"uniform": [1, 3]}})";
  auto points = [&](const fs::path& f) {
    std::vector<std::pair<std::string, nlohmann::json>> out;
    for (const auto& p : mb::sweeps::load_sweep(f).points) out.emplace_back(p.id, p.config);
    return out;
  };
  const auto a = points(write(5, params)), b = points(write(5, params)), c = points(write(6, params));
  EXPECT_EQ(a, b) << "the same seed, the same points";
  EXPECT_NE(a, c);
  ASSERT_EQ(a.size(), 24u);
  int below_1e3 = 0, layers3 = 0;
  for (const auto& [id, config] : a) {
    const double lr = config["lr"].get<double>(), wd = config["weight_decay"].get<double>();
    ASSERT_TRUE(config["num_layers"].is_number_integer()) << id << ": integer bounds draw integers";
    const int64_t layers = config["num_layers"].get<int64_t>();
    EXPECT_TRUE(lr >= 1e-4 && lr <= 1e-2) << id;
    EXPECT_TRUE(wd >= 0 && wd <= 0.1) << id;
    EXPECT_TRUE(layers >= 1 && layers <= 3) << id;
    below_1e3 += lr < 1e-3;
    layers3 += layers == 3;
  }
  EXPECT_GT(below_1e3, 4) << "log-uniform: about half of the draws lie below the geometric middle 1e-3";
  EXPECT_LT(below_1e3, 20);
  EXPECT_GT(layers3, 0) << "integer bounds draw integers up to the upper bound";
  mb::testing::expect_error([&] { points(write(5, R"({"lr": {"log_uniform": [0, 1e-2]}})")); },
                            "random.params.lr: log_uniform needs lo > 0");
  const fs::path bad_seed = tmp / "badseed.json";
  mb::testing::write_text(bad_seed, R"({"name": "rnd", "base": {"lr": 0.001, "train_iters": 4},
                                        "random": {"count": 2, "seed": 1.5, "params": {"lr": {"uniform": [0, 1]}}}})");
  mb::testing::expect_error([&] { points(bad_seed); }, "random.seed: expected an integer >= 0, got 1.5");
  // and through the program: a sweep file's error is exit status 2, before any point is checked
  const auto bs =
      mb::testing::run_command(sweep("run " + bad_seed.string() + " --dry-run --runs-dir " + (tmp / "runs").string()));
  EXPECT_EQ(bs.exit_code, 2);
  EXPECT_NE(bs.output.find("random.seed: expected an integer >= 0, got 1.5"), std::string::npos) << bs.output;
}

// A null unsets a key (JSON merge patch): a file that includes the default sweep can compare
// an optimizer that lacks one of its hyperparameters. Here the included file sets clip_grad,
// adamw's beta2 and a grid; the including one drops clip_grad from the base (the points run
// at train's default), drops the grid, and gives sgd, which has no beta2, no optimizer_params.
TEST_F(Sweep, ANullUnsetsAKeyOfAnIncludedFileOrOfOnePoint) {
  mb::testing::TempDir tmp;
  mb::testing::write_text(tmp / "inc.json", R"({"name": "inc", "base": {"num_layers": 1, "hidden_size": 32,
    "num_attention_heads": 2, "seq_length": 16, "micro_batch_size": 2, "train_iters": 2, "lr": 0.001, "eval_iters": 0,
    "clip_grad": 0.5, "optimizer_params": {"beta2": 0.95},
    "data_path": [")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("]},
    "grid": {"optimizer": ["adamw", "lamb"]}})");
  mb::testing::write_text(tmp / "top.json", R"({"include": "inc.json", "name": "top", "grid": null,
    "base": {"clip_grad": null},
    "zip": {"optimizer": ["adamw", "sgd"], "optimizer_params": [{"beta2": 0.9}, null]}})");
  const auto r = run_sweep(tmp / "top.json", tmp / "runs");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path root = tmp / "runs" / "top";
  std::vector<std::string> points;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory()) points.push_back(e.path().filename().string());
  std::sort(points.begin(), points.end());
  EXPECT_EQ(points, (std::vector<std::string>{"adamw", "sgd"})) << "two points, from the zip alone";
  const auto adamw = nlohmann::json::parse(mb::testing::read_text(root / "adamw" / "point.json"));
  const auto sgd = nlohmann::json::parse(mb::testing::read_text(root / "sgd" / "point.json"));
  EXPECT_FALSE(adamw.contains("clip_grad")) << adamw;
  EXPECT_EQ(adamw["optimizer_params"], nlohmann::json({{"beta2", 0.9}}));
  EXPECT_FALSE(sgd.contains("optimizer_params")) << sgd;
  const auto resolved = nlohmann::json::parse(mb::testing::read_text(root / "sgd" / "config.json"));
  EXPECT_EQ(resolved["clip_grad"], 1.0) << "train's default, as if clip_grad had never been given";
}

// The derived lr and train_iters divide by the point's global batch, which a point without
// global_batch_size has as micro_batch_size x data_parallel_size; derive writes it into the
// point, so that the run trains at the batch its values were derived for. Before, they divided
// by micro_batch_size alone: at DP 2 each point trained on twice its sample budget, at an lr
// scaled for half its batch (and a cluster job, whose DP comes from its ranks, likewise).
TEST_F(Sweep, DerivedValuesDivideByTheGlobalBatchTheyWriteIntoThePoint) {
  mb::testing::TempDir tmp;
  const fs::path runs = tmp / "runs";
  const fs::path file = write_tiny_sweep(
      tmp.path(), "dp",
      R"("data_parallel_size": 2, "min_lr": 0.0001, "lr_warmup_fraction": 0.25, "lr_warmup_init": 0.00001, "decoupled_lr": 0.003,
         "decoupled_min_lr": 0.0002)",
      R"("zip": {"micro_batch_size": [2, 4]}, "derive": {"lr_scaling": {"rule": "linear", "ref_batch": 4},
                           "sample_budget": 64})");
  const auto r = mb::testing::run_command(sweep("export-points " + file.string() + " --runs-dir " + runs.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<nlohmann::json> points;
  for (const auto& e : fs::directory_iterator(runs / "dp"))
    if (fs::exists(e.path() / "point.json"))
      points.push_back(nlohmann::json::parse(mb::testing::read_text(e.path() / "point.json")));
  ASSERT_EQ(points.size(), 2u) << r.output;
  for (const auto& point : points) {
    const int64_t micro = point.at("micro_batch_size").get<int64_t>(), global = 2 * micro;
    EXPECT_EQ(point.value("global_batch_size", 0), global) << point;
    EXPECT_EQ(point.value("train_iters", 0), 64 / global) << point;
    EXPECT_DOUBLE_EQ(point.value("lr", 0.0), 0.001 * static_cast<double>(global) / 4) << point;
    // every learning rate train's --lr-scaling scales
    for (const auto& [key, base] : {std::pair{"min_lr", 0.0001}, std::pair{"lr_warmup_init", 0.00001},
                                    std::pair{"decoupled_lr", 0.003}, std::pair{"decoupled_min_lr", 0.0002}})
      EXPECT_DOUBLE_EQ(point.value(key, 0.0), base * static_cast<double>(global) / 4) << key << " " << point;
  }
}

// A ramped batch is counted in samples (Megatron refuses a ramp in a run of iterations): the
// sample budget is each point's train_samples, and the point's iterations are Megatron's count
// of the ramp. Ramp 4 4 32 over a budget of 64: to 8, nine steps (4 x 8, then one of 8 at 32
// samples) and three of 8; to 16 (stages of 32 / 3 samples), 4, 4, 4, 8, 8, 12 to 40 samples,
// then one of 16.
TEST_F(Sweep, ARampedBatchTrainsOnTheSampleBudgetInMegatronsIterations) {
  mb::testing::TempDir tmp;
  const fs::path runs = tmp / "runs";
  const fs::path file = write_tiny_sweep(tmp.path(), "ramp", R"("rampup_batch_size": [4, 4, 32])",
                                         R"("zip": {"global_batch_size": [8, 16]}, "derive": {"sample_budget": 64},
                                            "threads": 1)");
  const auto r = run_sweep(file, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto state = nlohmann::json::parse(mb::testing::read_text(runs / "ramp" / "sweep.json"));
  std::map<std::string, int64_t> iterations;
  for (const auto& p : state.at("points"))
    iterations[p.at("id").get<std::string>()] = p.at("train_iters").get<int64_t>();
  EXPECT_EQ(iterations, (std::map<std::string, int64_t>{{"bs8", 12}, {"bs16", 7}})) << state.dump();
  const std::map<std::string, std::vector<double>> batches = {{"bs8", {4, 4, 4, 4, 4, 4, 4, 4, 8, 8, 8, 8}},
                                                              {"bs16", {4, 4, 4, 8, 8, 12, 16}}};
  for (const auto& [id, batch] : batches) {
    const auto point = nlohmann::json::parse(mb::testing::read_text(runs / "ramp" / id / "point.json"));
    EXPECT_EQ(point.value("train_samples", 0), 64) << point;
    EXPECT_FALSE(point.contains("train_iters")) << point;
    mb::testing::H5File f((runs / "ramp" / id / "metrics.h5").string(), mb::testing::H5File::kRead);
    EXPECT_EQ(f.read<double>("train/global_batch_size"), batch) << id;
  }
  // at DP 2, a ramp whose batches are not whole micro-batches on each rank is refused by the
  // dry run (micro batch 2 x DP 2 = 4: a start of 2 is not)
  const fs::path odd =
      write_tiny_sweep(tmp.path(), "odd", R"("rampup_batch_size": [2, 2, 32], "data_parallel_size": 2)",
                       R"("zip": {"global_batch_size": [8]}, "derive": {"sample_budget": 64})");
  const auto o = mb::testing::run_command(mb::testing::mpi_env() +
                                          sweep("run " + odd.string() + " --dry-run --runs-dir " + runs.string()));
  EXPECT_NE(o.exit_code, 0) << o.output;
  EXPECT_NE(o.output.find("must be multiples of micro_batch_size x data-parallel size (2 x 2 = 4)"), std::string::npos)
      << o.output;
}

// A schedule counted in samples (a warmup, decay or WSD decay of so many samples, the same at
// every batch size) makes a point of a sample budget count samples, as train requires: the
// budget is its train_samples. Before, the sweep made every such point count iterations and
// refused the schedule, so a WSD decay over the budget's last samples had to be zipped with
// the batch sizes by hand. The learning rate is then the same function of the samples consumed
// at batch 4 and 8, and the same as at batch 4 with the schedule given in iterations.
TEST_F(Sweep, AScheduleInSamplesMakesTheBudgetsPointsCountSamples) {
  mb::testing::TempDir tmp;
  const fs::path runs = tmp / "runs";
  const std::string schedule = R"("lr_decay_style": "WSD", "lr_wsd_decay_style": "linear", "min_lr": 0.0001)";
  const fs::path in_samples =
      write_tiny_sweep(tmp.path(), "samples", schedule + R"(, "lr_warmup_samples": 16, "lr_wsd_decay_samples": 24)",
                       R"("zip": {"global_batch_size": [4, 8]}, "derive": {"sample_budget": 64}, "threads": 1)");
  auto r = run_sweep(in_samples, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // the reference: batch 4 counted in iterations, 16 / 4 = 4 of warmup, 24 / 4 = 6 of decay
  const fs::path in_iters =
      write_tiny_sweep(tmp.path(), "iters", schedule + R"(, "lr_warmup_iters": 4, "lr_wsd_decay_iters": 6)",
                       R"("zip": {"global_batch_size": [4]}, "derive": {"sample_budget": 64}, "threads": 1)");
  r = run_sweep(in_iters, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // learning rate by consumed samples
  const auto lr_at = [&](const fs::path& point) {
    mb::testing::H5File f((point / "metrics.h5").string(), mb::testing::H5File::kRead);
    const auto samples = f.read<double>("train/consumed_samples"), lr = f.read<double>("train/learning_rate");
    std::map<int64_t, double> out;
    for (size_t i = 0; i < samples.size() && i < lr.size(); ++i) out[static_cast<int64_t>(samples[i])] = lr[i];
    return out;
  };
  for (const char* id : {"bs4", "bs8"}) {
    const auto point = nlohmann::json::parse(mb::testing::read_text(runs / "samples" / id / "point.json"));
    EXPECT_EQ(point.value("train_samples", 0), 64) << point;
    EXPECT_FALSE(point.contains("train_iters")) << point;
  }
  const auto reference = lr_at(runs / "iters" / "bs4"), at4 = lr_at(runs / "samples" / "bs4"),
             at8 = lr_at(runs / "samples" / "bs8");
  ASSERT_EQ(reference.size(), 16u);
  EXPECT_EQ(at4, reference) << "batch 4: the schedule in samples is the schedule in iterations";
  ASSERT_EQ(at8.size(), 8u);
  // a row's learning rate is its step's, of the samples before the step: batch 8's row at c
  // samples is batch 4's at c - 4
  for (const auto& [consumed, lr] : at8)
    EXPECT_EQ(lr, reference.at(consumed - 4)) << "batch 8 at " << consumed << " samples";
  EXPECT_LT(at8.at(64), at8.at(32)) << "the decay ran";
  // each key counted in samples does it alone
  for (const std::string key : {R"("lr_warmup_samples": 16)", R"("lr_decay_samples": 48)",
                                R"("lr_decay_style": "WSD", "lr_wsd_decay_samples": 16)"}) {
    const fs::path one = write_tiny_sweep(tmp.path(), "one", key,
                                          R"("zip": {"global_batch_size": [8]}, "derive": {"sample_budget": 64})");
    const fs::path dir = tmp / ("one" + std::to_string(std::hash<std::string>{}(key)));
    r = mb::testing::run_command(sweep("export-points " + one.string() + " --runs-dir " + dir.string()));
    ASSERT_EQ(r.exit_code, 0) << key << "\n" << r.output;
    const auto point = nlohmann::json::parse(mb::testing::read_text(dir / "one" / "bs8" / "point.json"));
    EXPECT_EQ(point.value("train_samples", 0), 64) << point;
    EXPECT_FALSE(point.contains("train_iters")) << point;
  }
}

// --dry-run runs train --check for every point: a hyperparameter the plugin does not have
// and a missing dataset are reported per point, with the command that makes the default data.
TEST_F(Sweep, DryRunChecksPluginsDataAndMemoryOfEveryPoint) {
  mb::testing::TempDir tmp;
  const fs::path f = tmp / "chk.json";
  mb::testing::write_text(f, R"({"name": "chk", "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
    "seq_length": 16, "micro_batch_size": 4, "global_batch_size": 4, "train_iters": 4, "lr": 0.001,
    "optimizer_params": {"beta2": 0.95}},
    "grid": {"optimizer": ["adamw", "sgd"], "data_path": [[")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() +
                              R"("], [")" + (tmp / "nowhere" / "brown_missing_text_document").string() + R"("]]}})");
  const auto r = mb::testing::run_command(sweep("run " + f.string() + " --dry-run --runs-dir " + (tmp / "runs").string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("plugin 'sgd' has no hyperparameter 'beta2'"), std::string::npos) << r.output;
  // the preprocess beside this train, into the directory the point names
  EXPECT_NE(r.output.find("/preprocess brown --output-dir " + (tmp / "nowhere").string() + "`, run it first"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> 3 point(s) cannot run"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp / "runs" / "chk")) << "a dry run writes nothing";
}

// A second phase: each point starts from the final checkpoint of its batch size's point of an
// earlier sweep (pretrained_checkpoint zipped with the batch), checked by --dry-run before
// that sweep has run and taken when it has.
TEST_F(Sweep, PointsStartFromTheCheckpointsOfAnEarlierSweep) {
  mb::testing::TempDir tmp;
  const fs::path runs = tmp / "runs";
  const auto first = write_tiny_sweep(tmp.path(), "first", R"("train_iters": 2)",
                                      R"("zip": {"global_batch_size": [2, 4]}, "threads": 1)");
  const std::string from2 = (runs / "first" / "bs2" / "checkpoints").string(),
                    from4 = (runs / "first" / "bs4" / "checkpoints").string();
  // the second names the first's checkpoints under whatever --runs-dir it is given
  const auto second = write_tiny_sweep(tmp.path(), "second", R"("train_iters": 3, "optimizer": "adamw")",
                                       R"("zip": {"global_batch_size": [2, 4], "pretrained_checkpoint":
                                           ["{runs_dir}/first/bs2/checkpoints", "{runs_dir}/first/bs4/checkpoints"]},
                                         "threads": 1)");
  auto r = run_sweep(second, runs, " --dry-run");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--pretrained-checkpoint: " + from4 + " holds no checkpoint to start from"),
            std::string::npos)
      << r.output;
  r = run_sweep(first, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_sweep(second, runs, " --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run_sweep(second, runs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& [id, from, samples] : {std::tuple{"bs2", from2, 4}, std::tuple{"bs4", from4, 8}}) {
    const std::string log = mb::testing::read_text(runs / "second" / id / "stdout.log");
    EXPECT_NE(log.find("> loaded the model from " + from + "/iter_0000002.h5 (iteration 2, " + std::to_string(samples) +
                       " samples); starting at iteration 0"),
              std::string::npos)
        << log;
  }
  // a grid of them at one batch size: each point named for the run whose weights it starts
  // from, not for the checkpoints/ directory they all end in
  const auto grid =
      write_tiny_sweep(tmp.path(), "grid", R"("train_iters": 3, "global_batch_size": 2)",
                       R"("grid": {"pretrained_checkpoint": [")" + from2 + R"(", ")" + from4 + R"("]}, "threads": 1)");
  r = run_sweep(grid, runs, " --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("  from-bs2  {"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  from-bs4  {"), std::string::npos) << r.output;
}

// A blend (data_path's weights and prefixes) as an axis: each point named by its items.
TEST_F(Sweep, ABlendAxisNamesEachPointByItsWeightsAndDatasets) {
  mb::testing::TempDir tmp;
  const std::string data = (mb::testing::brown_data() / "brown_gpt2_text_document").string();
  const auto file = write_tiny_sweep(
      tmp.path(), "blend", R"("train_iters": 2, "global_batch_size": 2)",
      R"("grid": {"data_path": [[")" + data + R"("], ["1", ")" + data + R"(", "3", ")" + data + R"("]]})");
  const auto r = run_sweep(file, tmp / "runs", " --dry-run");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("  dpbrown_gpt2_text_document  {"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  dp1+brown_gpt2_text_document+3+brown_gpt2_text_document  {"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("data_path: " + data + " is given twice; give it once, with the sum of its weights"),
            std::string::npos)
      << "train --check reads the blend: " << r.output;
}

// Points that log the noise scale at several batch sizes with the default decay a step are
// told what it does and which window would average them alike; with a window (or a decay
// chosen on purpose) nothing is said.
TEST_F(Sweep, ANoiseScaleAveragedByStepsAtSeveralBatchSizesIsPointedOut) {
  mb::testing::TempDir tmp;
  const std::string base = R"({"name": "ns", "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
    "seq_length": 16, "micro_batch_size": 4, "train_iters": 4, "lr": 0.001, "log_noise_scale": true, "data_path": [")" +
                           (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("])";
  const std::string axes = R"(}, "grid": {"global_batch_size": [8, 32]}})";
  const std::vector<std::pair<std::string, bool>> cases = {
      {"", true}, {R"(, "noise_scale_window": 32)", false}, {R"(, "noise_scale_ema": 0.9)", false}};
  for (const auto& [extra, noted] : cases) {
    mb::testing::write_text(tmp / "ns.json", base + extra + axes);
    const auto r = mb::testing::run_command(sweep("run " + (tmp / "ns.json").string() + " --dry-run --runs-dir " + (tmp / "runs").string()));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const std::string note = "> note: points at global batch 8 to 32 log the noise scale averaged by 0.99 a step (100 steps: 800 "
                             "samples at batch 8, 3200 at 32), so their B_simple at the same loss is not averaged alike; "
                             "\"noise_scale_window\": 32 in base (the largest batch) averages every point over the same samples";
    EXPECT_EQ(r.output.find(note) != std::string::npos, noted) << extra << "\n" << r.output;
  }
}

// A point of more than one rank is checked as it will run, under mpirun -np TP x DP: a TP 2
// point passes (one process said it "needs 2 processes"), a DP 2 point whose global batch is
// no multiple of micro batch x DP is refused with that, once per distinct error.
TEST_F(Sweep, DryRunChecksMultiRankPointsUnderMpirun) {
  mb::testing::TempDir tmp;
  const fs::path f = tmp / "ranks.json";
  mb::testing::write_text(f, R"({"name": "ranks", "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
    "seq_length": 16, "micro_batch_size": 2, "global_batch_size": 6, "train_iters": 4, "lr": 0.001,
    "data_path": [")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("]},
    "grid": {"tensor_model_parallel_size": [1, 2], "data_parallel_size": [1, 2]}})");
  const auto r = mb::testing::run_command(
      mb::testing::mpi_env() + sweep("run " + f.string() + " --dry-run --runs-dir " + (tmp / "runs").string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output.find("needs 2 processes"), std::string::npos) << r.output;
  const std::string said = "cannot run: train: error: global_batch_size (6) must be a multiple of micro_batch_size x "
                           "data-parallel size (2 x 2)\n";
  const size_t first = r.output.find(said);
  ASSERT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(said, first + 1), std::string::npos) << "said once:\n" << r.output;
  EXPECT_NE(r.output.find("cannot run: as "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> 2 point(s) cannot run"), std::string::npos) << r.output;
}
