// train: one training run, configured with Megatron-LM's arguments.
#include <omp.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>

#include "core/comm/communicator.h"
#include "core/comm/mpi_communicator.h"
#include "core/config/config.h"
#include "core/data/indexed_dataset.h"
#include "core/device/runtime.h"
#include "core/data/compact_vocab.h"
#include "core/data/tokenizer.h"
#include "core/io/checkpoint.h"
#include "core/io/metrics.h"
#include "core/io/tensorboard.h"
#include "core/ops/cpu/blas.h"
#include "core/ops/flash_attention.h"
#include "core/train/exit_status.h"
#include "core/optim/optimizer.h"
#include "core/optim/schedule.h"
#include "core/train/options.h"
#include "core/train/trainer.h"
#include "core/util/dir_lock.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/numbers.h"
#include "core/util/strings.h"
#include "core/util/threads.h"
#include "models/presets.h"
#include "models/registry.h"

namespace mb = megabatch;
using nlohmann::json;

namespace {

using mb::train::kExitDiverged;
using mb::train::kExitStoppedBySignal;

// The first option whose value differs between two resolved configurations, as text.
std::string first_difference(const json& a, const json& b) {
  for (const auto& [k, x] : a.items())
    if (!b.contains(k) || b[k] != x) return k + " is " + (b.contains(k) ? b[k].dump() : "unset") + " here, " + x.dump() + " on rank 0";
  for (const auto& [k, x] : b.items())
    if (!a.contains(k)) return k + " is " + x.dump() + " here, unset on rank 0";
  return "(no single option)";
}

// The model's configuration as stored in checkpoints.
json model_json(const mb::models::ModelConfig& c) {
  return {{"family", c.family}, {"post_layernorm", c.post_layernorm}, {"binary_head", c.binary_head},
          {"relative_attention", c.relative_attention},
          {"decoder_num_layers", c.decoder_layers()}, {"decoder_seq_length", c.decoder_seq()},
          {"vocab_extra_ids", c.vocab_extra_ids}, {"num_layers", c.num_layers}, {"hidden_size", c.hidden_size},
          {"num_attention_heads", c.num_attention_heads}, {"ffn_hidden_size", c.ffn()},
          {"seq_length", c.seq_length}, {"max_position_embeddings", c.max_positions()},
          {"vocab_size", c.vocab_size}, {"padded_vocab_size", c.padded_vocab_size()},
          {"tensor_model_parallel_size", c.tensor_model_parallel_size}, {"normalization", c.normalization}};
}

const char* kUsage =
    "usage: train [--config FILE.json] [--model PRESET] [Megatron-LM options...]\n"
    "\n"
    "Trains one model with an optimizer plugin and writes RUN_DIR/config.json and RUN_DIR/metrics.h5.\n"
    "Options are Megatron-LM's (pretrain_gpt.py) with their meaning; a config file uses the same names\n"
    "in snake_case, and flags override it.\n"
    "\n"
    "examples:\n"
    "  train --model gpt-mini --micro-batch-size 8 --global-batch-size 32 --train-iters 300 \\\n"
    "        --lr 1e-3 --lr-warmup-iters 30 --lr-decay-style cosine --optimizer adamw --log-interval 10\n"
    "  train --model gpt-7.5b --tensor-model-parallel-size 8 --print-params\n"
    "  train --config run.json --optimizer sgd --optimizer-params momentum=0.95 --optimizer-params nesterov=true\n"
    "  train --list-optimizers\n";

// The command that makes the default Brown corpus into `dir`: the preprocess program beside
// this train (build/bin/preprocess from the source tree, PREFIX/bin/preprocess installed;
// relative to the working directory where it lies under it), with --output-dir unless the
// directory is data/, its default.
std::string preprocess_brown_command(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const fs::path bin = mb::program_dir();
  fs::path program = bin.empty() ? fs::path("preprocess") : bin / "preprocess";
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  const fs::path rel = ec ? fs::path() : program.lexically_relative(cwd);
  if (!rel.empty() && *rel.begin() != "..") program = rel;
  const fs::path out = dir.empty() ? fs::path(".") : dir;
  return program.string() + " brown" + (out.lexically_normal() == fs::path("data") ? "" : " --output-dir " + out.string());
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  std::ostringstream os;
  os << std::fixed << std::setprecision(u ? 1 : 0) << b << " " << units[u];
  return os.str();
}

mb::models::ModelConfig model_config(const mb::config::Resolved& r) {
  const json& v = r.values;
  mb::models::ModelConfig c;
  if (v.contains("model")) {
    c = mb::models::preset(v["model"].get<std::string>());
  } else {
    if (v.contains("model_type")) c.family = v["model_type"].get<std::string>();
    mb::check(c.family == "gpt" || c.family == "bert" || c.family == "t5", "model_type: '", c.family,
              "' is not a model type (gpt, bert, t5)");
    const bool t5 = c.family == "t5";
    for (const char* k : {"num_layers", "hidden_size", "num_attention_heads", "seq_length"}) {
      const bool has = v.contains(k) || (t5 && std::string(k) == "num_layers" && v.contains("encoder_num_layers")) ||
                       (t5 && std::string(k) == "seq_length" && v.contains("encoder_seq_length"));
      mb::check(has, "no model given: use --model PRESET (see --list-models) or give --num-layers, "
                     "--hidden-size, --num-attention-heads and --seq-length (missing --", std::string(k), ")");
    }
    c.preset.clear();
    if (c.family == "bert") c.vocab_size = 30522;
    if (t5) {
      c.vocab_extra_ids = 100;
      c.vocab_size = 30522 + 100;
    }
  }
  mb::check(!v.contains("model_type") || !v.contains("model") || v["model_type"].get<std::string>() == c.family,
            "model_type '", v.contains("model_type") ? v["model_type"].get<std::string>() : "",
            "' contradicts --model ", v.contains("model") ? v["model"].get<std::string>() : "", " (a ", c.family,
            "); drop one");
  c.post_layernorm = v["post_layernorm"].get<bool>();
  const std::string pos = v["position_embedding_type"].get<std::string>();
  mb::check(pos == "learned_absolute" || pos == "relative", "position_embedding_type: '", pos,
            "' is not one of learned_absolute, relative");
  mb::check(pos != "relative" || c.family == "t5", "position_embedding_type relative is T5's; this model is ", c.family);
  c.relative_attention = pos == "relative";
  c.relative_attention_num_buckets = v["relative_attention_num_buckets"].get<int64_t>();
  c.relative_attention_max_distance = v["relative_attention_max_distance"].get<int64_t>();
  mb::check(c.relative_attention_num_buckets >= 4 && c.relative_attention_max_distance >= c.relative_attention_num_buckets / 2,
            "relative_attention_num_buckets must be >= 4 and relative_attention_max_distance >= half of it");
  c.binary_head = !v["bert_no_binary_head"].get<bool>();
  auto set = [&](const char* key, int64_t& field) {
    if (v.contains(key)) field = v[key].get<int64_t>();
  };
  set("num_layers", c.num_layers);
  set("hidden_size", c.hidden_size);
  set("num_attention_heads", c.num_attention_heads);
  set("ffn_hidden_size", c.ffn_hidden_size);
  set("seq_length", c.seq_length);
  set("max_position_embeddings", c.max_position_embeddings);
  set("make_vocab_size_divisible_by", c.make_vocab_size_divisible_by);
  set("tensor_model_parallel_size", c.tensor_model_parallel_size);
  set("encoder_num_layers", c.num_layers);
  set("encoder_seq_length", c.seq_length);
  set("decoder_num_layers", c.decoder_num_layers);
  set("decoder_seq_length", c.decoder_seq_length);
  set("vocab_extra_ids", c.vocab_extra_ids);
  const bool t5_lengths = v.contains("seq_length") || v.contains("encoder_seq_length") || v.contains("decoder_seq_length");
  if (c.family == "t5" && t5_lengths && !v.contains("max_position_embeddings"))
    c.max_position_embeddings = std::max(c.seq_length, c.decoder_seq());
  if (v.contains("seq_length") && !v.contains("max_position_embeddings") && c.max_position_embeddings < c.seq_length)
    c.max_position_embeddings = c.seq_length;
  c.hidden_dropout = v["hidden_dropout"].get<double>();
  c.attention_dropout = v["attention_dropout"].get<double>();
  c.init_method_std = v["init_method_std"].get<double>();
  c.normalization = v["normalization"].get<std::string>();
  return c;
}

void print_params(const mb::models::ModelConfig& c) {
  const auto r = mb::models::size_report(c);
  const std::string layers = c.family == "t5" ? std::to_string(c.num_layers) + " + " + std::to_string(c.decoder_layers())
                                               : std::to_string(c.num_layers);
  std::cout << "model: " << (c.preset.empty() ? "custom" : c.preset) << " (" << layers << " layers, hidden "
            << c.hidden_size << ", " << c.num_attention_heads << " heads, ffn " << c.ffn() << ", seq "
            << c.seq_length << ", vocab " << c.vocab_size << " padded to " << c.padded_vocab_size() << ")\n"
            << "parameters:                 " << r.parameters << " (" << std::setprecision(4)
            << static_cast<double>(r.parameters) / 1e9 << " B)\n"
            << "tensor-parallel size:       " << c.tensor_model_parallel_size << "\n"
            << "parameters per rank:        " << r.parameters_per_rank << "\n"
            << "fp32 + Adam state per rank: " << human_bytes(r.fp32_adam_bytes) << " (16 B/param: weights, grads, 2 moments)\n"
            << "bf16 mixed precision + Adam per rank: " << human_bytes(r.mixed_adam_bytes)
            << " (18 B/param: bf16 weights, fp32 grads, master, 2 moments)\n"
            << "activations per sample per rank: " << human_bytes(r.activation_bytes)
            << " (16-bit, no recomputation; x micro-batch size)\n";
}

// Memory the run will need on its device, estimated before anything is allocated:
// parameters (in the run's dtype), fp32 gradients, fp32 master weights (bf16/fp16), two fp32
// optimizer states (Adam, LAMB: the most the shipped plugins keep), and activations for one
// micro-batch (Korthikanti et al.'s count, doubled in fp32). With the distributed optimizer
// over D ranks (`shards` D > 1) a rank keeps 1/D of the masters and of the state, and its
// 1/D of the reduced gradients beside the whole gradient buffer. More than is available
// stops the run at once, with the figures, instead of the kernel killing it later.
// Whether the model's self-attention runs the flash kernels (models/transformer.cc), which
// keep no (T, T) probabilities: T5's position bias takes the explicit attention.
bool flash_attention(const mb::models::ModelConfig& mc, mb::DType dtype, mb::Device device) {
  return device.is_cuda() && !mc.relative_attention &&
         mb::ops::flash_attention_supported(device, dtype, mc.hidden_size / mc.num_attention_heads);
}

void check_memory(const mb::models::ModelConfig& mc, mb::DType dtype, mb::Device device, int64_t micro_batch,
                  int64_t shards, bool noise_scale, bool skip, bool logger) {
  const auto r = mb::models::size_report(mc);
  const bool flash = flash_attention(mc, dtype, device);
  const double p = static_cast<double>(r.parameters_per_rank), d = static_cast<double>(std::max<int64_t>(shards, 1));
  const bool fp32 = dtype == mb::DType::kF32;
  const double params = p * static_cast<double>(mb::dtype_size(dtype)), grads = 4 * p + (d > 1 ? 4 * p / d : 0.0),
               masters = fp32 ? 0.0 : 4 * p / d, state = 8 * p / d,
               acts = (r.activation_bytes - (flash ? r.attention_score_bytes : 0.0)) *
                      static_cast<double>(micro_batch) * (fp32 ? 2.0 : 1.0);
  const double noise = noise_scale ? 4 * p : 0.0;  // --log-noise-scale: the gradients before a micro-batch
  const double need = params + grads + masters + state + noise + acts;
  const std::string sharded = d > 1 ? " (this rank's 1/" + std::to_string(shards) + ")" : std::string();
  double ranks_here = 1;  // ranks of this job on this host share its memory
  if (const char* l = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); l && device.is_cpu()) ranks_here = std::max(1.0, mb::parse_finite(l).value_or(1.0));
  const auto avail = mb::runtime::available_memory(device);
  const double have = static_cast<double>(avail.bytes) / ranks_here;
  const std::string parts = "parameters " + human_bytes(params) + ", gradients " + human_bytes(grads) +
                            (masters > 0 ? ", master weights " + human_bytes(masters) + sharded : std::string()) +
                            ", optimizer state " + human_bytes(state) + sharded +
                            (noise > 0 ? ", noise-scale buffer " + human_bytes(noise) : std::string()) +
                            ", activations " + human_bytes(acts) + " for micro batch " + std::to_string(micro_batch) +
                            (flash ? ", flash attention" : "");
  if (logger)
    std::cout << "> memory: about " << human_bytes(need) << " per rank on " << device.str() << " (" << parts << "); "
              << human_bytes(have) << " available" << (ranks_here > 1 ? " per rank" : "") << std::endl;
  if (need > have && !skip)
    mb::fail("this run needs about ", human_bytes(need), " on ", device.str(), " (", parts, ") but ", human_bytes(have),
             " is available (", avail.source, ranks_here > 1 ? ", shared by this host's ranks" : "",
             "); use a smaller model or micro batch, more tensor parallelism, ", dtype == mb::DType::kF32 ? "--bf16, " : "",
             "or --skip-memory-check if the estimate is wrong for your optimizer");
}

