// gpu_train_bench: training throughput of a GPT on one GPU (default GPT-2 124M: 12 layers,
// hidden 768, seq 1024, bf16, AdamW, micro batch 8) through the real trainer step, against
// PyTorch training the same model on the same GPU in the same run
// (tests/reference/gpt_torch.py bench_cuda: autocast bf16, fused AdamW; with the same
// explicit attention as megabatch's, with F.scaled_dot_product_attention, and with SDPA
// under torch.compile: --torch-modes). It also
// reports MFU (6 N + 6 L C T FLOPs per token against the GPU's dense peak, --peak-tflops)
// and checks the steady state: raw device allocations (cudaMalloc) during the timed steps.
// --profile then runs --profile-steps more steps under the profiler (core/device/profile.h)
// and prints where their GPU time went, by op family, and the costliest kernels.
//
//   build/bin/gpu_train_bench [--model gpt2-124m] [--micro-batch-size 8] [--dtype bf16]
//                             [--steps 20] [--peak-tflops 989] [--torch true] [--profile]
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/comm/communicator.h"
#include "core/device/profile.h"
#include "core/device/runtime.h"
#include "core/optim/optimizer.h"
#include "core/train/trainer.h"
#include "core/util/args.h"
#include "core/util/error.h"
#include "models/registry.h"

namespace mb = megabatch;
using Clock = std::chrono::steady_clock;

namespace {

// The same random micro-batch every step.
class FixedSource final : public mb::train::BatchSource {
 public:
  FixedSource(int64_t B, int64_t T) {
    std::mt19937 g(0);
    std::uniform_int_distribution<int> tok(0, 50256);
    b_.batch = B;
    b_.seq = T;
    for (int64_t i = 0; i < B * T; ++i) b_.tokens.push_back(tok(g)), b_.labels.push_back(tok(g));
  }
  void fill(uint64_t, int64_t, mb::train::Batch& out) override { out = b_; }

 private:
  mb::train::Batch b_;
};

mb::DType parse_dtype(const std::string& s) {
  if (s == "f32") return mb::DType::kF32;
  if (s == "bf16") return mb::DType::kBF16;
  if (s == "fp16") return mb::DType::kF16;
  mb::fail("--dtype: f32, bf16 or fp16, not '", s, "'");
}

}  // namespace

