#include "sweeps/placement.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "core/train/train_schema.h"
#include "core/util/error.h"
#include "sweeps/sweep_state.h"

namespace megabatch::sweeps {

int ranks_needed(const nlohmann::json& c) {
  const int64_t tp = c.value("tensor_model_parallel_size", int64_t{1}), dp = c.value("data_parallel_size", int64_t{1});
  return static_cast<int>(std::max<int64_t>(1, tp) * std::max<int64_t>(1, dp));
}

std::string layout_problem(const nlohmann::json& c, int ranks) {
  const int64_t tp = c.value("tensor_model_parallel_size", int64_t{1});
  if (ranks % tp != 0)
    return "tensor_model_parallel_size " + std::to_string(tp) + " does not divide the job's " + std::to_string(ranks) +
           " ranks";
  const int64_t dp = ranks / tp;
  if (c.contains("data_parallel_size") && c["data_parallel_size"].get<int64_t>() != dp)
    return "data_parallel_size " + c["data_parallel_size"].dump() + ", but " + std::to_string(ranks) + " ranks at TP " +
           std::to_string(tp) + " are DP " + std::to_string(dp);
  const int64_t micro =
      c.value("micro_batch_size", train::train_schema().find("micro_batch_size")->default_value.get<int64_t>());
  const int64_t global = c.value("global_batch_size", micro * dp);
  if (global % (micro * dp) != 0)
    return "global_batch_size " + std::to_string(global) + " is not a multiple of micro_batch_size x DP (" +
           std::to_string(micro) + " x " + std::to_string(dp) + ")";
  // --rampup-batch-size START INCREMENT SAMPLES: each batch of the ramp is whole micro-batches too
  if (const auto ramp = rampup_of(c); ramp && (ramp->start % (micro * dp) != 0 || ramp->increment % (micro * dp) != 0))
    return "rampup_batch_size " + c["rampup_batch_size"].dump() +
           ": its start and increment are not multiples of micro_batch_size x DP (" + std::to_string(micro) + " x " +
           std::to_string(dp) + ")";
  return "";
}

std::vector<int> parse_gpus(const std::string& spec, int visible) {
  std::vector<int> out;
  if (spec == "all") {
    check(visible > 0, "--gpus all: no GPU is visible to this process (no NVIDIA driver, no GPU, a build without CUDA, ",
          "or CUDA_VISIBLE_DEVICES hides them)");
    for (int i = 0; i < visible; ++i) out.push_back(i);
    return out;
  }
  std::set<int> seen;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    check(!item.empty() && item.find_first_not_of("0123456789") == std::string::npos && item.size() < 6, "--gpus '", spec,
          "': '", item, "' is not a GPU index; give all, or indices such as 0,1,2");
    const int g = std::stoi(item);
    check(g < visible, "--gpus '", spec, "': GPU ", g, " is not visible (", visible, " GPU", visible == 1 ? "" : "s",
          " visible", visible > 0 ? ": 0 to " : "", visible > 0 ? std::to_string(visible - 1) : std::string(), ")");
    check(seen.insert(g).second, "--gpus '", spec, "': GPU ", g, " is listed twice");
    out.push_back(g);
  }
  check(!out.empty(), "--gpus: give all, or GPU indices such as 0,1");
  return out;
}

GpuPlacer::GpuPlacer(std::vector<int> gpus) : gpus_(std::move(gpus)), busy_(gpus_.size(), false) {}

std::vector<int> GpuPlacer::take(int n) {
  if (n <= 0 || static_cast<size_t>(n) > free()) return {};
  std::vector<int> got;
  for (size_t i = 0; i < gpus_.size() && got.size() < static_cast<size_t>(n); ++i)
    if (!busy_[i]) {
      busy_[i] = true;
      got.push_back(gpus_[i]);
    }
  return got;
}

void GpuPlacer::give_back(const std::vector<int>& gpus) {
  for (int g : gpus)
    for (size_t i = 0; i < gpus_.size(); ++i)
      if (gpus_[i] == g) busy_[i] = false;
}

size_t GpuPlacer::free() const { return static_cast<size_t>(std::count(busy_.begin(), busy_.end(), false)); }

std::string gpu_list(const std::vector<int>& gpus) {
  std::ostringstream s;
  for (size_t i = 0; i < gpus.size(); ++i) s << (i ? "," : "") << gpus[i];
  return s.str();
}

}  // namespace megabatch::sweeps