// The checkpoint --load names: the file itself, or the newest in a directory (nullopt when it
// has none). A damaged one (checkpoint_damage: a tensor failing its checksum, ...) is refused
// naming the file and the tensor, offering the newest intact checkpoint in the directory,
// which `fallback` (--load-fallback) takes instead.
std::optional<std::filesystem::path> intact_checkpoint(const std::filesystem::path& load, bool fallback) {
  const bool file = std::filesystem::is_regular_file(load);
  std::optional<std::filesystem::path> chosen = file ? std::optional(load) : mb::io::latest_checkpoint(load);
  if (!chosen) return chosen;
  const auto damage = mb::io::checkpoint_damage(*chosen);
  if (!damage) return chosen;
  if (file) mb::fail(*damage, "; give --load another checkpoint, or its directory to resume from the newest there");
  const auto intact = mb::io::newest_intact_checkpoint(
      load, mb::io::checkpoint_iteration(*chosen).value_or(std::numeric_limits<int64_t>::max()));
  mb::check(intact.has_value(), *damage, "; ", load.string(), " holds no intact checkpoint before it: move the damaged file ",
            "away to start from scratch");
  const std::string which = intact->string() + " (iteration " +
                            std::to_string(mb::io::checkpoint_iteration(*intact).value_or(-1)) + ")";
  mb::check(fallback, *damage, "; the newest intact checkpoint in ", load.string(), " is ", which,
            ": resume from it with --load-fallback (or --load ", intact->string(), ")");
  std::cout << "> warning: " << *damage << "; resuming from the newest intact checkpoint, " << which
            << " (--load-fallback)" << std::endl;
  return intact;
}

