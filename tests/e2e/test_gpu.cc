// The whole trainer on one GPU (label gpu; each test says why it skips where no GPU is
// visible): GPT, BERT and T5 follow the CPU's fp32 loss curve, bf16 and fp16 stay near
// fp32, a forced fp16 overflow skips steps and backs the scale off as on the CPU, runs are
// bitwise repeatable and resume bitwise, checkpoints move between GPU and CPU, every plugin's
// step on the GPU matches its step on the CPU, a CPU-only plugin is refused, the steady-state
// step allocates no device memory and never waits for the GPU, host->device copies never wait
// and land though their source is gone, diagnostics and the noise scale reach metrics.h5. Several
// ranks: NCCL with one rank, and four processes sharing the GPU at TP 2 x DP 2 (host-staged
// MPI) against the same layout on the CPU (mpirun: $MEGABATCH_MPIRUN or the one on PATH).
// (Without a GPU, `train --device cuda` is a clear error: test_mixed_precision.cc.)
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <sstream>

#include "core/comm/collectives.h"
#include "core/comm/communicator.h"
#include "core/comm/nccl_communicator.h"
#include "core/device/runtime.h"
#include "core/io/checkpoint.h"
#include "core/io/metrics.h"
#include "core/optim/optimizer.h"
#include "core/train/step_recorder.h"
#include "core/train/trainer.h"
#include "core/util/philox.h"
#include "models/registry.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/model_checks.h"
#include "tests/unit/op_harness.h"
#include "tests/unit/test_util.h"

namespace fs = std::filesystem;
namespace mb = megabatch;

namespace {

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override { MB_SKIP_WITHOUT_DEVICE(mb::Device::cuda(0)); }
};

// A small model of `family` for 20 iterations, dropout on, two micro-batches per step.
std::string train(const std::string& family, const fs::path& run, const std::string& extra, int iters = 20) {
  const bool wordpiece = family != "gpt";
  return mb::testing::bin_dir() + "/train --model-type " + family + " --num-layers 2 --hidden-size 64 " +
         "--num-attention-heads 4 --seq-length " + (wordpiece ? "64" : "32") +
         (family == "t5" ? " --decoder-seq-length 16" : "") + " --micro-batch-size 4 --global-batch-size 8 " +
         "--train-iters " + std::to_string(iters) + " --lr 1e-3 --lr-warmup-iters 2 --log-interval 5 --eval-iters 0 " +
         "--threads 4 --data-path " +
         (mb::testing::brown_data() / (wordpiece ? "brown_bert_text_sentence" : "brown_gpt2_text_document")).string() +
         " --run-dir " + run.string() + " " + extra;
}

std::vector<double> series(const fs::path& metrics, const std::string& name) {
  mb::testing::H5File f(metrics.string(), mb::testing::H5File::kRead);
  return f.read<double>(name);
}

void ok(const std::string& cmd) {
  const auto r = mb::testing::run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
}

std::string plugin_dirs() {
  const char* e = std::getenv("MEGABATCH_TEST_PLUGIN_DIR");
  return e && *e ? e : MEGABATCH_TEST_PLUGIN_DIR;
}

}  // namespace

TEST_F(Gpu, GptBertAndT5InFp32FollowTheCpuLossCurve) {
  // and their final evaluations agree: --eval-samples beyond the held-out splits' sizes
  // covers each split once, the last micro-batch smaller than the others
  mb::testing::TempDir tmp;
  for (const std::string family : {"gpt", "gpt-untied", "gpt-no-bias", "gpt-swiglu", "gpt-rope", "gpt-gqa",
                                   "gpt-qknorm", "gpt-relu2", "bert", "t5"}) {
    SCOPED_TRACE(family);
    // gpt-untied: a GPT with an output layer of its own, each document's positions from 0 (a
    // batch's own position ids uploaded each micro-batch) and its attention within itself (the
    // batch's documents uploaded, the attention kernels' document masks); gpt-no-bias: without the linear
    // layers' biases but the QKV's (cuBLASLt's GELU epilogue without a bias); gpt-swiglu: the
    // gated MLP (the SwiGLU kernels); gpt-rope: rotary positions (the rotary kernels); gpt-gqa:
    // grouped-query attention (the query-group kernels); gpt-qknorm: normed queries and keys (the
    // row scatter and the norms on a QKV output's rows), with interleaved, interpolated rotary
    // positions; gpt-relu2: the squared-ReLU MLP with norm weights applied as 1 + w and the
    // residuals taken after the norms
    const std::string type = family.rfind("gpt", 0) == 0 ? "gpt" : family;
    const std::string variant =
        family == "gpt-untied"    ? " --untie-embeddings-and-output-weights --reset-position-ids --reset-attention-mask"
        : family == "gpt-no-bias" ? " --disable-bias-linear --add-qkv-bias"
        : family == "gpt-swiglu"  ? " --swiglu --ffn-hidden-size 96"
        : family == "gpt-rope"    ? " --position-embedding-type rope --rotary-percent 0.5"
        : family == "gpt-gqa"     ? " --group-query-attention --num-query-groups 2"
        : family == "gpt-qknorm"  ? " --qk-layernorm --position-embedding-type rope "
                                    "--rotary-interleaved --rotary-seq-len-interpolation-factor 2"
        : family == "gpt-relu2"   ? " --squared-relu --apply-layernorm-1p --apply-residual-connection-post-layernorm"
                                  : "";
    ok(train(type, tmp / (family + "_cpu"), "--device cpu --eval-samples 4000" + variant));
    ok(train(type, tmp / (family + "_gpu"), "--device cuda --eval-samples 4000" + variant));
    const auto cpu = series(tmp / (family + "_cpu") / "metrics.h5", "train/lm_loss");
    const auto gpu = series(tmp / (family + "_gpu") / "metrics.h5", "train/lm_loss");
    ASSERT_EQ(cpu.size(), 20u);
    ASSERT_EQ(gpu.size(), 20u);
    for (size_t i = 0; i < 20; ++i) EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * cpu[i]) << family << " iteration " << i + 1;
    for (const std::string set : {"validation", "test"}) {
      const auto c = series(tmp / (family + "_cpu") / "metrics.h5", set + "/lm_loss"),
                 g = series(tmp / (family + "_gpu") / "metrics.h5", set + "/lm_loss");
      ASSERT_EQ(c.size(), 1u) << set;
      ASSERT_EQ(g.size(), 1u) << set;
      EXPECT_NEAR(g[0], c[0], 1e-4 * c[0]) << set;
    }
    if (family == "bert") {
      const auto sc = series(tmp / "bert_cpu" / "metrics.h5", "train/sop_loss"),
                 sg = series(tmp / "bert_gpu" / "metrics.h5", "train/sop_loss");
      for (size_t i = 0; i < 20; ++i) EXPECT_NEAR(sg[i], sc[i], 1e-4 * sc[i]) << "sop loss, iteration " << i + 1;
    }
  }
}

