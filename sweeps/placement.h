// Placing sweep points on a node's GPUs (sweep run --gpus): each point needs
// tensor_model_parallel_size x data_parallel_size GPUs (one process each), gets that many
// free ones, lowest index first, through CUDA_VISIBLE_DEVICES, and gives them back when it
// ends. Points start in sweep order; a point that does not fit now waits while later
// points that fit start.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace megabatch::sweeps {

// The processes (and GPUs) a point's configuration needs: TP x DP, each 1 when unset.
int ranks_needed(const nlohmann::json& config);

// Why a point's configuration cannot run as one job of `ranks` processes, DP = ranks / TP as
// train derives it (a Slurm array task: nodes x tasks per node): TP does not divide the
// ranks, a data_parallel_size other than that DP, or a global batch that micro-batch x DP
// does not divide; "" when it can. train checks the same when it starts, after the queue.
std::string layout_problem(const nlohmann::json& config, int ranks);

// --gpus: "all" (every one of `visible` GPUs) or a comma-separated list of distinct GPU
// indices below `visible`. Errors name the flag and what is wrong.
std::vector<int> parse_gpus(const std::string& spec, int visible);

class GpuPlacer {
 public:
  explicit GpuPlacer(std::vector<int> gpus);
  // n free GPUs (the lowest first), now taken; empty when fewer than n are free.
  std::vector<int> take(int n);
  void give_back(const std::vector<int>& gpus);
  size_t size() const { return gpus_.size(); }
  size_t free() const;

 private:
  std::vector<int> gpus_;
  std::vector<bool> busy_;
};

// "0,1": CUDA_VISIBLE_DEVICES for a list of GPUs.
std::string gpu_list(const std::vector<int>& gpus);

}  // namespace megabatch::sweeps
