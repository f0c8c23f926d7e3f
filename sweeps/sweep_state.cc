#include "sweeps/sweep_state.h"

#include <unistd.h>

#include <algorithm>

#include "core/config/config.h"
#include "core/train/train_schema.h"
#include "core/util/strings.h"

namespace megabatch::sweeps {
namespace fs = std::filesystem;
using nlohmann::json;

std::optional<train::BatchRampup> rampup_of(const json& c) {
  const json r = c.value("rampup_batch_size", json());
  if (!r.is_array() || r.size() != 3 ||
      !std::all_of(r.begin(), r.end(), [](const json& x) { return x.is_number_integer(); }))
    return std::nullopt;
  return train::BatchRampup{r[0].get<int64_t>(), r[1].get<int64_t>(), r[2].get<int64_t>()};
}

int64_t global_batch_of(const json& c) {
  if (c.contains("global_batch_size")) return c["global_batch_size"].get<int64_t>();
  // train's default: micro batch x data-parallel size
  const int64_t micro = c.contains("micro_batch_size")
                            ? c["micro_batch_size"].get<int64_t>()
                            : train::train_schema().find("micro_batch_size")->default_value.get<int64_t>();
  return micro * c.value("data_parallel_size", int64_t{1});
}

namespace {
// The run of a configuration with train_samples (and no train_iters): its iterations and samples.
train::RampRun samples_run(const json& c) {
  const int64_t B = global_batch_of(c);
  // a ramp train --check would refuse counts as none
  train::BatchRampup ramp = rampup_of(c).value_or(train::BatchRampup{});
  if (!train::rampup_problem(ramp, B, 1, 1).empty()) ramp = {};
  return train::ramp_run(ramp, B, c["train_samples"].get<int64_t>());
}
}  // namespace

int64_t iters_of(const json& c) {
  if (c.contains("train_iters")) return c["train_iters"].get<int64_t>();
  return c.contains("train_samples") ? samples_run(c).iterations : 0;
}

int64_t samples_of(const json& c) {
  if (!c.contains("train_iters") && c.contains("train_samples")) return samples_run(c).samples;
  return iters_of(c) * global_batch_of(c);
}

json launch_config(const Point& point) {
  json c = point.config;
  if (!c.contains("save_interval")) {
    int64_t every = std::max<int64_t>(1, iters_of(c) / 10);
    // with --save-retain-interval R, a divisor of R (train refuses others): the largest up to a tenth
    if (c.contains("save_retain_interval") && c["save_retain_interval"].is_number_integer()) {
      const int64_t r = c["save_retain_interval"].get<int64_t>();
      while (r > 0 && r % every != 0) --every;
    }
    c["save_interval"] = every;
  }
  if (!c.contains("keep_checkpoints")) c["keep_checkpoints"] = 2;
  return c;
}

json state_json(const std::vector<PointState>& ps, const Sweep& s, const std::string& launcher) {
  json points = json::array();
  for (const auto& p : ps)
    points.push_back({{"id", p.point->id}, {"state", status_name(p.state)}, {"reason", p.reason}, {"attempts", p.attempts},
                      {"wall_s", p.wall_s}, {"train_iters", p.train_iters}, {"global_batch_size", p.global_batch},
                      {"iteration", p.progress.iteration}, {"ranks", p.ranks}, {"gpus", p.gpus},
                      {"config", p.point->config}});
  json state = {{"name", s.name}, {"file", fs::absolute(s.file).string()}, {"sweep_pid", static_cast<int64_t>(getpid())},
                {"checkpoints", s.checkpoints}, {"points", points}};
  if (s.spec.contains("cluster")) state["cluster"] = s.spec["cluster"];  // for the launchers (eks/render.py --sweep)
  if (!launcher.empty()) state["launcher"] = {{"command", launcher}, {"cwd", fs::current_path().string()}};
  return state;
}

std::string run_again(const std::string& launcher, const std::string& cwd, const std::string& options) {
  std::string command = launcher;
  while (!command.empty() && command.back() == ' ') command.pop_back();  // (printf '%q ' words)
  if (command.empty()) return "sweep run " + options;
  std::error_code ec;
  const bool here = cwd.empty() || fs::equivalent(cwd, fs::current_path(), ec);
  return (here ? "" : "cd " + shell_quote(cwd) + " && ") + command + " " + options;
}

}  // namespace megabatch::sweeps