TEST_F(Gpu, Bf16AndFp16StayNearFp32) {
  mb::testing::TempDir tmp;
  ok(train("gpt", tmp / "f32", "--device cuda"));
  ok(train("gpt", tmp / "bf16", "--device cuda --bf16"));
  ok(train("gpt", tmp / "fp16", "--device cuda --fp16 --initial-loss-scale 65536"));
  const auto f = series(tmp / "f32" / "metrics.h5", "train/lm_loss"), b = series(tmp / "bf16" / "metrics.h5", "train/lm_loss"),
             h = series(tmp / "fp16" / "metrics.h5", "train/lm_loss");
  // the tolerance of the CPU emulation test (test_mixed_precision): two units of the half
  // type's roundoff, relative, at every iteration
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_NEAR(b[i], f[i], 0x1.0p-7 * f[i]) << "bf16, iteration " << i + 1;
    EXPECT_NEAR(h[i], f[i], 0x1.0p-10 * f[i]) << "fp16, iteration " << i + 1;
  }
}

// Head size 64 takes the flash kernels in bf16 and fp16 (f32 keeps the explicit attention):
// GPT (causal, 100 tokens: two tiles, the second cut short), BERT (padding masks) and T5
// (self-attention with the relative position bias, causal in the decoder; cross-attention of
// 24 decoder queries over 72 padded encoder positions) stay near the f32 run as the explicit
// half-precision runs do, with attention dropout on, and repeat bitwise. --attention-backend
// unfused takes the explicit attention in bf16 (near f32 too); flash is refused in f32.
TEST_F(Gpu, FlashAttentionTrainsNearFp32AndRepeatsBitwise) {
  mb::testing::TempDir tmp;
  for (const std::string family : {"gpt", "bert", "t5"}) {
    SCOPED_TRACE(family);
    const bool wordpiece = family != "gpt";
    auto run = [&](const std::string& name, const std::string& extra) {
      const std::string cmd =
          mb::testing::bin_dir() + "/train --model-type " + family + " --num-layers 2 --hidden-size 128 " +
          "--num-attention-heads 2 --seq-length " + (wordpiece ? "72" : "100") +
          (family == "t5" ? " --decoder-seq-length 24" : "") + " --micro-batch-size 4 " +
          "--global-batch-size 8 --train-iters 12 --lr 1e-3 --lr-warmup-iters 2 --log-interval 4 --eval-iters 0 " +
          "--threads 4 --device cuda --data-path " +
          (mb::testing::brown_data() / (wordpiece ? "brown_bert_text_sentence" : "brown_gpt2_text_document")).string() +
          " --run-dir " + (tmp / (family + name)).string() + " " + extra;
      const auto r = mb::testing::run_command(cmd);
      EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
      // the half types take flash attention, unless --attention-backend unfused says otherwise
      const bool flash = !extra.empty() && extra.find("unfused") == std::string::npos;
      EXPECT_EQ(r.output.find(", flash attention") != std::string::npos, flash) << r.output;
      // under tests/gpu/run.sh's second pass: the opt-in variants are the ones running
      if (const char* dq = std::getenv("MEGABATCH_FLASH_DQ"); dq && std::string(dq) == "ordered") {
        EXPECT_NE(r.output.find("; flash kernels, ordered dQ"), std::string::npos) << r.output;
      }
      return series(tmp / (family + name) / "metrics.h5", "train/lm_loss");
    };
    const auto f = run("f32", ""), b = run("bf16", "--bf16"), b2 = run("bf16again", "--bf16"),
               h = run("fp16", "--fp16 --initial-loss-scale 65536"),
               u = run("bf16unfused", "--bf16 --attention-backend unfused");
    ASSERT_EQ(f.size(), 12u);
    for (size_t i = 0; i < f.size(); ++i) {
      EXPECT_NEAR(b[i], f[i], 0x1.0p-7 * f[i]) << "bf16, iteration " << i + 1;
      EXPECT_NEAR(h[i], f[i], 0x1.0p-10 * f[i]) << "fp16, iteration " << i + 1;
      EXPECT_NEAR(u[i], f[i], 0x1.0p-7 * f[i]) << "bf16, the explicit attention, iteration " << i + 1;
    }
    EXPECT_EQ(b, b2) << "two bf16 runs differ";
  }
  const auto r = mb::testing::run_command(train("gpt", tmp / "f32flash", "--device cuda --attention-backend flash"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--attention-backend flash: cuda:0 runs the flash kernels in bf16 or fp16"),
            std::string::npos)
      << r.output;
}

TEST_F(Gpu, ForcedFp16OverflowSkipsStepsAndBacksTheScaleOffAsOnTheCpu) {
  mb::testing::TempDir tmp;
  // checkpoints on the way: saving must not count a step's overflow flag twice
  for (const std::string d : {"cpu", "gpu"})
    ok(train("gpt", tmp / d, std::string("--device ") + (d == "cpu" ? "cpu" : "cuda") +  // 2^32: the first steps overflow
                                 " --fp16 --save-interval 3 --save " + (tmp / d / "ckpt").string(), 8));
  const auto sg = series(tmp / "gpu" / "metrics.h5", "train/loss_scale"), kg = series(tmp / "gpu" / "metrics.h5", "train/skipped");
  EXPECT_EQ(sg[0], 4294967296.0);
  EXPECT_EQ(kg[0], 1.0);
  EXPECT_EQ(kg[1], 1.0);
  EXPECT_EQ(sg[2], 2147483648.0) << "the second overflow halves the scale (hysteresis 2)";
  EXPECT_EQ(series(tmp / "cpu" / "metrics.h5", "train/loss_scale"), sg) << "the same scale history as the CPU run";
  EXPECT_EQ(series(tmp / "cpu" / "metrics.h5", "train/skipped"), kg) << "the same skipped steps";
  EXPECT_EQ(series(tmp / "cpu" / "metrics.h5", "train/learning_rate"), series(tmp / "gpu" / "metrics.h5", "train/learning_rate"))
      << "the LR schedule held on the same steps (read one step late on the GPU)";
  double skipped = 0;
  for (double k : kg) skipped += k;
  for (const std::string d : {"cpu", "gpu"}) {
    const auto state = mb::io::read_checkpoint_state(*mb::io::latest_checkpoint(tmp / d / "ckpt"));
    EXPECT_EQ(state.trainer["optimizer_steps"].get<int64_t>(), 8 - static_cast<int64_t>(skipped)) << d;
    EXPECT_EQ(state.trainer["lr_samples"].get<int64_t>(), (8 - static_cast<int64_t>(skipped)) * 8) << d;
  }
}

// A ramped batch (--rampup-batch-size 4 4 16 to 8: four steps of 4, then 8) in fp16 from a
// loss scale of 2^23, halved at each overflow (on the CPU the first two steps overflow, the
// rest do not; 2^20 none, 2^24 all ten): the GPU reads each step's overflow
// flag one step late, and the step it then counts must advance the schedule by its own batch,
// not the next one's. The CPU's and the GPU's learning rates, skips and batches agree, and the
// schedule stands at the samples of the applied steps.
TEST_F(Gpu, ARampedFp16RunCountsTheBatchOfEachAppliedStepAsOnTheCpu) {
  mb::testing::TempDir tmp;
  auto ramped = [&](const std::string& d) {
    std::string cmd =
        train("gpt", tmp / d,
              std::string("--device ") + (d == "cpu" ? "cpu" : "cuda") +
                  " --fp16 --initial-loss-scale 8388608 --hysteresis 1 --save " + (tmp / d / "ckpt").string());
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"--train-iters 20", "--train-samples 64"},
                                   {"--lr-warmup-iters 2", "--lr-warmup-samples 8 --rampup-batch-size 4 4 16"}})
      cmd.replace(cmd.find(from), from.size(), to);
    return cmd;
  };
  for (const std::string d : {"cpu", "gpu"}) ok(ramped(d));
  const fs::path cpu = tmp / "cpu" / "metrics.h5", gpu = tmp / "gpu" / "metrics.h5";
  const auto batch = series(gpu, "train/global_batch_size"), skipped = series(gpu, "train/skipped");
  ASSERT_EQ(batch, (std::vector<double>{4, 4, 4, 4, 8, 8, 8, 8, 8, 8}));
  ASSERT_EQ(skipped.size(), batch.size());
  EXPECT_EQ(skipped[0], 1.0) << "the first step overflows at 2^23";
  EXPECT_LT(std::accumulate(skipped.begin(), skipped.end(), 0.0), 10.0) << "and some steps are applied";
  for (const std::string s : {"train/learning_rate", "train/skipped", "train/loss_scale", "train/global_batch_size"})
    EXPECT_EQ(series(cpu, s), series(gpu, s)) << s;
  double applied = 0;
  for (size_t i = 0; i < batch.size(); ++i) applied += (1.0 - skipped[i]) * batch[i];
  for (const std::string d : {"cpu", "gpu"}) {
    const auto state = mb::io::read_checkpoint_state(*mb::io::latest_checkpoint(tmp / d / "ckpt"));
    EXPECT_EQ(state.trainer["lr_samples"].get<int64_t>(), static_cast<int64_t>(applied)) << d;
  }
}

