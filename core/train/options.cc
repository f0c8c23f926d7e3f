#include "core/train/options.h"

#include <cmath>
#include <functional>
#include <string>

#include "core/train/noise_scale.h"
#include "core/util/error.h"

namespace megabatch::train {
using nlohmann::json;

// The dtype of --bf16 / --fp16 (f32 otherwise) and the fp16 loss scaler of Megatron's flags.
DType run_dtype(const json& v) {
  const bool bf16 = v["bf16"].get<bool>(), fp16 = v["fp16"].get<bool>();
  check(!(bf16 && fp16), "--bf16 and --fp16 are mutually exclusive; pick one (bf16 needs no loss scaling)");
  return bf16 ? DType::kBF16 : fp16 ? DType::kF16 : DType::kF32;
}

ops::LossScalerConfig loss_scaler(const config::Resolved& r, DType dtype) {
  const json& v = r.values;
  for (const char* k : {"loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis"})
    check(!r.given(k) || dtype == DType::kF16, "--", config::flag_name(k),
              " is for --fp16 runs (loss scaling); ", dtype == DType::kBF16 ? "bf16 needs none" : "add --fp16",
              " or drop it");
  ops::LossScalerConfig c;
  c.dynamic = !v.contains("loss_scale");
  c.initial_scale = static_cast<float>(c.dynamic ? v["initial_loss_scale"].get<double>() : v["loss_scale"].get<double>());
  c.min_scale = static_cast<float>(v["min_loss_scale"].get<double>());
  c.window = static_cast<int32_t>(v["loss_scale_window"].get<int64_t>());
  c.hysteresis = static_cast<int32_t>(v["hysteresis"].get<int64_t>());
  check(std::isfinite(c.initial_scale) && c.initial_scale > 0, c.dynamic ? "--initial-loss-scale" : "--loss-scale",
            " must be a positive finite number");
  check(c.min_scale > 0 && c.min_scale <= c.initial_scale, "--min-loss-scale must be in (0, initial loss scale]");
  check(c.window >= 1 && c.hysteresis >= 1, "--loss-scale-window and --hysteresis must be >= 1");
  return c;
}

std::string schedule_key_counting(const json& v, const std::string& unit) {
  for (const std::string kind : {"lr_warmup_", "lr_decay_", "lr_wsd_decay_"}) {
    const std::string key = kind + unit;
    if (!v.contains(key) || v[key].is_null()) continue;
    if (kind != "lr_warmup_" || (v[key].is_number() && v[key].get<double>() != 0)) return key;  // a warmup of 0 is none
  }
  return "";
}

std::string schedule_conflict(const json& v, const std::function<std::string(const std::string&)>& name,
                              const std::string& length_from) {
  const auto present = [&](const char* k) { return v.contains(k) && !v[k].is_null(); };
  const auto nonzero = [&](const char* k) { return present(k) && v[k].is_number() && v[k].get<double>() != 0; };
  const bool by_iters = present("train_iters"), by_samples = present("train_samples");
  // a key of one count in a run of the other: what to give instead
  const auto counted = [&](const std::string& key, const std::string& instead) {
    const std::string run =
        name(by_iters ? "train_iters" : "train_samples") + (length_from.empty() ? "" : ", from " + length_from);
    std::string s = name(key) + " counts " + (by_iters ? "samples" : "iterations") + ", but this run counts " +
                    (by_iters ? "iterations" : "samples") + " (" + run + "), which would ignore it; give " + instead;
    if (length_from.empty()) s += ", or train by " + name(by_iters ? "train_samples" : "train_iters");
    return s;
  };
  if (by_iters != by_samples) {
    const std::string ignored = schedule_key_counting(v, by_iters ? "samples" : "iters");
    if (!ignored.empty()) {
      const std::string kind = ignored.substr(0, ignored.rfind('_') + 1);  // "lr_warmup_", "lr_decay_", ...
      if (kind != "lr_warmup_") return counted(ignored, name(kind + (by_iters ? "iters" : "samples")) + " instead");
      return counted(ignored, by_iters ? name("lr_warmup_fraction") + " (a share of the decay span" +
                                             (length_from.empty() ? "" : ": the same samples at every batch size") +
                                             ") or " + name("lr_warmup_iters") + " instead"
                                       : name("lr_warmup_samples") + " or " + name("lr_warmup_fraction") + " instead");
    }
  }
  // WSD's keys on another decay style, which would ignore them; WSD without its decay's length
  const bool wsd = present("lr_decay_style") && v["lr_decay_style"].is_string() &&
                   v["lr_decay_style"].get<std::string>() == "WSD";
  // (the shape by its value: train's values carry its default, exponential)
  const char* ignored = wsd                                   ? nullptr
                        : present("lr_wsd_decay_iters")       ? "lr_wsd_decay_iters"
                        : present("lr_wsd_decay_samples")     ? "lr_wsd_decay_samples"
                        : present("lr_wsd_decay_style") && v["lr_wsd_decay_style"] != "exponential"
                            ? "lr_wsd_decay_style"
                            : nullptr;
  if (ignored)
    return name(ignored) + " shapes the decay of " + name("lr_decay_style") + " WSD, which this run does not use (" +
           (present("lr_decay_style") && v["lr_decay_style"].is_string() ? v["lr_decay_style"].get<std::string>()
                                                                          : std::string("the default, linear")) +
           "), so it would do nothing; set " + name("lr_decay_style") + " WSD, or drop it";
  if (wsd && !present("lr_wsd_decay_iters") && !present("lr_wsd_decay_samples"))
    return name("lr_decay_style") + " WSD decays over the last " +
           name(by_samples && !by_iters ? "lr_wsd_decay_samples" : "lr_wsd_decay_iters") +
           " of the decay span, which is not given; give it (0: no decay before the span ends)";
  if (nonzero("lr_warmup_init") && !nonzero("lr_warmup_iters") && !nonzero("lr_warmup_samples") &&
      !nonzero("lr_warmup_fraction"))
    return name("lr_warmup_init") + " is where the warmup starts, and this run has none, so it would do nothing; "
           "give a warmup (" + name("lr_warmup_iters") + ", " + name("lr_warmup_samples") + " or " +
           name("lr_warmup_fraction") + "), or drop it";
  if (present("lr_warmup_fraction"))
    for (const char* count : {"lr_warmup_iters", "lr_warmup_samples"})
      if (nonzero(count))
        return name("lr_warmup_fraction") + " and " + name(count) + " both set the warmup; give one of them";
  if (present("lr") && present("min_lr") && v["lr"].is_number() && v["min_lr"].is_number() &&
      v["min_lr"].get<double>() > v["lr"].get<double>())
    return name("min_lr") + " (" + v["min_lr"].dump() + ") is above " + name("lr") + " (" + v["lr"].dump() +
           "): the learning rate would rise as it decays; give a " + name("min_lr") + " at or below " + name("lr");
  const bool scaled =
      present("lr_scaling") && v["lr_scaling"].is_string() && v["lr_scaling"].get<std::string>() != "none";
  if (present("lr_scaling_ref_batch") && !scaled)
    return name("lr_scaling_ref_batch") + " is the batch at which " + name("lr") + " is given for " +
           name("lr_scaling") + ", which is none here, so it would do nothing; set " + name("lr_scaling") +
           " to sqrt or linear, or drop it";
  return "";
}

namespace {
// --rampup-batch-size START INCREMENT SAMPLES, checked against the run's batch.
BatchRampup rampup(const json& list, bool by_iters, const TrainOptions& opt, int64_t dp_size) {
  check(list.size() == 3, "--rampup-batch-size takes three numbers, START INCREMENT SAMPLES (got ", list.size(),
        ": ", list.dump(), ")");
  check(!by_iters, "--rampup-batch-size ramps the batch over samples, and needs a run counted in samples: give "
        "--train-samples instead of --train-iters (and the schedule's --lr-*-samples), as Megatron does");
  const BatchRampup r{list[0].get<int64_t>(), list[1].get<int64_t>(), list[2].get<int64_t>()};
  check_rampup(r, opt.global_batch_size, opt.micro_batch_size, dp_size);
  return r;
}

// The learning-rate schedule of the flags (--lr, --min-lr, --lr-decay-*, --lr-warmup-*,
// --lr-scaling), in samples of a global batch of `gbs`.
optim::LrSchedule lr_schedule(const json& v, int64_t gbs, int64_t train_iters) {
  const bool by_iters = v.contains("train_iters");
  check(v.contains("lr"), "--lr is required");
  const std::string conflict =
      schedule_conflict(v, [](const std::string& key) { return "--" + config::flag_name(key); });
  check(conflict.empty(), conflict);
  const auto rule = optim::parse_lr_scaling(v["lr_scaling"].get<std::string>());
  const int64_t ref = v.contains("lr_scaling_ref_batch") ? v["lr_scaling_ref_batch"].get<int64_t>() : 0;
  optim::LrSchedule s;
  s.max_lr = optim::scaled_lr(v["lr"].get<double>(), rule, gbs, ref);
  s.min_lr = optim::scaled_lr(v["min_lr"].get<double>(), rule, gbs, ref);
  s.init_lr = optim::scaled_lr(v["lr_warmup_init"].get<double>(), rule, gbs, ref);
  s.decoupled = v.contains("decoupled_lr");
  check(s.decoupled || !v.contains("decoupled_min_lr"), "--decoupled-min-lr is the minimum of the learning rate that "
        "--decoupled-lr gives the embedding and output layer, which is not given; give --decoupled-lr, or drop "
        "--decoupled-min-lr");
  if (s.decoupled) {
    s.decoupled_max_lr = optim::scaled_lr(v["decoupled_lr"].get<double>(), rule, gbs, ref);
    s.decoupled_min_lr =
        v.contains("decoupled_min_lr") ? optim::scaled_lr(v["decoupled_min_lr"].get<double>(), rule, gbs, ref) : s.min_lr;
  }
  s.style = optim::parse_decay_style(v["lr_decay_style"].get<std::string>());
  s.wsd_style = optim::parse_wsd_style(v["lr_wsd_decay_style"].get<std::string>());
  s.power = v["lr_decay_power"].get<double>();
  if (by_iters) {
    s.decay_samples = (v.contains("lr_decay_iters") ? v["lr_decay_iters"].get<int64_t>() : train_iters) * gbs;
    s.warmup_samples = v["lr_warmup_iters"].get<int64_t>() * gbs;
    if (v.contains("lr_wsd_decay_iters")) s.wsd_decay_samples = v["lr_wsd_decay_iters"].get<int64_t>() * gbs;
  } else {
    s.decay_samples = v.contains("lr_decay_samples") ? v["lr_decay_samples"].get<int64_t>() : v["train_samples"].get<int64_t>();
    s.warmup_samples = v["lr_warmup_samples"].get<int64_t>();
    if (v.contains("lr_wsd_decay_samples")) s.wsd_decay_samples = v["lr_wsd_decay_samples"].get<int64_t>();
  }
  if (v.contains("lr_warmup_fraction"))
    s.warmup_samples = static_cast<int64_t>(v["lr_warmup_fraction"].get<double>() * static_cast<double>(s.decay_samples));
  // the flags that set the warmup, the decay span and WSD's decay, as the run counts them
  const std::string unit = by_iters ? "iters" : "samples";
  const auto given = [&](const std::string& key, const std::string& otherwise) {
    const std::string& k = v.contains(key) || !v.contains(otherwise) ? key : otherwise;
    std::string flag = "--" + config::flag_name(k);
    if (v.contains(k)) flag.append(" ").append(v[k].dump());
    return flag;
  };
  const std::string warmup = given("lr_warmup_fraction", "lr_warmup_" + unit);
  const std::string span = given("lr_decay_" + unit, by_iters ? "train_iters" : "train_samples");
  check(s.warmup_samples <= s.decay_samples || s.style == optim::DecayStyle::kConstant ||
            s.style == optim::DecayStyle::kInverseSquareRoot,
        "the lr warmup (", warmup, ") is longer than the decay span (", span,
        "): the decay would end before the warmup does; give a shorter warmup or a longer --lr-decay-", unit);
  // the decay starts before the warmup ends: the learning rate would jump down as the warmup ends
  check(s.style != optim::DecayStyle::kWsd || s.wsd_decay_samples <= s.decay_samples - s.warmup_samples,
        "--lr-decay-style WSD: its decay (", given("lr_wsd_decay_" + unit, ""), ") is longer than what the decay span (",
        span, ") leaves after the warmup (", warmup, "), so it would start during the warmup; give a shorter "
        "--lr-wsd-decay-", unit, " or a shorter warmup");
  check(s.init_lr <= s.max_lr, "--lr-warmup-init (", s.init_lr, ") is above --lr (", s.max_lr,
        "): the warmup would lower the learning rate; give a --lr-warmup-init at or below --lr");
  check(!s.decoupled || s.init_lr <= s.decoupled_max_lr, "--lr-warmup-init (", s.init_lr, ") is above --decoupled-lr (",
        s.decoupled_max_lr, "): the warmup, which both learning rates share, would lower the embedding's; give a ",
        "--lr-warmup-init at or below both");
  return s;
}

// The weight-decay schedule of the flags (--weight-decay-incr-style, --start-weight-decay,
// --end-weight-decay) over the run's `samples`, as Megatron's; constant: the plugin's own
// weight_decay, which the caller records once the plugin is known.
optim::WdSchedule wd_schedule(const config::Resolved& r, int64_t samples) {
  const json& v = r.values;
  optim::WdSchedule s;
  s.style = optim::parse_wd_incr_style(v["weight_decay_incr_style"].get<std::string>());
  const bool start = v.contains("start_weight_decay"), end = v.contains("end_weight_decay");
  if (!s.scheduled()) {
    check(!start && !end, "--", start ? "start" : "end", "-weight-decay moves the weight decay over the run only with "
          "--weight-decay-incr-style linear or cosine, which is not given (constant holds --weight-decay); give the "
          "style, or drop --start-weight-decay and --end-weight-decay");
    return s;
  }
  const std::string style = "--weight-decay-incr-style " + v["weight_decay_incr_style"].get<std::string>();
  check(start && end, style, " moves the weight decay from --start-weight-decay to --end-weight-decay; give both");
  check(!r.given("weight_decay"), style, " sets the weight decay from --start-weight-decay to --end-weight-decay, so "
        "--weight-decay ", v["weight_decay"].dump(), " would be ignored; drop it (null in a config or sweep file)");
  s.start = v["start_weight_decay"].get<double>();
  s.end = v["end_weight_decay"].get<double>();
  s.incr_samples = samples;
  return s;
}

// Clipping, logging, evaluation, diagnostics and noise-scale options.
void logging_options(const config::Resolved& r, TrainOptions& opt) {
  const json& v = r.values;
  opt.clip_grad = v["clip_grad"].get<double>();
  opt.log_interval = std::max<int64_t>(1, v["log_interval"].get<int64_t>());
  opt.eval_interval = v["eval_interval"].get<int64_t>();
  opt.eval_iters = v["eval_iters"].get<int64_t>();
  if (v.contains("eval_samples")) {
    opt.eval_samples = v["eval_samples"].get<int64_t>();
    check(opt.eval_samples % opt.micro_batch_size == 0, "--eval-samples (", opt.eval_samples,
              ") must be a multiple of --micro-batch-size (", opt.micro_batch_size, ")");
    // a validation run of eval_samples samples: eval_iters' batches, given too, would be ignored
    check(!r.given("eval_iters") || opt.eval_iters == 0, "--eval-iters ", opt.eval_iters, " and --eval-samples ",
          opt.eval_samples,
          " both size a validation run, and --eval-samples takes its samples instead of --eval-iters' global batches, "
          "so --eval-iters would be ignored; give one of them");
  }
  check(!v["skip_train"].get<bool>() || opt.eval_iters > 0 || opt.eval_samples > 0,
        "--skip-train evaluates the validation and test splits, but --eval-iters is 0, so it would evaluate nothing; "
        "give --eval-iters N (global batches) or --eval-samples N, or drop --skip-train");
  opt.diagnostics_interval =
      v.contains("diagnostics_interval") ? v["diagnostics_interval"].get<int64_t>() : opt.log_interval;
  check(opt.diagnostics_interval >= 0, "--diagnostics-interval must be >= 0 (0: off), got ",
            opt.diagnostics_interval);
  opt.diagnostics_asked = r.given("diagnostics_interval");
  opt.noise_scale = v["log_noise_scale"].get<bool>();
  opt.per_token_loss = v["calculate_per_token_loss"].get<bool>();
  check(!opt.per_token_loss || !opt.noise_scale,
        "--log-noise-scale estimates the noise from each micro-batch's mean gradient, which "
        "--calculate-per-token-loss weighs by its token count; drop one of them");
  for (const char* key : {"noise_scale_ema", "noise_scale_window"})
    check(opt.noise_scale || !r.given(key), "--", config::flag_name(key),
              " averages the gradient noise scale, which only --log-noise-scale estimates; add it or drop the option");
  check(!r.given("noise_scale_ema") || !r.given("noise_scale_window"),
            "--noise-scale-ema (a decay a step) and --noise-scale-window (a window in samples) are both set; give one");
  opt.noise_scale_ema = v["noise_scale_ema"].get<double>();
  if (v.contains("noise_scale_window")) opt.noise_scale_window = static_cast<double>(v["noise_scale_window"].get<int64_t>());
}
}  // namespace

// The run's batch, iterations, learning-rate schedule, logging, evaluation, checkpoint,
// loss-scaling and divergence options from its flags (errors name the flag); dp_size: the
// data-parallel ranks launched. What depends on the model (tokens per sample, FLOPs per
// iteration) is the caller's to fill in.
TrainOptions train_options(const config::Resolved& r, DType dtype, int64_t dp_size, int64_t padded_vocab) {
  const json& v = r.values;
  TrainOptions opt;
  opt.micro_batch_size = v["micro_batch_size"].get<int64_t>();
  opt.global_batch_size =
      v.contains("global_batch_size") ? v["global_batch_size"].get<int64_t>() : opt.micro_batch_size * dp_size;
  check(opt.micro_batch_size >= 1 && opt.global_batch_size >= 1, "micro_batch_size and global_batch_size must be >= 1");
  check(opt.global_batch_size % opt.micro_batch_size == 0, "global_batch_size (", opt.global_batch_size,
            ") must be a multiple of micro_batch_size (", opt.micro_batch_size, ")");
  check(opt.global_batch_size % (opt.micro_batch_size * dp_size) == 0, "global_batch_size (", opt.global_batch_size,
            ") must be a multiple of micro_batch_size x data-parallel size (", opt.micro_batch_size, " x ", dp_size, ")");
  const bool by_iters = v.contains("train_iters"), by_samples = v.contains("train_samples");
  check(by_iters != by_samples, "give exactly one of --train-iters and --train-samples");
  if (v.contains("rampup_batch_size")) opt.rampup = rampup(v["rampup_batch_size"], by_iters, opt, dp_size);
  opt.train_iters = by_iters ? v["train_iters"].get<int64_t>()
                             : ramp_iterations(opt.rampup, opt.global_batch_size, v["train_samples"].get<int64_t>());
  check(opt.train_iters >= 1, "the run has no iterations (train_iters ", opt.train_iters, ")");
  if (v.contains("iterations_to_skip")) {
    for (const int64_t it : v["iterations_to_skip"].get<std::vector<int64_t>>()) {
      check(it <= opt.train_iters, "--iterations-to-skip ", it, " is past the run's last iteration (", opt.train_iters,
            "), so it would skip nothing; drop it");
      opt.iterations_to_skip.insert(it);
    }
  }
  opt.schedule = lr_schedule(v, opt.global_batch_size, opt.train_iters);
  opt.schedule.wd = wd_schedule(r, by_iters ? opt.train_iters * opt.global_batch_size : v["train_samples"].get<int64_t>());
  logging_options(r, opt);
  // (the trainer checks it again; here, so that --check and a sweep's dry run refuse it)
  if (opt.noise_scale) check_noise_scale_batch(opt.global_batch(0), opt.micro_batch_size, opt.rampup.on());
  if (v.contains("save")) opt.save_dir = v["save"].get<std::string>();
  opt.save_interval = v["save_interval"].get<int64_t>();
  opt.exit_interval = v["exit_interval"].get<int64_t>();
  if (v.contains("exit_duration_in_mins")) opt.exit_duration_minutes = v["exit_duration_in_mins"].get<double>();
  opt.profile_steps = v["profile_steps"].get<int64_t>();
  if (v.contains("check_weight_hash_across_dp_replicas_interval"))
    opt.replica_check_interval = v["check_weight_hash_across_dp_replicas_interval"].get<int64_t>();
  // (a resumed run that has 2 or fewer iterations left says so at its end: StepProfile)
  check(opt.profile_steps == 0 || opt.train_iters > kProfileWarmup, "--profile-steps ", opt.profile_steps,
        " times the iterations after the first ", kProfileWarmup, " (warm-up), but the run has ", opt.train_iters,
        " in all (", by_iters ? "--train-iters" : "--train-samples", "), so it would profile nothing; ask for at least ",
        kProfileWarmup + 1, " iterations, or drop --profile-steps");
  opt.keep_checkpoints = static_cast<int>(v["keep_checkpoints"].get<int64_t>());
  check(opt.save_interval >= 0 && opt.exit_interval >= 0 && opt.keep_checkpoints >= 0,
            "--save-interval, --exit-interval and --keep-checkpoints must be >= 0");
  // Checkpoint options without the directory they act on: refused, where they did nothing (a
  // run that meant to checkpoint every N iterations wrote none).
  check(!opt.save_dir.empty() || opt.save_interval == 0, "--save-interval ", opt.save_interval,
        " writes checkpoints into --save, which is not given, so none would be written; add --save DIR (and --load "
        "DIR to resume from them), or drop --save-interval");
  check(!opt.save_dir.empty() || opt.keep_checkpoints == 0, "--keep-checkpoints ", opt.keep_checkpoints,
        " keeps the newest checkpoints in --save, which is not given; add --save DIR, or drop --keep-checkpoints");
  // Megatron's --save-retain-interval: the newest and every R-th (with --keep-checkpoints K, the K newest)
  if (v.contains("save_retain_interval")) {
    opt.save_retain_interval = v["save_retain_interval"].get<int64_t>();
    const std::string flag = "--save-retain-interval " + std::to_string(opt.save_retain_interval);
    check(!opt.save_dir.empty(), flag, " keeps checkpoints in --save, which is not given; add --save DIR, or drop it");
    check(opt.save_interval > 0 && opt.save_retain_interval % opt.save_interval == 0, flag,
          " keeps the checkpoints of its multiples, which --save-interval ", opt.save_interval,
          opt.save_interval > 0 ? " does not write" : " (only at the end) does not write",
          " (Megatron asserts the same); make it a multiple of --save-interval");
    if (opt.keep_checkpoints == 0) opt.keep_checkpoints = 1;
  }
  check(!v["override_opt_param_scheduler"].get<bool>() || !v["use_checkpoint_opt_param_scheduler"].get<bool>(),
        "--override-opt-param-scheduler takes this run's learning-rate schedule and "
        "--use-checkpoint-opt-param-scheduler the checkpoint's; give one of them");
  for (const char* flag : {"finetune", "no_load_optim", "load_fallback", "override_opt_param_scheduler",
                           "use_checkpoint_opt_param_scheduler", "exit_on_missing_checkpoint"})
    check(v.contains("load") || !v[flag].get<bool>(), "--", config::flag_name(flag),
          " says how to load from --load, which is not given, so it would do nothing; add --load DIR (or a "
          "checkpoint file), or drop --",
          config::flag_name(flag));
  // --finetune makes --load the weights to start from; beside --pretrained-checkpoint, --load is
  // this run's own checkpoints, which a restart must resume from, not fine-tune from again.
  check(!v.contains("pretrained_checkpoint") || !v["finetune"].get<bool>(),
        "--finetune takes the model from --load, but with --pretrained-checkpoint the model comes from there and "
        "--load is this run's own checkpoints to resume from; drop --finetune");
  check(
      v.contains("load") || !v.contains("ckpt_step"), "--ckpt-step ", v.value("ckpt_step", int64_t{0}),
      " picks a checkpoint of --load's directory, which is not given; add --load DIR",
      v.contains("pretrained_checkpoint") ? " (for --pretrained-checkpoint, name its file: DIR/iter_NNNNNNN.h5)" : "");
  check(!v.contains("pretrained_checkpoint") || !v["exit_on_missing_checkpoint"].get<bool>(),
        "--exit-on-missing-checkpoint refuses a first start, which is when --pretrained-checkpoint is read; give one "
        "of them");
  check(v.contains("pretrained_checkpoint") || !v["pretrained_optimizer_state"].get<bool>(),
        "--pretrained-optimizer-state takes the optimizer state from --pretrained-checkpoint, which is not given, so "
        "it would do nothing; add --pretrained-checkpoint DIR, or drop --pretrained-optimizer-state");
  opt.seed = static_cast<uint64_t>(v["seed"].get<int64_t>());
  opt.loss_scaler = loss_scaler(r, dtype);
  opt.log_throughput = v["log_throughput"].get<bool>();
  opt.log_params_norm = v["log_params_norm"].get<bool>();
  opt.log_num_zeros_in_grad = v["log_num_zeros_in_grad"].get<bool>();
  opt.divergence_loss = v.contains("divergence_loss") ? v["divergence_loss"].get<double>()
                                                      : 2.0 * std::log(static_cast<double>(padded_vocab));
  opt.divergence_intervals = v["divergence_intervals"].get<int64_t>();
  return opt;
}

}  // namespace megabatch::train