std::array<size_t, 3> split_documents(const std::string& spec, size_t docs) {
  std::vector<double> w;
  std::string s = spec;
  for (char& ch : s)
    if (ch == '/') ch = ',';
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    std::string why;
    const auto x = mb::parse_finite(mb::trim(part), &why);
    if (!x) mb::fail("split: '", spec, "': '", part, "' is not a proportion (", why, "); give numbers like 969,30,1");
    w.push_back(*x);
  }
  mb::check(!w.empty() && w.size() <= 3, "split: '", spec, "': give 1 to 3 proportions (train, validation, test)");
  while (w.size() < 3) w.push_back(0);
  double sum = 0;
  for (double x : w) {
    mb::check(x >= 0, "split: '", spec, "': proportions must be >= 0");
    sum += x;
  }
  mb::check(sum > 0, "split: '", spec, "': proportions sum to 0");
  // Megatron's get_train_valid_test_split_: cumulative rounded boundaries, shifted so the
  // last one is the document count.
  std::array<size_t, 4> idx{0, 0, 0, 0};
  long long acc = 0;
  for (int i = 0; i < 3; ++i) {
    acc += std::llround(w[i] / sum * static_cast<double>(docs));
    idx[i + 1] = static_cast<size_t>(acc);
  }
  const long long diff = static_cast<long long>(idx[3]) - static_cast<long long>(docs);
  for (int i = 1; i < 4; ++i) idx[i] = static_cast<size_t>(static_cast<long long>(idx[i]) - diff);
  return {idx[1], idx[2], idx[3]};
}

// The dtype of --bf16 / --fp16 (f32 otherwise) and the fp16 loss scaler of Megatron's flags.
mb::DType run_dtype(const json& v) {
  const bool bf16 = v["bf16"].get<bool>(), fp16 = v["fp16"].get<bool>();
  mb::check(!(bf16 && fp16), "--bf16 and --fp16 are mutually exclusive; pick one (bf16 needs no loss scaling)");
  return bf16 ? mb::DType::kBF16 : fp16 ? mb::DType::kF16 : mb::DType::kF32;
}

mb::ops::LossScalerConfig loss_scaler(const mb::config::Resolved& r, mb::DType dtype) {
  const json& v = r.values;
  for (const char* k : {"loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis"})
    mb::check(!r.given(k) || dtype == mb::DType::kF16, "--", mb::config::flag_name(k),
              " is for --fp16 runs (loss scaling); ", dtype == mb::DType::kBF16 ? "bf16 needs none" : "add --fp16",
              " or drop it");
  mb::ops::LossScalerConfig c;
  c.dynamic = !v.contains("loss_scale");
  c.initial_scale = static_cast<float>(c.dynamic ? v["initial_loss_scale"].get<double>() : v["loss_scale"].get<double>());
  c.min_scale = static_cast<float>(v["min_loss_scale"].get<double>());
  c.window = static_cast<int32_t>(v["loss_scale_window"].get<int64_t>());
  c.hysteresis = static_cast<int32_t>(v["hysteresis"].get<int64_t>());
  mb::check(std::isfinite(c.initial_scale) && c.initial_scale > 0, c.dynamic ? "--initial-loss-scale" : "--loss-scale",
            " must be a positive finite number");
  mb::check(c.min_scale > 0 && c.min_scale <= c.initial_scale, "--min-loss-scale must be in (0, initial loss scale]");
  mb::check(c.window >= 1 && c.hysteresis >= 1, "--loss-scale-window and --hysteresis must be >= 1");
  return c;
}