TEST_F(Gpu, RunsAreBitwiseRepeatableAndResumeIsBitwise) {
  mb::testing::TempDir tmp;
  for (const std::string opt : {"adamw", "lamb"}) {
    for (const std::string prec : {"", "--bf16"}) {
      SCOPED_TRACE(opt + " " + prec);
      const std::string flags = "--device cuda --optimizer " + opt + " " + prec + " --log-noise-scale";
      const fs::path a = tmp / (opt + prec + "a"), b = tmp / (opt + prec + "b"), c = tmp / (opt + prec + "c");
      ok(train("gpt", a, flags + " --save " + (a / "ckpt").string(), 8));
      ok(train("gpt", b, flags, 8));
      ok(train("gpt", c, flags + " --save " + (c / "ckpt").string() + " --exit-interval 5", 8));
      ok(train("gpt", c, flags + " --save " + (c / "ckpt").string() + " --load " + (c / "ckpt").string(), 8));
      for (const std::string s : {"train/lm_loss", "train/grad_norm", "noise_scale/b_simple"}) {
        EXPECT_EQ(series(a / "metrics.h5", s), series(b / "metrics.h5", s)) << s << ": two runs differ";
        EXPECT_EQ(series(a / "metrics.h5", s), series(c / "metrics.h5", s)) << s << ": the resumed run differs";
      }
    }
  }
}

