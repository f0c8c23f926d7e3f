#include "core/train/trainer_state.h"

#include <string>
#include <type_traits>
#include <vector>

#include "core/util/error.h"

namespace megabatch::train {

namespace {
// A field of a checkpoint's trainer state ("lr_samples", "loss_scaler.scale") as
// trainer_state_json() writes it, T being int64_t or double; `fallback` where a checkpoint from
// before the field lacks it. A hand-edited or damaged attribute is refused naming the file
// and the field, not met as a JSON library's type error.
template <class T>
T trainer_field(const io::CheckpointState& state, const std::string& path, std::optional<T> fallback = std::nullopt) {
  const std::string where = state.file.string() + ": attribute 'trainer': ";
  const char* damaged = io::kDamagedCheckpoint;
  const size_t dot = path.find('.');
  const nlohmann::json* o = &state.trainer;
  if (dot != std::string::npos) {
    const std::string outer = path.substr(0, dot);
    check(state.trainer.contains(outer), where, "no '", outer, "'", damaged);
    o = &state.trainer[outer];
    check(o->is_object(), where, outer, " is ", o->dump(), ", not an object", damaged);
  }
  const std::string key = dot == std::string::npos ? path : path.substr(dot + 1);
  if (!o->contains(key)) {
    check(fallback.has_value(), where, "no '", path, "'", damaged);
    return *fallback;
  }
  const nlohmann::json& v = (*o)[key];
  constexpr bool integer = std::is_integral_v<T>;
  check(integer ? v.is_number_integer() : v.is_number(), where, path, " is ", v.dump(), ", not ",
        integer ? "an integer" : "a number", damaged);
  return v.get<T>();
}

// A named value of lr_schedule (its style, its WSD shape) read by `parse`, `fallback` where a
// checkpoint from before it lacks it; a value that is not one of them is refused naming the field.
template <class E>
E schedule_name(const io::CheckpointState& state, const char* key, const char* fallback, E (*parse)(const std::string&),
                const char* what) {
  const nlohmann::json v =
      state.trainer["lr_schedule"].value(key, fallback ? nlohmann::json(fallback) : nlohmann::json());
  std::optional<E> parsed;
  try {
    if (v.is_string()) parsed = parse(v.get<std::string>());
  } catch (const Error&) {  // not one of them: said below
  }
  check(parsed.has_value(), state.file.string(), ": attribute 'trainer': lr_schedule.", key, " is ", v.dump(),
        ", not ", what, io::kDamagedCheckpoint);
  return *parsed;
}
}  // namespace

nlohmann::json trainer_state_json(const optim::MixedPrecisionOptimizer& optimizer, const NoiseScaleEstimator& noise,
                                  int64_t skipped_iterations) {
  const optim::StepCounts counts = optimizer.counts();
  const ops::LossScalerState scaler = optimizer.loss_scaler_state();
  const auto& sc = optimizer.schedule();
  nlohmann::json out = {{"noise_scale", noise.state()},
                        {"optimizer_steps", counts.optimizer_steps},
                        {"lr_samples", counts.lr_samples},
                        {"skipped_iterations", skipped_iterations},
                        {"loss_scaler",
                         {{"scale", scaler.scale},
                          {"growth_tracker", scaler.growth_tracker},
                          {"hysteresis_tracker", scaler.hysteresis_tracker},
                          {"dynamic", optimizer.loss_scaler_config().dynamic}}},
                        {"lr_schedule",
                         {{"max_lr", sc.max_lr},
                          {"min_lr", sc.min_lr},
                          {"warmup_samples", sc.warmup_samples},
                          {"decay_samples", sc.decay_samples},
                          {"style", optim::decay_style_name(sc.style)},
                          {"power", sc.power},
                          {"wsd_decay_samples", sc.wsd_decay_samples},
                          {"wsd_style", optim::wsd_style_name(sc.wsd_style)},
                          {"init_lr", sc.init_lr},
                          {"lr", sc.lr(counts.lr_samples)},
                          {"wd_incr_style", optim::wd_incr_style_name(sc.wd.style)},
                          {"start_wd", sc.wd.start},
                          {"end_wd", sc.wd.end},
                          {"wd_incr_samples", sc.wd.incr_samples},
                          {"weight_decay", sc.wd.at(counts.lr_samples)}}}};
  if (sc.decoupled) {  // --decoupled-lr: the embedding's own peak and minimum (none: lr's)
    out["lr_schedule"]["decoupled_max_lr"] = sc.decoupled_max_lr;
    out["lr_schedule"]["decoupled_min_lr"] = sc.decoupled_min_lr;
    out["lr_schedule"]["decoupled_lr"] = sc.decoupled_lr(counts.lr_samples);
  }
  return out;
}

TrainerState read_trainer_state(const io::CheckpointState& state) {
  const nlohmann::json& t = state.trainer;
  TrainerState out;
  if (t.contains("noise_scale")) {  // checked field by field, then read by the estimator
    for (const char* f : {"noise_scale.g2", "noise_scale.trace", "noise_scale.decay_pow"})
      trainer_field<double>(state, f);
    trainer_field<int64_t>(state, "noise_scale.count");
    out.noise_scale = t["noise_scale"];
  }
  // checkpoints before loss scaling: every iteration was an optimizer step
  out.counts.optimizer_steps = trainer_field<int64_t>(state, "optimizer_steps", state.iteration);
  out.counts.lr_samples = trainer_field<int64_t>(state, "lr_samples", state.consumed_samples);
  out.skipped_iterations = trainer_field<int64_t>(state, "skipped_iterations", int64_t{0});
  if (t.contains("loss_scaler")) {
    std::vector<float> s;
    for (const char* f : {"loss_scaler.scale", "loss_scaler.growth_tracker", "loss_scaler.hysteresis_tracker"})
      s.push_back(static_cast<float>(trainer_field<double>(state, f)));
    out.loss_scaler = ops::LossScalerState{s[0], s[1], s[2]};
  }
  if (t.contains("lr_schedule")) {
    optim::LrSchedule sc;
    sc.max_lr = trainer_field<double>(state, "lr_schedule.max_lr");
    sc.min_lr = trainer_field<double>(state, "lr_schedule.min_lr");
    sc.warmup_samples = trainer_field<int64_t>(state, "lr_schedule.warmup_samples");
    sc.decay_samples = trainer_field<int64_t>(state, "lr_schedule.decay_samples");
    sc.power = trainer_field<double>(state, "lr_schedule.power", 1.0);
    // checkpoints before WSD and --lr-warmup-init: none, from 0
    sc.wsd_decay_samples = trainer_field<int64_t>(state, "lr_schedule.wsd_decay_samples", int64_t{0});
    sc.init_lr = trainer_field<double>(state, "lr_schedule.init_lr", 0.0);
    sc.style = schedule_name(state, "style", nullptr, optim::parse_decay_style, "a decay style");
    sc.wsd_style = schedule_name(state, "wsd_style", "exponential", optim::parse_wsd_style, "a WSD decay style");
    out.schedule_has_wd = t["lr_schedule"].contains("wd_incr_style");
    if (out.schedule_has_wd) {
      sc.wd.style = schedule_name(state, "wd_incr_style", nullptr, optim::parse_wd_incr_style, "a weight-decay style");
      sc.wd.start = trainer_field<double>(state, "lr_schedule.start_wd");
      sc.wd.end = trainer_field<double>(state, "lr_schedule.end_wd");
      sc.wd.incr_samples = trainer_field<int64_t>(state, "lr_schedule.wd_incr_samples");
    }
    sc.decoupled = t["lr_schedule"].contains("decoupled_max_lr");  // none before --decoupled-lr
    if (sc.decoupled) {
      sc.decoupled_max_lr = trainer_field<double>(state, "lr_schedule.decoupled_max_lr");
      sc.decoupled_min_lr = trainer_field<double>(state, "lr_schedule.decoupled_min_lr");
    }
    out.schedule = sc;
  }
  return out;
}

}  // namespace megabatch::train
