// gpu_train_bench: training throughput on one GPU through the real trainer step, against
// PyTorch training the same model on the same GPU in the same run.
// - GPT (default GPT-2 124M: 12 layers, hidden 768, seq 1024, bf16, AdamW, micro batch 8)
//   against tests/reference/gpt_torch.py bench_cuda (autocast bf16, fused AdamW; with the same
//   explicit attention as megabatch's, with F.scaled_dot_product_attention, and with SDPA
//   under torch.compile: --torch-modes);
// - BERT (--model bert-large --seq-length 128 --micro-batch-size 64 --optimizers lamb adamw)
//   against tests/reference/bert_torch.py bench_cuda (autocast bf16, SDPA) with fused AdamW
//   and with a LAMB of torch._foreach ops; no padding, the same 1 in 7 positions masked on
//   both sides, the masked-LM head on those rows only.
// Both sides run without dropout, or with Megatron's hidden and attention dropout at --dropout
// P (PyTorch: F.dropout after the embeddings, the attention projection and fc2, SDPA's
// dropout_p), as a run that keeps Megatron's defaults (0.1) trains.
// Each row: sequences/s, tokens/s, MFU (6 N + 6 L C T FLOPs per token against the GPU's
// dense peak, --peak-tflops), step time and the memory reserved. It checks the steady state:
// raw device allocations (cudaMalloc) during the timed steps. --profile then runs
// --profile-steps more steps of the first optimizer under the profiler
// (core/device/profile.h) and prints where their GPU time went, by op family, and the
// costliest kernels.
//
// Each megabatch row runs once with each --flash-dq (the flash backward's dQ from a kernel of
// its own, and in order inside the dK/dV kernel: ops::FlashDq) and each --flash-forward-rows
// (the flash forward's query rows a warp: ops::FlashForwardRows), so that one run shows what
// each opt-in variant, and both, do to the whole step.
//
//   build/bin/gpu_train_bench [--model gpt2-124m] [--micro-batch-size 8] [--dtype bf16]
//                             [--steps 20] [--peak-tflops 989] [--torch true] [--profile]
//                             [--optimizers adamw lamb] [--flash-dq separate ordered]
//                             [--flash-forward-rows 16 32] [--dropout 0.1]
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
#include "core/ops/flash_attention.h"
#include "core/optim/optimizer.h"
#include "core/train/trainer.h"
#include "core/util/args.h"
#include "core/util/error.h"
#include "models/registry.h"

namespace mb = megabatch;
using Clock = std::chrono::steady_clock;

namespace {

// Every kMaskEvery-th position of a BERT sample (from 1) is masked: the rows of its LM head
// (bert_torch.py bench_cuda masks the same ones).
constexpr int64_t kMaskEvery = 7;

// The same random micro-batch every step: a GPT's (every token a label), or a BERT's (two
// segments, no padding, every kMaskEvery-th position masked, random sentence-order labels).
class FixedSource final : public mb::train::BatchSource {
 public:
  FixedSource(int64_t B, int64_t T, int64_t vocab, bool bert) {
    std::mt19937 g(0);
    std::uniform_int_distribution<int> tok(0, static_cast<int>(vocab) - 1);
    b_.batch = B;
    b_.seq = T;
    for (int64_t i = 0; i < B * T; ++i) {
      const int64_t t = i % T;
      b_.tokens.push_back(tok(g));
      b_.labels.push_back(!bert || t % kMaskEvery == 1 ? tok(g) : mb::train::kIgnoreLabel);
      if (bert) b_.token_types.push_back(t < T / 2 ? 0 : 1);
    }
    if (bert)
      for (int64_t i = 0; i < B; ++i) b_.sample_labels.push_back(static_cast<int32_t>(g() % 2));
  }
  void fill(uint64_t, int64_t, mb::train::Batch& out) override { out = b_; }