TEST_F(Gpu, CheckpointsMoveBetweenGpuAndCpu) {
  mb::testing::TempDir tmp;
  // GPU to CPU: 4 steps on the GPU, 4 more on the CPU; against 8 on the GPU
  ok(train("gpt", tmp / "g8", "--device cuda", 8));
  ok(train("gpt", tmp / "g4", "--device cuda --exit-interval 4 --save " + (tmp / "g4" / "ckpt").string(), 8));
  ok(train("gpt", tmp / "c4", "--device cpu --load " + (tmp / "g4" / "ckpt").string(), 8));
  const auto whole = series(tmp / "g8" / "metrics.h5", "train/lm_loss"), resumed = series(tmp / "c4" / "metrics.h5", "train/lm_loss");
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(resumed[i], whole[4 + i], 1e-4 * whole[4 + i]) << "iteration " << 5 + i;
  // CPU to GPU, and a bf16 GPU run from an fp32 CPU checkpoint
  ok(train("gpt", tmp / "c2", "--device cpu --exit-interval 2 --save " + (tmp / "c2" / "ckpt").string(), 4));
  ok(train("gpt", tmp / "g2", "--device cuda --bf16 --load " + (tmp / "c2" / "ckpt").string(), 4));
}

TEST_F(Gpu, DiagnosticsAndTheNoiseScaleReachMetrics) {
  mb::testing::TempDir tmp;
  ok(train("gpt", tmp / "cpu", "--device cpu --optimizer lamb --diagnostics-interval 1 --log-noise-scale", 6));
  ok(train("gpt", tmp / "gpu", "--device cuda --optimizer lamb --diagnostics-interval 1 --log-noise-scale", 6));
  mb::testing::H5File c((tmp / "cpu" / "metrics.h5").string(), mb::testing::H5File::kRead),
      g((tmp / "gpu" / "metrics.h5").string(), mb::testing::H5File::kRead);
  const auto tc = c.read<double>("optimizer/trust_ratio"), tg = g.read<double>("optimizer/trust_ratio");
  ASSERT_EQ(tc.size(), tg.size());
  for (size_t i = 0; i < tc.size(); ++i) EXPECT_NEAR(tg[i], tc[i], 1e-3 * std::abs(tc[i])) << "trust ratio " << i;
  const auto bc = c.read<double>("noise_scale/b_simple"), bg = g.read<double>("noise_scale/b_simple");
  ASSERT_EQ(bc.size(), bg.size());
  for (size_t i = 0; i < bc.size(); ++i) EXPECT_NEAR(bg[i], bc[i], 1e-3 * std::abs(bc[i])) << "B_simple " << i;
}

// ---- in-process: plugins and the allocator --------------------------------------------

namespace {

mb::models::ModelConfig tiny() {
  mb::models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.seq_length = 16;
  c.vocab_size = 500;
  c.hidden_dropout = c.attention_dropout = 0;
  return c;
}

// Gradients that are a pure function of the parameter and element, on any device.
void fill_grads(mb::nn::ParameterStore& store, int step) {
  for (size_t i = 0; i < store.count(); ++i) {
    const auto& info = store.info(static_cast<int>(i));
    const uint64_t key = mb::mix_key(mb::name_key(info.name.data(), info.name.size()), static_cast<uint64_t>(step));
    std::vector<float> g(info.numel);
    for (size_t j = 0; j < g.size(); ++j) g[j] = static_cast<float>(0.01 * mb::philox_normal(key, j));
    mb::copy(store.grad(static_cast<int>(i)), mb::from_host(g, store.grad(static_cast<int>(i)).shape()));
  }
}

}  // namespace

// Every plugin, four steps with a learning rate that changes every step (and the embedding's
// own, --decoupled-lr's, another), on the CPU and the GPU: the same parameters and state; and
// on the GPU no upload from the third step on.
TEST_F(Gpu, EveryPluginStepsOnTheGpuAsOnTheCpu) {
  mb::comm::LocalCommunicator tp;
  const auto search = mb::optim::plugin_search_path({plugin_dirs()});
  const std::map<std::string, nlohmann::json> plugins = {
      {"sgd", {{"momentum", 0.9}, {"nesterov", true}}}, {"adamw", {}}, {"lamb", {{"max_grad_norm", 0.5}}},
      {"lars", {{"weight_decay", 0.01}}}, {"lamb_noise", {{"ref_batch", 4}}}, {"lamb_embscale", {{"ref_batch", 4}}},
      {"adafactor", {{"weight_decay", 0.01}}}};
  for (const auto& [name, hp] : plugins) {
    SCOPED_TRACE(name);
    const auto plugin = mb::optim::load_plugin(name, search);
    std::vector<float> params[2];
    std::map<std::string, std::vector<float>> state[2];
    for (int d = 0; d < 2; ++d) {
      const mb::Device dev = d ? mb::Device::cuda(0) : mb::Device::cpu();
      auto model = mb::models::make_model(tiny(), tp, 7, mb::DType::kF32, dev);
      mb::optim::PluginOptimizer opt(plugin, model->parameters(), tp, mb::optim::resolve_hparams(plugin, hp, "t"), 3);
      for (int s = 1; s <= 4; ++s) {
        fill_grads(model->parameters(), s);
        opt.set_decoupled_lr(3e-2 / s);
        opt.step(s, 1e-2 * s, 64, -1.0, s == 3);
        // the job tables are on the device after the first steps (the step's numbers come
        // through info.values): nothing is uploaded from the third step on
        if (d == 1 && s == 1) {
          EXPECT_GT(opt.plugin_uploads_last_step(), 0) << name;
        }
        if (d == 1 && s >= 3) {
          EXPECT_EQ(opt.plugin_uploads_last_step(), 0) << name << " step " << s;
        }
      }
      params[d] = mb::to_host_f32(model->parameters().params());
      for (const auto& [key, st] : opt.state())
        if (st.checkpointed) state[d][key.first + "/" + key.second] = mb::to_host_f32(st.tensor);
    }
    ASSERT_EQ(params[0].size(), params[1].size());
    for (size_t j = 0; j < params[0].size(); ++j)
      ASSERT_NEAR(params[1][j], params[0][j], 1e-5f * std::max(1.0f, std::abs(params[0][j]))) << name << " parameter " << j;
    ASSERT_EQ(state[0].size(), state[1].size());
    for (const auto& [key, v] : state[0])
      for (size_t j = 0; j < v.size(); ++j)
        ASSERT_NEAR(state[1][key][j], v[j], 1e-4f * std::max(1e-3f, std::abs(v[j]))) << key << "[" << j << "]";
  }
}