int main(int argc, char** argv) {
  mb::ArgParser a("gpu_train_bench", "usage: gpu_train_bench [--model gpt2-124m] [--micro-batch-size 8] [--dtype bf16]");
  a.option("model", "PRESET", "GPT preset", "gpt2-124m");
  a.option("micro-batch-size", "N", "samples per step", "8");
  a.option("seq-length", "T", "tokens per sample (0: the preset's; longer ones get as many learned positions)", "0");
  a.option("dtype", "T", "f32, bf16 or fp16", "bf16");
  a.option("steps", "N", "timed steps (after 3 warm-up steps)", "20");
  a.option("peak-tflops", "X", "the GPU's dense peak for the dtype, for MFU (H100 SXM bf16: 989)", "989");
  a.option("torch", "BOOL", "also measure PyTorch on the same GPU", "true");
  a.list("torch-modes", "M", "PyTorch's attention: explicit, sdpa, compile (SDPA under torch.compile)",
         {"explicit", "sdpa", "compile"});
  a.flag("profile", "after the timed steps, print GPU time per op family over --profile-steps more steps");
  a.option("profile-steps", "N", "steps under the profiler", "5");
  if (const auto rc = mb::bench::parse_flags(a, argc, argv)) return *rc;
  try {
    const mb::Device dev = mb::select_device("cuda");
    mb::runtime::use_device(dev);
    const mb::runtime::GpuInfo gpu = mb::runtime::gpu_info(dev.index);
    const mb::DType dtype = parse_dtype(a.get("dtype"));
    mb::models::ModelConfig c = mb::models::preset(a.get("model"));
    c.hidden_dropout = c.attention_dropout = 0.0;  // as the PyTorch side
    if (const int64_t t = a.get_int("seq-length"); t > 0) c.seq_length = c.max_position_embeddings = t;
    const int64_t B = a.get_int("micro-batch-size"), T = c.seq_length, steps = a.get_int("steps");
    mb::comm::LocalCommunicator tp;
    auto model = mb::models::make_model(c, tp, 1, dtype, dev);
    const auto plugin = mb::optim::load_plugin("adamw", mb::optim::plugin_search_path());
    mb::optim::PluginOptimizer opt(plugin, model->parameters(), tp, mb::optim::resolve_hparams(plugin, {}, "bench"), 1);
    FixedSource src(B, T);
    mb::train::TrainOptions o;
    o.micro_batch_size = o.global_batch_size = B;
    o.train_iters = 1 << 30;
    o.log_interval = 1 << 30;
    o.eval_iters = 0;
    o.schedule.max_lr = o.schedule.min_lr = 1e-4;
    o.schedule.style = mb::optim::DecayStyle::kConstant;
    o.loss_scaler.initial_scale = 1024.0f;
    o.tokens_per_sample = T;
    std::ostringstream console;
    mb::train::Trainer trainer(o, *model, opt, tp, src, nullptr, nullptr, console);
    for (int s = 0; s < 3; ++s) trainer.train_step();
    trainer.drain();
    mb::runtime::synchronize(dev);
    const mb::runtime::AllocStats before = mb::runtime::alloc_stats(dev);
    const auto t0 = Clock::now();
    for (int64_t s = 0; s < steps; ++s) trainer.train_step();
    trainer.drain();  // reads the step rows back: everything has run
    mb::runtime::synchronize(dev);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const mb::runtime::AllocStats after = mb::runtime::alloc_stats(dev);
    std::string profile;
    if (a.has("profile")) {  // after the timed steps, so the profiler's overhead stays out of them
      const int64_t n = a.get_int("profile-steps");
      mb::check(n >= 1, "--profile-steps must be at least 1, got ", n);
      mb::profile::Recorder rec(dev);
      for (int64_t s = 0; s < n; ++s) trainer.train_step();
      trainer.drain();
      profile = mb::profile::format(rec.stop(n));
    }
    const double ours = static_cast<double>(B * T * steps) / seconds;

    const double N = static_cast<double>(model->parameters().num_full_parameters());
    const double flops_per_token =
        6.0 * N + 6.0 * static_cast<double>(c.num_layers * c.hidden_size * T);
    const double peak = std::stod(a.get("peak-tflops")) * 1e12;
    std::printf("%s on %s (sm_%d%d), %s, micro batch %lld x seq %lld, AdamW, %lld timed steps; MFU against %.0f TFLOP/s\n",
                c.preset.c_str(), gpu.name.c_str(), gpu.major, gpu.minor, mb::dtype_name(dtype),
                static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(steps), peak / 1e12);
    std::printf("%-34s %12s %8s %10s %13s\n", "", "tokens/s", "MFU", "step ms", "GiB reserved");
    auto row = [&](const char* name, double tps, double reserved) {
      std::printf("%-34s %12.0f %7.1f%% %10.1f %13.2f\n", name, tps, 100.0 * tps * flops_per_token / peak,
                  1e3 * static_cast<double>(B * T) / tps, reserved / (1 << 30));
    };
    row("megabatch", ours, static_cast<double>(after.bytes_reserved));
    int status = after.raw_allocs == before.raw_allocs ? 0 : 1;
    if (a.get("torch") == "true") {
      const std::string src_dir = MEGABATCH_SOURCE_DIR;
      const char* py = std::getenv("MEGABATCH_PYTHON");
      for (const std::string& mode : a.get_list("torch-modes")) {
        mb::check(mode == "explicit" || mode == "sdpa" || mode == "compile",
                  "--torch-modes: explicit, sdpa or compile, not '", mode, "'");
        const std::string name = mode == "explicit" ? "PyTorch (explicit attention)"
                                 : mode == "sdpa"   ? "PyTorch (SDPA attention)"
                                                    : "PyTorch (SDPA, torch.compile)";
        try {
          const auto r = mb::bench::run_child({py ? py : "/usr/bin/python3", src_dir + "/tests/reference/gpt_torch.py",
                                               "bench_cuda", std::to_string(c.num_layers), std::to_string(c.hidden_size),
                                               std::to_string(c.num_attention_heads), std::to_string(T),
                                               std::to_string(c.padded_vocab_size()), std::to_string(B),
                                               std::to_string(steps), a.get("dtype"), mode});
          row(name.c_str(), mb::bench::value_of(r.output, "tokens_per_second"),
              mb::bench::value_of(r.output, "peak_reserved_bytes"));
        } catch (const std::exception& e) {  // the other rows still count; the run fails (its stderr is above)
          const std::string what = e.what();
          std::printf("%-34s failed: %s\n", name.c_str(), what.substr(0, 300).c_str());
          status = 1;
        }
      }
    }
    std::printf("raw device allocations during the timed steps: %lld (cudaMalloc), %lld (cudaFree); %.1f GiB reserved\n",
                static_cast<long long>(after.raw_allocs - before.raw_allocs),
                static_cast<long long>(after.raw_frees - before.raw_frees),
                static_cast<double>(after.bytes_reserved) / (1 << 30));
    if (!profile.empty()) std::printf("\n%s", profile.c_str());
    return status;
  } catch (const std::exception& e) {
    std::cerr << "gpu_train_bench: " << e.what() << std::endl;
    return 1;
  }
}