 private:
  mb::train::Batch b_;
};

struct Measured {
  double tokens_per_second = 0;
  mb::runtime::AllocStats before, after;
  std::string profile;  // empty without --profile
};

// Times `steps` trainer steps (after 3 warm-up steps) of a fresh model with the plugin.
Measured measure(const mb::models::ModelConfig& c, mb::DType dtype, mb::Device dev, int64_t B, int64_t steps,
                 const mb::optim::Plugin& plugin, int64_t profile_steps) {
  const int64_t T = c.seq_length;
  mb::comm::LocalCommunicator tp;
  auto model = mb::models::make_model(c, tp, 1, dtype, dev);
  mb::optim::PluginOptimizer opt(plugin, model->parameters(), tp, mb::optim::resolve_hparams(plugin, {}, "bench"), 1);
  FixedSource src(B, T, c.family == "bert" ? c.vocab_size : 50257, c.family == "bert");
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
  Measured m;
  m.before = mb::runtime::alloc_stats(dev);
  const auto t0 = Clock::now();
  for (int64_t s = 0; s < steps; ++s) trainer.train_step();
  trainer.drain();  // reads the step rows back: everything has run
  mb::runtime::synchronize(dev);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  m.after = mb::runtime::alloc_stats(dev);
  if (profile_steps > 0) {  // after the timed steps, so the profiler's overhead stays out of them
    mb::profile::Recorder rec(dev);
    for (int64_t s = 0; s < profile_steps; ++s) trainer.train_step();
    trainer.drain();
    m.profile = mb::profile::format(rec.stop(profile_steps));
  }
  m.tokens_per_second = static_cast<double>(B * T * steps) / seconds;
  return m;
}

// The benchmark, its flags read and checked first (guarded_main prints what it throws): a
// typo fails at once, not after the rows before it have run.
int run(int argc, char** argv) {
  mb::ArgParser a("gpu_train_bench", "usage: gpu_train_bench [--model gpt2-124m] [--micro-batch-size 8] [--dtype bf16]");
  a.option("model", "PRESET", "GPT or BERT preset", "gpt2-124m");
  a.option("micro-batch-size", "N", "samples per step", "8");
  a.option("seq-length", "T", "tokens per sample (0: the preset's; longer ones get as many learned positions)", "0");
  a.option("dtype", "T", "f32, bf16 or fp16", "bf16");
  a.option("steps", "N", "timed steps (after 3 warm-up steps)", "20");
  a.option("peak-tflops", "X", "the GPU's dense peak for the dtype, for MFU (H100 SXM bf16: 989)", "989");
  a.option("torch", "BOOL", "also measure PyTorch on the same GPU", "true");
  a.list("torch-modes", "M", "PyTorch's attention: explicit, sdpa, compile (SDPA under torch.compile)",
         {"explicit", "sdpa", "compile"});
  a.list("optimizers", "NAME", "optimizer plugins, one megabatch row each (BERT: PyTorch runs AdamW and LAMB)", {"adamw"});
  a.list("flash-dq", "HOW", "the flash backward's dQ, one megabatch row each: separate, ordered (ops::FlashDq)",
         {"separate", "ordered"});
  a.list("flash-forward-rows", "N", "the flash forward's rows a warp, one megabatch row each (ops::FlashForwardRows)",
         {"16", "32"});
  a.option("dropout", "P", "hidden and attention dropout on both sides (Megatron's default: 0.1)", "0");
  a.flag("profile", "after the timed steps, print GPU time per op family over --profile-steps more steps");
  a.option("profile-steps", "N", "steps under the profiler", "5");
  if (!a.parse(argc, argv)) return 0;
  const std::vector<std::string> dq = a.get_list("flash-dq"), rows = a.get_list("flash-forward-rows");
  for (const std::string& how : dq)
    mb::check(how == "separate" || how == "ordered", "--flash-dq: separate or ordered, not '", how, "'");
  for (const std::string& r : rows) mb::check(r == "16" || r == "32", "--flash-forward-rows: 16 or 32, not '", r, "'");
  const double dropout = a.get_double("dropout");
  mb::check(dropout >= 0 && dropout < 1, "--dropout ", dropout, ": a probability in [0, 1)");
  const std::string dname = a.get_choice("dtype", {"f32", "bf16", "fp16"});
  const mb::DType dtype = dname == "f32" ? mb::DType::kF32 : dname == "bf16" ? mb::DType::kBF16 : mb::DType::kF16;
  mb::models::ModelConfig c = mb::models::preset(a.get("model"));
  const bool bert = c.family == "bert";
  mb::check(c.family == "gpt" || bert, "--model: a GPT or BERT preset, not ", c.preset, " (", c.family, ")");
  c.hidden_dropout = c.attention_dropout = dropout;  // as the PyTorch side
  if (const int64_t t = a.get_int("seq-length"); t > 0) c.seq_length = c.max_position_embeddings = t;
  const int64_t B = a.get_int("micro-batch-size"), T = c.seq_length, steps = a.get_int("steps");
  mb::check(B >= 1, "--micro-batch-size ", B, ": at least 1");
  mb::check(steps >= 1, "--steps ", steps, ": at least 1");
  const int64_t profile_steps = a.has("profile") ? a.get_int("profile-steps") : 0;
  mb::check(!a.has("profile") || profile_steps >= 1, "--profile-steps must be at least 1, got ", profile_steps);
  const double peak = a.get_double("peak-tflops") * 1e12;
  mb::check(peak > 0, "--peak-tflops: the GPU's dense peak in TFLOP/s, above 0");
  const bool with_torch = a.get_choice("torch", {"true", "false"}) == "true";
  const std::vector<std::string> torch_modes = a.get_list("torch-modes");
  for (const std::string& mode : torch_modes)
    mb::check(mode == "explicit" || mode == "sdpa" || mode == "compile",
              "--torch-modes: explicit, sdpa or compile, not '", mode, "'");
  const std::vector<std::string> optimizers = a.get_list("optimizers");
  std::vector<mb::optim::Plugin> plugins;  // each found and loadable (its error names what to do)
  for (const std::string& name : optimizers)
    plugins.push_back(mb::optim::load_plugin(name, mb::optim::plugin_search_path()));
  const mb::Device dev = mb::select_device("cuda");
  mb::runtime::use_device(dev);
  const mb::runtime::GpuInfo gpu = mb::runtime::gpu_info(dev.index);
  std::vector<std::pair<std::string, Measured>> ours;  // (row name, what it measured)
  for (const std::string& r : rows) {
    mb::ops::set_flash_forward_rows(r == "32" ? mb::ops::FlashForwardRows::k32 : mb::ops::FlashForwardRows::k16);
    for (const std::string& how : dq) {
      mb::ops::set_flash_dq(how == "ordered" ? mb::ops::FlashDq::kOrdered : mb::ops::FlashDq::kSeparate);
      for (const mb::optim::Plugin& plugin : plugins) {
        std::string row = plugins.size() == 1 ? std::string("megabatch") : "megabatch " + plugin.name();
        if (how == "ordered") row += ", ordered dQ";
        if (r == "32") row += ", 32 fwd rows";
        ours.emplace_back(row, measure(c, dtype, dev, B, steps, plugin, ours.empty() ? profile_steps : 0));
      }
    }
  }
  mb::ops::set_flash_dq(mb::ops::FlashDq::kSeparate);
  mb::ops::set_flash_forward_rows(mb::ops::FlashForwardRows::k16);

  mb::comm::LocalCommunicator tp;
  const double N = static_cast<double>(mb::models::declare_model(c, tp)->parameters().num_full_parameters());
  const double flops_per_token = 6.0 * N + 6.0 * static_cast<double>(c.num_layers * c.hidden_size * T);
  std::string names;
  for (const auto& n : optimizers) names += (names.empty() ? "" : ", ") + n;
  std::printf(
      "%s on %s (sm_%d%d), %s, micro batch %lld x seq %lld, %s, dropout %g, %lld timed steps; MFU against %.0f "
      "TFLOP/s\n",
      c.preset.c_str(), gpu.name.c_str(), gpu.major, gpu.minor, mb::dtype_name(dtype), static_cast<long long>(B),
      static_cast<long long>(T), names.c_str(), dropout, static_cast<long long>(steps), peak / 1e12);
  std::printf("%-40s %12s %12s %8s %10s %13s\n", "", "sequences/s", "tokens/s", "MFU", "step ms", "GiB reserved");
  auto row = [&](const std::string& name, double tps, double reserved) {
    std::printf("%-40s %12.1f %12.0f %7.1f%% %10.1f %13.2f\n", name.c_str(), tps / static_cast<double>(T), tps,
                100.0 * tps * flops_per_token / peak, 1e3 * static_cast<double>(B * T) / tps, reserved / (1 << 30));
  };
  int status = 0;
  for (const auto& [name, m] : ours) {
    row(name, m.tokens_per_second, static_cast<double>(m.after.bytes_reserved));
    if (m.after.raw_allocs != m.before.raw_allocs) status = 1;
  }
  if (with_torch) {
    const std::string src_dir = MEGABATCH_SOURCE_DIR;
    const char* py = std::getenv("MEGABATCH_PYTHON");
    // GPT: one run per attention mode, with fused AdamW; BERT: SDPA, one run per optimizer
    std::vector<std::pair<std::string, std::vector<std::string>>> runs;
    const std::vector<std::string> shape = {std::to_string(c.num_layers),
                                            std::to_string(c.hidden_size),
                                            std::to_string(c.num_attention_heads),
                                            std::to_string(T),
                                            std::to_string(c.padded_vocab_size()),
                                            std::to_string(B),
                                            std::to_string(steps),
                                            a.get("dtype")};
    auto args = [&](const std::string& script, std::vector<std::string> extra) {
      std::vector<std::string> v = {py ? py : "/usr/bin/python3", src_dir + "/tests/reference/" + script, "bench_cuda"};
      v.insert(v.end(), shape.begin(), shape.end());
      v.insert(v.end(), extra.begin(), extra.end());
      v.push_back(a.get("dropout"));  // the scripts' last argument
      return v;
    };
    if (bert) {
      const std::string every = std::to_string(kMaskEvery), post = c.post_layernorm ? "1" : "0";
      runs.push_back({"PyTorch AdamW (fused), SDPA", args("bert_torch.py", {"adamw", post, every})});
      runs.push_back({"PyTorch LAMB (torch._foreach), SDPA", args("bert_torch.py", {"lamb", post, every})});
    } else {
      for (const std::string& mode : torch_modes) {
        runs.push_back({mode == "explicit" ? "PyTorch (explicit attention)"
                        : mode == "sdpa"   ? "PyTorch (SDPA attention)"
                                           : "PyTorch (SDPA, torch.compile)",
                        args("gpt_torch.py", {mode})});
      }
    }
    for (const auto& [name, cmd] : runs) {
      try {
        const auto r = mb::bench::run_child(cmd);
        row(name, mb::bench::value_of(r.output, "tokens_per_second"),
            mb::bench::value_of(r.output, "peak_reserved_bytes"));
      } catch (const std::exception& e) {  // the other rows still count; the run fails (its stderr is above)
        const std::string what = e.what();
        std::printf("%-40s failed: %s\n", name.c_str(), what.substr(0, 300).c_str());
        status = 1;
      }
    }
  }
  const Measured& first = ours.front().second;
  std::printf(
      "raw device allocations during the timed steps (%s): %lld (cudaMalloc), %lld (cudaFree); %.1f GiB reserved\n",
      ours.front().first.c_str(), static_cast<long long>(first.after.raw_allocs - first.before.raw_allocs),
      static_cast<long long>(first.after.raw_frees - first.before.raw_frees),
      static_cast<double>(first.after.bytes_reserved) / (1 << 30));
  if (!first.profile.empty()) std::printf("\n%s", first.profile.c_str());
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  return mb::bench::guarded_main("gpu_train_bench", [&] { return run(argc, argv); });
}