TEST_F(Gpu, APluginWithoutDeviceCodeIsRefusedByName) {
  mb::comm::LocalCommunicator tp;
  const auto plugin = mb::optim::load_plugin("throwing", mb::optim::plugin_search_path({plugin_dirs()}));
  auto model = mb::models::make_model(tiny(), tp, 7, mb::DType::kF32, mb::Device::cuda(0));
  mb::testing::expect_error(
      [&] { mb::optim::PluginOptimizer opt(plugin, model->parameters(), tp, mb::optim::resolve_hparams(plugin, {}, "t"), 1); },
      "optimizer plugin 'throwing'");
  mb::testing::expect_error(
      [&] { mb::optim::PluginOptimizer opt(plugin, model->parameters(), tp, mb::optim::resolve_hparams(plugin, {}, "t"), 1); },
      "has no GPU code");
}

namespace {

// The trainer over tiny() in `dt` on the GPU (LAMB, two micro-batches a step, the noise scale
// on): a log line and diagnostics every 4 steps, no evaluation.
struct SteadyRun {
  struct Src : mb::train::BatchSource {
    void fill(uint64_t first, int64_t count, mb::train::Batch& b) override {
      b.batch = count;
      b.seq = 16;
      b.tokens.assign(static_cast<size_t>(count * 16), 0);
      b.labels.assign(b.tokens.size(), 0);
      for (size_t i = 0; i < b.tokens.size(); ++i) {
        b.tokens[i] = static_cast<int32_t>((first * 31 + i * 7) % 500);
        b.labels[i] = static_cast<int32_t>((first * 17 + i * 3) % 500);
      }
    }
  };
  explicit SteadyRun(mb::DType dt)
      : model(mb::models::make_model(tiny(), tp, 7, dt, mb::Device::cuda(0))),
        plugin(mb::optim::load_plugin("lamb", mb::optim::plugin_search_path())),
        opt(plugin, model->parameters(), tp, mb::optim::resolve_hparams(plugin, {}, "t"), 1),
        trainer(mb::testing::steady_state_options(), *model, opt, tp, src, nullptr, nullptr, console) {}

  mb::comm::LocalCommunicator tp;
  std::unique_ptr<mb::train::Model> model;
  mb::optim::Plugin plugin;
  mb::optim::PluginOptimizer opt;
  Src src;
  std::ostringstream console;
  mb::train::Trainer trainer;
};

}  // namespace

TEST_F(Gpu, TheSteadyStateStepAllocatesNoDeviceMemory) {
  const mb::Device dev = mb::Device::cuda(0);
  for (const mb::DType dt : {mb::DType::kF32, mb::DType::kBF16, mb::DType::kF16}) {
    SCOPED_TRACE(mb::dtype_name(dt));
    SteadyRun run(dt);
    for (int s = 0; s < 8; ++s) run.trainer.train_step();  // warm-up: the cache fills
    const auto before = mb::runtime::alloc_stats(dev);
    for (int s = 0; s < 8; ++s) run.trainer.train_step();  // two log intervals, diagnostics included
    mb::runtime::synchronize(dev);
    const auto after = mb::runtime::alloc_stats(dev);
    EXPECT_EQ(after.raw_allocs, before.raw_allocs) << "cudaMalloc in the steady-state step";
    EXPECT_EQ(after.raw_frees, before.raw_frees) << "cudaFree in the steady-state step";
    EXPECT_EQ(run.trainer.losses().size(), 16u);
  }
}

// A step without a log line or diagnostics never waits for the GPU: each of three such steps
// is issued behind a hold on the run's stream, which is let go only once train_step() has
// returned. A step that read a device value back, synchronized, or uploaded its batch from
// pageable memory (which lets the driver wait for the stream) would wait out the deadline.
TEST_F(Gpu, TheSteadyStateStepNeverWaitsForTheGpu) {
  const mb::Device dev = mb::Device::cuda(0);
  for (const mb::DType dt : {mb::DType::kF32, mb::DType::kBF16, mb::DType::kF16}) {
    SCOPED_TRACE(mb::dtype_name(dt));
    SteadyRun run(dt);
    for (int s = 1; s <= 8; ++s) run.trainer.train_step();  // warm-up; iterations 4 and 8 log
    for (int s = 9; s <= 11; ++s) {
      mb::runtime::StreamHold hold(dev, 60.0);
      run.trainer.train_step();
      ASSERT_FALSE(hold.release()) << "iteration " << s << " waited for the GPU (for 60 s, behind the hold)";
    }
    run.trainer.train_step();  // iteration 12: its log line reads the three steps back
    const std::vector<double> losses = run.trainer.losses();
    ASSERT_EQ(losses.size(), 12u);
    for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  }
}