// The run's batch, iterations, learning-rate schedule, logging, evaluation, checkpoint,
// loss-scaling and divergence options from its flags (errors name the flag); dp_size: the
// data-parallel ranks launched.
mb::train::TrainOptions train_options(const mb::config::Resolved& r, const mb::models::ModelConfig& mc, mb::DType dtype,
                                      int64_t dp_size) {
  const json& v = r.values;
  mb::train::TrainOptions opt;
  opt.micro_batch_size = v["micro_batch_size"].get<int64_t>();
  opt.global_batch_size =
      v.contains("global_batch_size") ? v["global_batch_size"].get<int64_t>() : opt.micro_batch_size * dp_size;
  mb::check(opt.micro_batch_size >= 1 && opt.global_batch_size >= 1, "micro_batch_size and global_batch_size must be >= 1");
  mb::check(opt.global_batch_size % opt.micro_batch_size == 0, "global_batch_size (", opt.global_batch_size,
            ") must be a multiple of micro_batch_size (", opt.micro_batch_size, ")");
  mb::check(opt.global_batch_size % (opt.micro_batch_size * dp_size) == 0, "global_batch_size (", opt.global_batch_size,
            ") must be a multiple of micro_batch_size x data-parallel size (", opt.micro_batch_size, " x ", dp_size, ")");
  const bool by_iters = v.contains("train_iters"), by_samples = v.contains("train_samples");
  mb::check(by_iters != by_samples, "give exactly one of --train-iters and --train-samples");
  const int64_t gbs = opt.global_batch_size;
  opt.train_iters = by_iters ? v["train_iters"].get<int64_t>() : v["train_samples"].get<int64_t>() / gbs;
  mb::check(opt.train_iters >= 1, "the run has no iterations (train_iters ", opt.train_iters, ")");
  mb::check(v.contains("lr"), "--lr is required");
  const auto rule = mb::optim::parse_lr_scaling(v["lr_scaling"].get<std::string>());
  const int64_t ref = v.contains("lr_scaling_ref_batch") ? v["lr_scaling_ref_batch"].get<int64_t>() : 0;
  auto& s = opt.schedule;
  s.max_lr = mb::optim::scaled_lr(v["lr"].get<double>(), rule, gbs, ref);
  s.min_lr = mb::optim::scaled_lr(v["min_lr"].get<double>(), rule, gbs, ref);
  s.style = mb::optim::parse_decay_style(v["lr_decay_style"].get<std::string>());
  s.power = v["lr_decay_power"].get<double>();
  if (by_iters) {
    s.decay_samples = (v.contains("lr_decay_iters") ? v["lr_decay_iters"].get<int64_t>() : opt.train_iters) * gbs;
    s.warmup_samples = v["lr_warmup_iters"].get<int64_t>() * gbs;
  } else {
    s.decay_samples = v.contains("lr_decay_samples") ? v["lr_decay_samples"].get<int64_t>() : v["train_samples"].get<int64_t>();
    s.warmup_samples = v["lr_warmup_samples"].get<int64_t>();
  }
  if (v.contains("lr_warmup_fraction"))
    s.warmup_samples = static_cast<int64_t>(v["lr_warmup_fraction"].get<double>() * static_cast<double>(s.decay_samples));
  mb::check(s.warmup_samples <= s.decay_samples || s.style == mb::optim::DecayStyle::kConstant ||
                s.style == mb::optim::DecayStyle::kInverseSquareRoot,
            "lr warmup (", s.warmup_samples, " samples) is longer than the decay span (", s.decay_samples, " samples)");
  opt.clip_grad = v["clip_grad"].get<double>();
  opt.log_interval = std::max<int64_t>(1, v["log_interval"].get<int64_t>());
  opt.eval_interval = v["eval_interval"].get<int64_t>();
  opt.eval_iters = v["eval_iters"].get<int64_t>();
  if (v.contains("eval_samples")) {
    opt.eval_samples = v["eval_samples"].get<int64_t>();
    mb::check(opt.eval_samples % opt.micro_batch_size == 0, "--eval-samples (", opt.eval_samples,
              ") must be a multiple of --micro-batch-size (", opt.micro_batch_size, ")");
  }
  opt.diagnostics_interval =
      v.contains("diagnostics_interval") ? v["diagnostics_interval"].get<int64_t>() : opt.log_interval;
  mb::check(opt.diagnostics_interval >= 0, "--diagnostics-interval must be >= 0 (0: off), got ",
            opt.diagnostics_interval);
  opt.noise_scale = v["log_noise_scale"].get<bool>();
  for (const char* key : {"noise_scale_ema", "noise_scale_window"})
    mb::check(opt.noise_scale || !r.given(key), "--", mb::config::flag_name(key),
              " averages the gradient noise scale, which only --log-noise-scale estimates; add it or drop the option");
  mb::check(!r.given("noise_scale_ema") || !r.given("noise_scale_window"),
            "--noise-scale-ema (a decay a step) and --noise-scale-window (a window in samples) are both set; give one");
  opt.noise_scale_ema = v["noise_scale_ema"].get<double>();
  if (v.contains("noise_scale_window")) opt.noise_scale_window = static_cast<double>(v["noise_scale_window"].get<int64_t>());
  if (v.contains("save")) opt.save_dir = v["save"].get<std::string>();
  opt.save_interval = v["save_interval"].get<int64_t>();
  opt.exit_interval = v["exit_interval"].get<int64_t>();
  opt.profile_steps = v["profile_steps"].get<int64_t>();
  opt.keep_checkpoints = static_cast<int>(v["keep_checkpoints"].get<int64_t>());
  mb::check(opt.save_interval >= 0 && opt.exit_interval >= 0 && opt.keep_checkpoints >= 0,
            "--save-interval, --exit-interval and --keep-checkpoints must be >= 0");
  opt.seed = static_cast<uint64_t>(v["seed"].get<int64_t>());
  opt.loss_scaler = loss_scaler(r, dtype);
  opt.tokens_per_sample = mc.seq_length + (mc.family == "t5" ? mc.decoder_seq() : 0);  // encoder + decoder tokens
  opt.log_throughput = v["log_throughput"].get<bool>();
  opt.flops_per_iteration = mb::models::megatron_flops(mc, opt.global_batch_size);
  opt.log_params_norm = v["log_params_norm"].get<bool>();
  opt.log_num_zeros_in_grad = v["log_num_zeros_in_grad"].get<bool>();
  opt.divergence_loss = v.contains("divergence_loss") ? v["divergence_loss"].get<double>()
                                                      : 2.0 * std::log(static_cast<double>(mc.padded_vocab_size()));
  opt.divergence_intervals = v["divergence_intervals"].get<int64_t>();
  return opt;
}

// The run's device, said at start-up, and the refusals that depend on it.
mb::Device run_device(const json& v, mb::DType dtype, int local_rank) {
  const mb::Device d = mb::select_device(v.contains("device") ? v["device"].get<std::string>() : "", local_rank);
  if (d.is_cuda()) {
    const mb::runtime::GpuInfo g = mb::runtime::gpu_info(d.index);
    mb::check(dtype != mb::DType::kBF16 || g.has_bf16(), "--bf16: ", d.str(), " (", g.name, ", sm_", g.major, g.minor,
              ") has no bf16 arithmetic (it needs sm_80 or later, A100 / H100); use --fp16 on this GPU");
    mb::runtime::use_device(d);
    std::cout << "> device: " << d.str() << " (" << g.name << ", sm_" << g.major << g.minor << ", "
              << (g.total_memory >> 30) << " GiB), " << mb::dtype_name(dtype) << std::endl;
  } else {
    std::cout << "> device: cpu"
              << (v.contains("device") ? ""
                  : mb::runtime::built_with_cuda() ? " (no GPU visible)"
                                                  : " (this build has no CUDA)")
              << ", " << mb::dtype_name(dtype) << (dtype == mb::DType::kF32 ? "" : " emulated (stored rounded, computed in f32)")
              << "; " << mb::ops::cpu::cpu_and_blas() << std::endl;
  }
  return d;
}

