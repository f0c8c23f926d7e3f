// `train` end to end: a run's console (Megatron's iteration and memory lines, the device line,
// the profile), its refusal of a model that cannot fit, --skip-train, and a fresh start into a
// run directory that holds an earlier run's metrics.
#include <cblas.h>
#include <gtest/gtest.h>
#include <strings.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "tests/e2e/train_fixture.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
namespace fs = std::filesystem;
using mb::testing::kSmall;
using mb::testing::Train;

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