// A step's time (train/iteration_time_ms) is the time it took, not the time to queue it: the
// host runs ahead of the GPU, and the read at a drain waits for the steps it queued; that
// wait is the last step's. Here the stream is held for 2 s behind the step, so the drain waits
// (measured around it here), and the step's time holds that wait (without, it was the host's
// 1 ms). The times then sum to the interval's, as sweep analyze's time to a target needs.
TEST_F(Gpu, StepTimesCountTheWaitForTheStepsTheHostQueuedAhead) {
  const mb::Device dev = mb::Device::cuda(0);
  mb::testing::TempDir tmp;
  mb::train::TrainOptions o;
  std::ostringstream console;
  double drain_ms = 0;
  {
    mb::io::MetricsFile metrics(tmp / "metrics.h5", nlohmann::json::object());
    mb::train::StepRecorder recorder(o, false, &metrics, console);
    recorder.allocate({}, dev);
    recorder.begin_step();
    mb::runtime::StreamHold hold(dev, 2.0);
    recorder.record(1, 8, 8, 1e-3, 0.001);
    const auto t0 = std::chrono::steady_clock::now();
    recorder.drain();
    drain_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(hold.release()) << "the hold ran its 2 s: the drain waited for it";
  }
  const auto ms = mb::io::read_metric_series(tmp / "metrics.h5")["train/iteration_time_ms"];
  ASSERT_EQ(ms.size(), 1u);
  ASSERT_GT(drain_ms, 100.0) << "the drain waited behind the held stream";
  // the step's time: the 1 ms given, and the read's wait, most of the drain (the rest is the
  // host appending the row)
  EXPECT_GE(ms[0], 1.0 + 0.9 * drain_ms) << "drain " << drain_ms << " ms";
}

// Host->device copies up to 2 MiB go through pinned staging: issued behind a hold on the
// stream, from a source that is overwritten as soon as each copy returns, none of them waits
// for the device, and each lands with its own bytes; so do many more without a hold (laps of
// the staging chunks, and copies too large to stage).
TEST_F(Gpu, HostToDeviceCopiesNeverWaitAndLandThoughTheirSourceIsGone) {
  const mb::Device dev = mb::Device::cuda(0);
  auto byte_of = [](size_t copy, size_t i) { return static_cast<uint8_t>((copy * 131 + i * 7 + i / 251) & 0xff); };
  auto total_of = [](const std::vector<size_t>& sizes) {
    size_t t = 0;
    for (size_t n : sizes) t += n;
    return t;
  };
  auto issue = [&](void* d, const std::vector<size_t>& sizes) {
    std::vector<uint8_t> src;
    size_t at = 0;
    for (size_t c = 0; c < sizes.size(); ++c) {
      src.assign(sizes[c], 0);
      for (size_t i = 0; i < sizes[c]; ++i) src[i] = byte_of(c, i);
      mb::runtime::copy_bytes(static_cast<uint8_t*>(d) + at, dev, src.data(), mb::Device::cpu(), sizes[c]);
      std::fill(src.begin(), src.end(), uint8_t{0xa5});  // the source changes at once
      at += sizes[c];
    }
  };
  auto verify = [&](const void* d, const std::vector<size_t>& sizes) {
    std::vector<uint8_t> got(total_of(sizes));
    mb::runtime::copy_bytes(got.data(), mb::Device::cpu(), d, dev, got.size());
    size_t at = 0;
    for (size_t c = 0; c < sizes.size(); ++c) {
      for (size_t i = 0; i < sizes[c]; ++i)
        ASSERT_EQ(got[at + i], byte_of(c, i)) << "copy " << c << " (" << sizes[c] << " bytes), byte " << i;
      at += sizes[c];
    }
  };
  // behind a hold: 21 copies, 3.4 MiB, fewer than three chunks' worth (a fourth chunk would be
  // the first one again, whose copies are still behind the hold)
  std::vector<size_t> held;
  for (size_t k = 0; k < 3; ++k)
    for (size_t n : {size_t{1}, size_t{3}, size_t{16}, size_t{1000}, size_t{4096}, size_t{65537}, size_t{1} << 20})
      held.push_back(n + k * 5);
  // then: 40 laps' worth of 1.5 MiB copies and odd sizes, and 3 MiB and 9 MiB copies (not staged)
  std::vector<size_t> many;
  for (size_t k = 0; k < 120; ++k) many.push_back(k % 3 == 2 ? 7 + k : (size_t{3} << 19) + k);
  many.push_back(size_t{3} << 20);
  many.push_back(size_t{9} << 20);
  void* d = mb::runtime::raw_alloc(dev, total_of(held) + total_of(many));  // (cudaMalloc may wait: not behind the hold)
  void* d_many = static_cast<uint8_t*>(d) + total_of(held);
  const uint32_t first = 7;  // the staging's pinned memory is allocated at the first copy: not behind the hold
  mb::runtime::copy_bytes(d, dev, &first, mb::Device::cpu(), sizeof first);
  {
    mb::runtime::StreamHold hold(dev, 60.0);
    issue(d, held);
    ASSERT_FALSE(hold.release()) << "a host->device copy waited for the GPU (for 60 s, behind the hold)";
  }
  verify(d, held);
  issue(d_many, many);
  verify(d_many, many);
  mb::runtime::raw_free(dev, d, total_of(held) + total_of(many));
}

// ---- several ranks: NCCL, and processes sharing the GPU ---------------------------------