// --list-optimizers: every plugin on the search path with its hyperparameters; a plugin
// that does not load is listed as broken, with why, and the others are still listed.
void list_optimizers(const std::vector<std::filesystem::path>& search) {
  int broken = 0;
  for (const auto& [name, path] : mb::optim::available_plugins(search)) {
    try {
      std::cout << mb::optim::describe_hparams(mb::optim::load_plugin(name, search)) << "  file: " << path.string()
                << "\n";
    } catch (const std::exception& e) {
      ++broken;
      std::cout << name << "  BROKEN: " << e.what() << "\n  file: " << path.string() << "\n";
    }
  }
  if (broken) std::cout << broken << " plugin file(s) could not be loaded (see BROKEN above)\n";
}

// The tokenizer the flags name (--tokenizer-type, --vocab-file, --merge-file), with T5's
// sentinel tokens.
mb::data::TokenizerOptions tokenizer_options(const json& v, const mb::models::ModelConfig& mc) {
  mb::data::TokenizerOptions to;
  to.type = v["tokenizer_type"].get<std::string>();
  if (v.contains("vocab_file")) to.vocab_file = v["vocab_file"].get<std::string>();
  if (v.contains("merge_file")) to.merge_file = v["merge_file"].get<std::string>();
  to.extra_ids = static_cast<int>(mc.vocab_extra_ids);
  return to;
}

// The optimizer's hyperparameters as given: Megatron's flags that name one (--weight-decay,
// --adam-beta1, ...; refused when the plugin has no such hyperparameter), then
// --optimizer-params, which wins.
json optimizer_params(const mb::config::Resolved& r, const mb::optim::Plugin& plugin) {
  const json& v = r.values;
  json hp = json::object();
  const std::pair<const char*, const char*> aliases[] = {{"weight_decay", "weight_decay"}, {"adam_beta1", "beta1"},
                                                         {"adam_beta2", "beta2"}, {"adam_eps", "eps"},
                                                         {"sgd_momentum", "momentum"}};
  for (const auto& [flag, name] : aliases) {
    if (!r.given(flag)) continue;
    mb::check(mb::optim::hparam_index(plugin, name) >= 0, flag, " was given but optimizer plugin '", plugin.name(),
              "' has no hyperparameter '", name, "'; drop it or pick an optimizer that has one");
    hp[name] = v[flag];
  }
  for (const auto& [k, x] : v["optimizer_params"].items()) hp[k] = x;
  return hp;
}

// Every rank must run the same configuration: each compares its resolved configuration
// with rank 0's, and all stop together when one differs (the one that differs says how).
void check_ranks_agree(const mb::comm::ParallelState& parallel, const json& resolved) {
  if (parallel.world_size <= 1) return;
  auto& world = static_cast<mb::comm::MpiCommunicator&>(*parallel.world);
  const std::string mine = resolved.dump(), first = world.broadcast_string(mine, 0);
  double differs = mine == first ? 0.0 : 1.0;
  if (differs != 0.0)  // said before any rank stops the job, so the message is not lost in the abort
    std::cerr << "train (rank " << parallel.world_rank << "): error: rank " << parallel.world_rank
              << " was started with a configuration that differs from rank 0's: "
              << first_difference(json::parse(first), resolved) << "; start every rank with the same options"
              << std::endl;
  world.all_reduce(&differs, 1, mb::comm::ReduceOp::kMax);
  mb::check(differs == 0.0, mine == first ? "another rank was started with a different configuration (see its error)"
                                          : "this rank's configuration differs from rank 0's (see above)");
}