namespace {

std::string mpirun(int np) {
  const char* e = std::getenv("MEGABATCH_MPIRUN");
  return mb::testing::mpi_env() + std::string(e && *e ? e : "mpirun") + " --bind-to none -np " + std::to_string(np) + " ";  // each rank --threads 2
}

// A tensor of n elements of type t on `d`, start + (i mod 128): integers of at most 8
// significant bits for the starts used here, exact in bf16 and f16.
mb::Tensor ramp(size_t n, float start, mb::DType t, mb::Device d) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i % 128);
  return mb::from_host(v, {static_cast<int64_t>(n)}, t, d);
}

}  // namespace

TEST_F(Gpu, NcclWithOneRankMovesDeviceBuffersInOrderOnTheRunsStream) {
  const mb::Device dev = mb::Device::cuda(0);
  auto nccl = mb::comm::make_nccl_communicator(nullptr, dev);
  ASSERT_TRUE(nccl->device_buffers());
  EXPECT_EQ(nccl->size(), 1);
  EXPECT_EQ(nccl->backend().rfind("NCCL 2.", 0), 0u) << nccl->backend();
  // 2^24 elements: the upload on the run's stream is still in flight when the collective
  // is issued, so a collective not ordered after it would read stale memory
  const size_t n = size_t{1} << 24;
  for (const mb::DType t : {mb::DType::kF32, mb::DType::kBF16, mb::DType::kF16}) {
    SCOPED_TRACE(mb::dtype_name(t));
    const mb::Tensor in = ramp(n, 3.0f, t, dev), out = ramp(n, -100.0f, t, dev);
    mb::comm::all_gather(*nccl, in, out);  // one rank: out = in
    mb::comm::reduce_scatter(*nccl, in, in);
    const mb::Tensor b = ramp(n, 7.0f, t, dev);
    mb::comm::broadcast(*nccl, b, 0);
    nccl->all_reduce_device(b.raw(), n, t, mb::comm::ReduceOp::kMax);
    const std::vector<float> o = mb::to_host_f32(out), bb = mb::to_host_f32(b);
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += o[i] != 3.0f + static_cast<float>(i % 128) || bb[i] != 7.0f + static_cast<float>(i % 128);
    EXPECT_EQ(wrong, 0u);
  }
  double h[3] = {1.5, -2.0, 4.0};  // host buffers go through the device
  nccl->all_reduce(h, 3, mb::comm::ReduceOp::kSum);
  EXPECT_EQ(h[0], 1.5);
  EXPECT_EQ(h[2], 4.0);
  float g[2] = {5, 6}, ga[2] = {0, 0};
  nccl->all_gather(g, ga, 2);
  EXPECT_EQ(ga[0], 5.0f);
  EXPECT_EQ(ga[1], 6.0f);
  // the distributed optimizer's non-blocking reduce-scatter: on NCCL's stream, and the
  // run's stream waits for it at wait_all()
  const mb::Tensor rs_in = ramp(n, 11.0f, mb::DType::kF32, dev), rs_out = ramp(n, 0.0f, mb::DType::kF32, dev);
  nccl->start_reduce_scatter_device(rs_in.raw(), rs_out.raw(), n, mb::DType::kF32);
  nccl->wait_all();
  const std::vector<float> rs = mb::to_host_f32(rs_out);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += rs[i] != 11.0f + static_cast<float>(i % 128);
  EXPECT_EQ(wrong, 0u);
}

// --profile-steps on the GPU reads every kernel from CUPTI: each family of a GPT step has
// kernels, the rows and the idle time add up to the step, and profiling changes no result.
TEST_F(Gpu, ProfileStepsTimesEveryKernelByFamilyAndChangesNothing) {
  mb::testing::TempDir tmp;
  ok(train("gpt", tmp / "plain", "--device cuda --bf16", 8));
  const auto r = mb::testing::run_command(train("gpt", tmp / "profiled", "--device cuda --bf16 --profile-steps 4", 8));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto t = mb::testing::parse_profile(r.output);
  ASSERT_GT(t.step_ms, 0) << r.output;
  EXPECT_EQ(t.clock, "GPU (CUPTI)") << r.output;
  for (const char* family : {"attention forward", "attention backward", "GEMMs (linear layers)", "LM head + loss",
                             "LayerNorm", "elementwise", "optimizer", "embedding", "idle (GPU waiting)"})
    EXPECT_EQ(t.rows.count(family), 1u) << family << "\n" << r.output;
  for (const char* family : {"attention forward", "GEMMs (linear layers)", "LM head + loss", "optimizer"})
    EXPECT_GE(t.rows.count(family) ? t.rows.at(family).count : 0.0, 1.0) << family << "\n" << r.output;
  double sum = 0;
  for (const auto& [name, row] : t.rows) sum += row.ms;
  EXPECT_NEAR(sum, t.step_ms, 0.001 * 14) << r.output;
  EXPECT_NE(r.output.find("costliest kernels:"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("CUPTI dropped"), std::string::npos) << r.output;
  EXPECT_EQ(series(tmp / "profiled" / "metrics.h5", "train/lm_loss"), series(tmp / "plain" / "metrics.h5", "train/lm_loss"));
}

TEST_F(Gpu, TrainOverNcclInOneProcessIsTheLocalRunBitwise) {
  mb::testing::TempDir tmp;
  ok(train("gpt", tmp / "local", "--device cuda", 6));
  const auto r = mb::testing::run_command(train("gpt", tmp / "nccl", "--device cuda --distributed-backend nccl", 6));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> collectives: NCCL 2."), std::string::npos) << r.output;
  EXPECT_EQ(series(tmp / "nccl" / "metrics.h5", "train/lm_loss"), series(tmp / "local" / "metrics.h5", "train/lm_loss"));
}

// Four processes on the one GPU at TP 2 x DP 2: the collectives are host-staged MPI (NCCL
// refuses two ranks on one device), and the losses follow the same layout on the CPU.
TEST_F(Gpu, FourProcessesSharingTheGpuAtTpTwoByDpTwoFollowTheCpuLayout) {
  mb::testing::TempDir tmp;
  const std::string layout = "--tensor-model-parallel-size 2 --threads 2 ";
  ok(mpirun(4) + train("gpt", tmp / "cpu", layout + "--device cpu --optimizer lamb", 10));
  const auto r = mb::testing::run_command(mpirun(4) + train("gpt", tmp / "gpu", layout + "--device cuda --optimizer lamb", 10));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> collectives: MPI, host-staged: 4 ranks share 1 GPU"), std::string::npos) << r.output;
  const auto cpu = series(tmp / "cpu" / "metrics.h5", "train/lm_loss"), gpu = series(tmp / "gpu" / "metrics.h5", "train/lm_loss");
  ASSERT_EQ(cpu.size(), 10u);
  ASSERT_EQ(gpu.size(), 10u);
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * cpu[i]) << "iteration " << i + 1;
  const auto gc = series(tmp / "cpu" / "metrics.h5", "train/grad_norm"), gg = series(tmp / "gpu" / "metrics.h5", "train/grad_norm");
  for (size_t i = 0; i < gc.size(); ++i) EXPECT_NEAR(gg[i], gc[i], 1e-4 * gc[i]) << "grad norm, iteration " << i + 1;
  // and with the distributed optimizer: the LAMB state sharded over the two DP ranks
  const auto d = mb::testing::run_command(
      mpirun(4) + train("gpt", tmp / "dist", layout + "--device cuda --optimizer lamb --use-distributed-optimizer", 10));
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(d.output.find("gradients reduce-scattered over 2 ranks"), std::string::npos) << d.output;
  const auto dist = series(tmp / "dist" / "metrics.h5", "train/lm_loss");
  ASSERT_EQ(dist.size(), 10u);
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(dist[i], cpu[i], 1e-4 * cpu[i]) << "distributed optimizer, iteration " << i + 1;
  // bf16: each rank keeps the fp32 masters of its shard only and the bf16 parameters are
  // all-gathered; the losses follow the bf16 run without the distributed optimizer
  ok(mpirun(4) + train("gpt", tmp / "bf16", layout + "--device cuda --optimizer lamb --bf16", 10));
  const auto hd = mb::testing::run_command(
      mpirun(4) + train("gpt", tmp / "bf16dist", layout + "--device cuda --optimizer lamb --bf16 --use-distributed-optimizer", 10));
  ASSERT_EQ(hd.exit_code, 0) << hd.output;
  EXPECT_NE(hd.output.find("keeps optimizer state and fp32 master weights for"), std::string::npos) << hd.output;
  const auto half = series(tmp / "bf16" / "metrics.h5", "train/lm_loss"),
             half_dist = series(tmp / "bf16dist" / "metrics.h5", "train/lm_loss");
  ASSERT_EQ(half.size(), 10u);
  ASSERT_EQ(half_dist.size(), 10u);
  for (size_t i = 0; i < half.size(); ++i)
    EXPECT_NEAR(half_dist[i], half[i], 1e-4 * half[i]) << "bf16 distributed optimizer, iteration " << i + 1;
  // NCCL itself is refused by name for this layout, before any work
  const auto refused = mb::testing::run_command(mpirun(4) + train("gpt", tmp / "nccl", layout + "--device cuda --distributed-backend nccl", 2));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("--distributed-backend nccl: 4 ranks on this node share 1 GPU"), std::string::npos)
      << refused.output;
}

// sweep run --gpus all on this machine's GPU: two points, each holding the GPU while it
// runs (CUDA_VISIBLE_DEVICES), both trained on it; a point of two ranks does not fit.
TEST_F(Gpu, ASweepOfTwoPointsRunsOnTheGpu) {
  mb::testing::TempDir tmp;
  const fs::path file = tmp / "gpu_sweep.json";
  auto write = [&](const std::string& extra) {
    mb::testing::write_text(file, R"({"name": "gpu_sweep",
  "base": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "micro_batch_size": 4,
           "global_batch_size": 8, "train_iters": 10, "lr": 0.001, "log_interval": 5, "eval_iters": 0, "device": "cuda",
           "data_path": [")" + (mb::testing::brown_data() / "brown_gpt2_text_document").string() + R"("])" + extra + R"(},
  "seeds": [1, 2]})");
  };
  write("");
  const std::string sweep = mb::testing::bin_dir() + "/sweep run " + file.string() + " --runs-dir " + (tmp / "runs").string();
  const auto r = mb::testing::run_command(sweep + " --gpus all");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string id : {"s1", "s2"}) {
    EXPECT_NE(r.output.find("> start " + id + " (attempt 1) on GPU 0"), std::string::npos) << r.output;
    const fs::path dir = tmp / "runs" / "gpu_sweep" / id;
    EXPECT_TRUE(fs::exists(dir / "DONE")) << id;
    const std::string log = mb::testing::read_text(dir / "stdout.log");
    EXPECT_NE(log.find("(CUDA_VISIBLE_DEVICES=0)"), std::string::npos) << log;
    EXPECT_NE(log.find("> device: cuda:0"), std::string::npos) << log;
    EXPECT_EQ(series(dir / "metrics.h5", "train/lm_loss").size(), 10u) << id;
  }
  write(R"(, "data_parallel_size": 2)");
  const auto refused = mb::testing::run_command(sweep + "x --gpus all");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("need more GPUs (tensor_model_parallel_size x data_parallel_size) than --gpus gives (1)"),
            std::string::npos) << refused.output;
}