int run(int argc, char** argv) {
  const auto& schema = mb::train::train_schema();
  mb::config::Resolved r = mb::config::resolve(schema, argc, argv);
  if (r.help || argc == 1) {
    std::cout << kUsage << schema.help();
    return 0;
  }
  json& v = r.values;
  if (v["print_config"].get<bool>()) {  // before any check of this machine: a launcher asks on a head node
    json shown = v;
    shown.erase("print_config");
    std::cout << shown.dump(2) << std::endl;
    return 0;
  }
  const int64_t threads = v["threads"].get<int64_t>();
  mb::check_thread_count(threads, "--threads");
  if (threads > 0) omp_set_num_threads(static_cast<int>(threads));
  std::vector<std::string> extra_dirs = v["plugin_path"].get<std::vector<std::string>>();
  const auto search = mb::optim::plugin_search_path(extra_dirs);

  if (v["list_models"].get<bool>()) {
    for (const auto& p : mb::models::presets()) std::cout << std::left << std::setw(12) << p.name << p.description << "\n";
    return 0;
  }
  if (v["list_optimizers"].get<bool>()) {
    list_optimizers(search);
    return 0;
  }

  mb::models::ModelConfig mc = model_config(r);
  const mb::DType dtype = run_dtype(v);
  const bool is_bert = mc.family == "bert", is_t5 = mc.family == "t5";
  // Family defaults (Megatron's pretrain_gpt.py / pretrain_bert.py / pretrain_t5.py): tokenizer and dataset.
  if (!v.contains("tokenizer_type"))
    v["tokenizer_type"] = is_bert || is_t5 ? "BertWordPieceLowerCase" : "GPT2BPETokenizer";
  if (!v.contains("data_path"))
    v["data_path"] =
        json::array({is_bert || is_t5 ? "data/brown_bert_text_sentence" : "data/brown_gpt2_text_document"});
  if (v["print_params"].get<bool>()) {
    if (v.contains("vocab_file")) {
      mc.vocab_size = mb::data::make_tokenizer(tokenizer_options(v, mc))->vocab_size();
    } else if (v["tokenizer_type"].get<std::string>() != "GPT2BPETokenizer") {
      mc.vocab_size = 30522 + mc.vocab_extra_ids;  // BERT's WordPiece vocabulary (+ T5 sentinels)
    }
    const auto data = v["data_path"].get<std::vector<std::string>>();
    if (data.size() == 1 && std::filesystem::exists(mb::data::compact_vocab_path(data[0])))
      mc.vocab_size = static_cast<int64_t>(
          mb::data::read_compact_vocab(mb::data::compact_vocab_path(data[0])).ids.size());  // the corpus's own
    print_params(mc);
    return 0;
  }

  // --- data and tokenizer
  const auto paths = v["data_path"].get<std::vector<std::string>>();
  mb::check(paths.size() == 1, "data_path: give one dataset prefix (weighted blends are not supported yet), got ",
            paths.size(), " values");
  // A compact dataset (PREFIX.vocab.json beside it) brings its own vocabulary: the corpus's tokens.
  const auto tokenizer = mb::data::tokenizer_for_dataset(mb::data::make_tokenizer(tokenizer_options(v, mc)), paths[0]);
  const bool compact_vocab = std::filesystem::exists(mb::data::compact_vocab_path(paths[0]));
  mc.vocab_size = tokenizer->vocab_size();
  mc.validate();
  if (!std::filesystem::exists(paths[0] + ".idx") && !std::filesystem::exists(paths[0] + ".bin") &&
      std::filesystem::path(paths[0]).filename().string().rfind("brown_", 0) == 0)
    mb::fail("data_path: ", paths[0], ".bin/.idx are missing; the default Brown corpus is made by `",
             preprocess_brown_command(std::filesystem::path(paths[0]).parent_path()), "`, run it first");
  auto ds = std::make_shared<const mb::data::IndexedDataset>(paths[0]);
  const auto cut = split_documents(v["split"].get<std::string>(), ds->num_documents());
  const mb::data::DocumentRange train_docs{0, cut[0]}, valid_docs{cut[0], cut[1]}, test_docs{cut[1], cut[2]};
  mb::check(train_docs.end > train_docs.begin, "split '", v["split"].get<std::string>(), "' leaves no training documents in ",
            paths[0], " (", ds->num_documents(), " documents)");

  // --- processes: tensor-parallel groups of contiguous ranks, data parallelism across them
  auto parallel = mb::comm::ParallelState::create(static_cast<int>(mc.tensor_model_parallel_size));
  const int64_t dp_size = parallel.dp->size();
  if (v.contains("data_parallel_size")) {  // what the job was meant to be, against what was launched
    const int64_t want = v["data_parallel_size"].get<int64_t>();
    mb::check(want == dp_size, "data_parallel_size ", want, ": this job has ", parallel.world_size,
              " rank(s) at tensor_model_parallel_size ", mc.tensor_model_parallel_size, ", so DP is ", dp_size,
              "; launch TP x DP = ", mc.tensor_model_parallel_size * want, " ranks (mpirun -np N, srun -n N)");
  }
  const bool logger = parallel.world_rank == 0;  // one rank writes the console, config.json and metrics.h5
  if (!logger) std::cout.rdbuf(nullptr);
  mb::train::TrainOptions opt = train_options(r, mc, dtype, dp_size);
  const uint64_t seed = opt.seed;
  const int64_t gbs = opt.global_batch_size;
  const auto& s = opt.schedule;

  // --- optimizer plugin and its hyperparameters
  const auto plugin = mb::optim::load_plugin(v["optimizer"].get<std::string>(), search);
  const auto hparams = mb::optim::resolve_hparams(plugin, optimizer_params(r, plugin), "optimizer_params");

  // --- model, run directory, metrics
  const mb::Device device = run_device(v, dtype, parallel.local_rank);
  parallel.connect(device, v["distributed_backend"].get<std::string>());
  if (parallel.collectives != "local") std::cout << "> collectives: " << parallel.collectives << std::endl;
  mb::comm::Communicator& tp = *parallel.tp;
  check_memory(mc, dtype, device, v["micro_batch_size"].get<int64_t>(),
               v["use_distributed_optimizer"].get<bool>() ? dp_size : 1, v["log_noise_scale"].get<bool>(),
               v["skip_memory_check"].get<bool>(), logger);
  if (v["check"].get<bool>()) {
    std::cout << "> check: configuration, optimizer " << plugin.name() << ", data " << paths[0] << " and memory are fine"
              << std::endl;
    return 0;
  }
  auto model = mb::models::make_model(mc, tp, seed, dtype, device);
  // Samples of the model's family; validation draws from its own documents with seed + 1.
  uint64_t samples_per_epoch = 0;
  auto make_source = [&](mb::data::DocumentRange docs, uint64_t sample_seed) -> std::unique_ptr<mb::train::BatchSource> {
    if (is_t5) {
      auto src = std::make_unique<mb::models::T5BatchSource>(ds, docs, static_cast<int>(mc.seq_length),
                                                             static_cast<int>(mc.decoder_seq()), tokenizer->special(),
                                                             tokenizer->vocab_size(), sample_seed);
      if (!samples_per_epoch) samples_per_epoch = src->samples_per_epoch();
      return src;
    }
    if (is_bert) {
      auto src = std::make_unique<mb::models::BertBatchSource>(ds, docs, static_cast<int>(mc.seq_length),
                                                               tokenizer->special(), tokenizer->vocab_size(), sample_seed,
                                                               mc.binary_head);
      if (!samples_per_epoch) samples_per_epoch = src->samples_per_epoch();
      return src;
    }
    auto src = std::make_unique<mb::models::GptBatchSource>(ds, docs, static_cast<int>(mc.seq_length), sample_seed,
                                                            mc.padded_vocab_size());
    if (!samples_per_epoch) samples_per_epoch = src->samples_per_epoch();
    return src;
  };
  auto train_src = make_source(train_docs, seed);
  std::unique_ptr<mb::train::BatchSource> valid_src;
  // --eval-samples: the held-out order does not depend on --seed, so every point of a sweep
  // is measured on the same samples
  const bool evaluating = opt.eval_iters > 0 || opt.eval_samples > 0;
  const uint64_t eval_seed = opt.eval_samples > 0 ? 1234 : seed;
  if (valid_docs.end > valid_docs.begin && evaluating) valid_src = make_source(valid_docs, eval_seed + 1);
  if (valid_src && valid_src->samples_per_epoch() == 0) valid_src.reset();  // documents too short for one sample
  std::unique_ptr<mb::train::BatchSource> test_src;  // the test split, evaluated once at the end
  if (test_docs.end > test_docs.begin && evaluating) test_src = make_source(test_docs, eval_seed + 2);
  if (test_src && test_src->samples_per_epoch() == 0) test_src.reset();
  std::string no_validation;  // evaluation asked for, nothing to evaluate on: said below, once the log is open
  if (evaluating && !valid_src) {
    const std::string why = "the validation split of --split '" + v["split"].get<std::string>() + "' holds " +
                            (valid_docs.end > valid_docs.begin ? "no sample of " + std::to_string(mc.seq_length) +
                                                                     " tokens (its " +
                                                                     std::to_string(valid_docs.end - valid_docs.begin) +
                                                                     " documents are too short)"
                                                               : std::string("no document")) +
                            " of " + paths[0] + "'s " + std::to_string(ds->num_documents());
    // asked for by name: an error; the default --eval-iters: training goes on, with a warning
    const char* asked = r.given("eval_samples") ? "eval_samples" : r.given("eval_iters") ? "eval_iters" : nullptr;
    if (asked)
      mb::fail("--", mb::config::flag_name(asked), " asks for validation, but ", why,
               "; give the validation split a share (e.g. --split 969,30,1), or drop --", mb::config::flag_name(asked));
    no_validation = "no validation loss will be logged: " + why + " (--eval-iters 0 says there is none to take)";
  }

  json resolved = v;
  const json hp_resolved = mb::optim::hparams_json(plugin, hparams);
  resolved["optimizer_params"] = hp_resolved;
  resolved["padded_vocab_size"] = mc.padded_vocab_size();
  resolved["num_parameters"] = model->parameters().num_full_parameters();
  resolved["train_iters"] = opt.train_iters;
  resolved["diagnostics_interval"] = opt.diagnostics_interval;
  resolved["global_batch_size"] = gbs;
  resolved["effective_lr"] = s.max_lr;
  resolved["effective_min_lr"] = s.min_lr;
  resolved["optimizer_version"] = plugin.entry->version ? plugin.entry->version : "";
  const std::filesystem::path run_dir = v["run_dir"].get<std::string>();
  resolved["data_parallel_size"] = dp_size;
  resolved["world_size"] = parallel.world_size;
  resolved["device"] = device.str();
  resolved["params_dtype"] = mb::dtype_name(dtype);
  check_ranks_agree(parallel, resolved);
  // One run per directory: a second train given the same --run-dir or --save while this one
  // runs is refused, naming this one (held until the end of run(), however it ends).
  std::optional<mb::DirLock> run_lock, save_lock;
  if (logger) {
    run_lock.emplace(run_dir, "train",
                     "two runs writing one directory would mix their logs and metrics; wait for it to end, or give "
                     "this run another --run-dir");
    std::error_code ec;
    if (!opt.save_dir.empty() && !std::filesystem::equivalent(opt.save_dir, run_dir, ec))
      save_lock.emplace(opt.save_dir, "train",
                        "two runs saving into one directory would overwrite each other's checkpoints and resume "
                        "from the other's; wait for it to end, or give this run another --save");
  }
  if (logger) std::filesystem::remove(run_dir / "DIVERGED");  // this attempt decides afresh
  if (logger) mb::write_file_atomic(run_dir / "config.json", resolved.dump(2) + "\n");
  if (logger && !opt.save_dir.empty()) mb::io::remove_unfinished_checkpoints(opt.save_dir);
  // --- checkpoint to continue from (read before metrics.h5, which a resumed run continues)
  std::optional<std::filesystem::path> resume_from;
  mb::io::CheckpointState resume_state;
  const bool finetune = v["finetune"].get<bool>(), no_load_optim = v["no_load_optim"].get<bool>();
  if (v.contains("load")) {
    resume_from = intact_checkpoint(v["load"].get<std::string>(), v["load_fallback"].get<bool>());
    if (resume_from) {
      resume_state = mb::io::read_checkpoint_state(*resume_from);
      mb::check(finetune || resume_state.seed == seed, resume_from->string(), ": written with --seed ",
                resume_state.seed, " but this run has --seed ", seed,
                "; resume with the same seed (data order and dropout depend on it), or use --finetune");
      mb::check(finetune || resume_state.iteration <= opt.train_iters, resume_from->string(), ": the checkpoint is at iteration ",
                resume_state.iteration, ", past --train-iters ", opt.train_iters);
    } else {
      std::cout << "> no checkpoint in " << v["load"].get<std::string>() << "; starting from scratch\n";
    }
  }
  const bool resuming = resume_from && !finetune;
  std::unique_ptr<mb::io::TensorBoardWriter> tensorboard;  // declared first: metrics (its listener) goes first
  std::unique_ptr<mb::io::MetricsFile> metrics;
  if (logger) {
    metrics = resuming ? std::make_unique<mb::io::MetricsFile>(run_dir / "metrics.h5", resolved, resume_state.iteration)
                       : std::make_unique<mb::io::MetricsFile>(run_dir / "metrics.h5", resolved);
    if (v.contains("tensorboard_dir")) {
      tensorboard = std::make_unique<mb::io::TensorBoardWriter>(v["tensorboard_dir"].get<std::string>());
      metrics->on_flush([tb = tensorboard.get()](const std::map<std::string, std::vector<double>>& rows) {
        tb->series(rows);
        tb->flush();
      });
    }
  }

  if (!no_validation.empty()) std::cout << "> warning: " << no_validation << std::endl;
  std::cout << "> " << model->summary() << "\n"
            << "> optimizer: " << plugin.name() << " " << plugin.entry->version << " (" << plugin.path.string()
            << ") " << hp_resolved.dump() << "\n"
            << "> data: " << paths[0] << ": " << ds->num_documents() << " documents, " << ds->num_tokens()
            << " tokens; split " << train_docs.end << " / " << valid_docs.end - valid_docs.begin << " / "
            << ds->num_documents() - valid_docs.end << " documents; " << samples_per_epoch
            << " training samples per epoch"
            << (compact_vocab ? "; vocabulary: its own " + std::to_string(tokenizer->vocab_size()) + " " +
                                    std::string(tokenizer->type()) + " tokens (" +
                                    mb::data::compact_vocab_path(paths[0]).string() + ")"
                              : std::string())
            << "\n"
            << "> " << opt.train_iters << " iterations x global batch " << gbs << " (micro batch "
            << opt.micro_batch_size << ", " << gbs / (opt.micro_batch_size * dp_size) << " accumulation steps"
            << (parallel.world_size > 1 ? ", " + std::to_string(parallel.world_size) + " ranks: TP " +
                                              std::to_string(mc.tensor_model_parallel_size) + " x DP " + std::to_string(dp_size)
                                        : std::string())
            << "), lr "
            << s.max_lr << " " << mb::optim::decay_style_name(s.style) << " to " << s.min_lr << ", warmup "
            << s.warmup_samples << " samples; " << omp_get_max_threads() << " threads\n"
            << "> writing " << (run_dir / "metrics.h5").string() << "; diverged when the lm loss is NaN/inf or above "
            << opt.divergence_loss << " for " << opt.divergence_intervals << " log intervals" << std::endl;

  opt.overlap_grad_reduce = v["overlap_grad_reduce"].get<bool>();
  opt.ddp_bucket_size = v.contains("ddp_bucket_size") ? v["ddp_bucket_size"].get<int64_t>() : 0;
  // The distributed optimizer: this rank's shards of the gradient buckets (with one DP
  // rank there is nothing to shard and the optimizer steps everything as without it).
  std::unique_ptr<mb::optim::DpShards> shards;
  if (v["use_distributed_optimizer"].get<bool>() && dp_size > 1) {
    const auto& P = model->parameters();
    const size_t elems =
        mb::train::bucket_elems(opt.ddp_bucket_size, P.flat_size(), static_cast<int>(dp_size), opt.overlap_grad_reduce);
    shards = std::make_unique<mb::optim::DpShards>(model->parameters(), mb::train::bucket_ranges(P, elems), *parallel.dp);
    std::cout << "> distributed optimizer: this rank steps and keeps optimizer state"
              << (P.mixed() ? " and fp32 master weights" : "") << " for " << shards->piece_elements() << " of "
              << P.num_parameters() << " local parameters (DP " << dp_size << ", " << shards->buckets() << " bucket(s))"
              << std::endl;
  }
  mb::optim::PluginOptimizer optimizer(plugin, model->parameters(), tp, hparams, seed,
                                       [](const std::string& line) { std::cout << "> plugin: " << line << "\n"; },
                                       shards.get());
  if (resume_from) {
    // checkpoints hold whole tensors: the distributed optimizer takes its pieces of them
    const bool load_optim = !finetune && !no_load_optim;
    mb::optim::OptimizerState whole = load_optim ? optimizer.whole_state() : mb::optim::OptimizerState{};
    std::vector<mb::Tensor> masters = shards ? shards->whole_masters() : std::vector<mb::Tensor>{};
    mb::io::load_checkpoint(*resume_from, model->parameters(), load_optim ? &whole : nullptr, plugin.name(),
                            mc.padded_vocab_size(), shards ? &masters : nullptr);
    if (load_optim) optimizer.restore_pieces(whole);
    if (shards) shards->restore_masters(masters);
    std::cout << "> loaded " << (finetune ? "the model from " : no_load_optim ? "the model and position from " : "")
              << resume_from->string() << " (iteration " << resume_state.iteration << ", "
              << resume_state.consumed_samples << " samples)" << (finetune ? "; starting at iteration 0" : "")
              << (resume_state.checksummed ? "" : "; written before checkpoints carried checksums, so not verified")
              << std::endl;
  }
  opt.checkpoint.model = model_json(mc);
  opt.checkpoint.optimizer = plugin.name();
  opt.checkpoint.optimizer_version = plugin.entry->version ? plugin.entry->version : "";
  opt.checkpoint.optimizer_params = hp_resolved;
  opt.world_size = parallel.world_size;
  mb::train::Trainer trainer(opt, *model, optimizer, tp, *train_src, valid_src.get(), metrics.get(), std::cout);
  trainer.set_test_data(test_src.get());
  if (valid_src || test_src) {  // what "validation loss" and "test loss" will be means over
    auto describe = [&](const char* name, const mb::train::BatchSource& src) {
      const int64_t n = trainer.eval_sample_count(src);
      const auto epoch = static_cast<int64_t>(src.samples_per_epoch());
      std::string said = std::string(name) + " " + std::to_string(n);
      if (epoch <= 0) return said;  // a source that does not know its size
      if (n == epoch) return said + " (the whole split, each once)";
      return said + (n < epoch ? " of " + std::to_string(epoch) : " (the split's " + std::to_string(epoch) + " repeated)");
    };
    std::cout << "> evaluation samples: "
              << (valid_src ? describe("validation", *valid_src) + (test_src ? ", " : "") : std::string())
              << (test_src ? describe("test", *test_src) + " after training" : std::string()) << std::endl;
  }
  trainer.set_data_parallel(*parallel.dp);
  trainer.set_world(*parallel.world);
  if (resuming) trainer.restore(resume_state);
  const auto reason = trainer.run();
  if (reason == mb::train::StopReason::kSignal) {
    // The stop is done (checkpoint written): a repeat of the request, as sweep run sends
    // until the point has exited, must not kill the process on its way out.
    std::signal(SIGTERM, SIG_IGN);
    std::signal(SIGUSR1, SIG_IGN);
    return kExitStoppedBySignal;
  }
  if (reason == mb::train::StopReason::kDiverged) {
    if (logger)
      mb::write_file_atomic(run_dir / "DIVERGED",
                            json({{"iteration", trainer.diverged_at()}, {"reason", trainer.divergence_reason()},
                                  {"divergence_loss", opt.divergence_loss},
                                  {"divergence_intervals", opt.divergence_intervals}})
                                    .dump() + "\n");
    std::cout << "> diverged: iteration " << trainer.diverged_at() << ": " << trainer.divergence_reason() << "; "
              << (run_dir / "DIVERGED").string() << std::endl;
    return kExitDiverged;
  }
  std::cout << "> " << (reason == mb::train::StopReason::kFinished ? "done" : "stopped") << ": iteration "
            << trainer.iteration() << ", " << trainer.consumed_samples() << " samples";
  if (!trainer.losses().empty()) std::cout << ", last lm loss " << trainer.losses().back();
  std::cout << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun / srun / an MPIJob this process is one rank of the job.
  const bool mpi = mb::comm::init_mpi_if_launched(&argc, &argv);
  const std::string who = mpi ? "train (rank " + std::string(std::getenv("OMPI_COMM_WORLD_RANK") ? std::getenv("OMPI_COMM_WORLD_RANK")
                                                             : std::getenv("PMIX_RANK") ? std::getenv("PMIX_RANK") : "?") + ")"
                              : "train";
  int status = 0;
  try {
    status = run(argc, argv);
  } catch (const mb::Error& e) {  // one write, so that the ranks' lines do not interleave
    std::cerr << who + ": error: " + e.what() + "\n" << std::flush;
    status = 1;
  } catch (const std::exception& e) {
    std::cerr << who + ": internal error: " + e.what() + "\n" << std::flush;
    status = 2;
  }
  // A failing rank ends the whole job at once, so no other rank waits in a collective.
  if (mpi && status != 0 && status != kExitStoppedBySignal && status != kExitDiverged) mb::comm::abort_job(status);
  return status;
}
