// A run's metrics: RUN_DIR/metrics.h5 (continued after the resume point's iteration when
// resuming, else new) and, with --tensorboard-dir, TensorBoard event files written from each
// flush of it.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/io/metrics.h"
#include "core/io/tensorboard.h"

namespace megabatch::train {

struct RunMetrics {
  std::unique_ptr<io::TensorBoardWriter> tensorboard;  // declared first: metrics (its listener) goes first
  std::unique_ptr<io::MetricsFile> metrics;
};

// `resume_after`: the iteration a resumed run continues from (rows after it are dropped);
// `tensorboard_dir` empty: no TensorBoard files; `tensorboard_interval`: TensorBoard takes the
// training series (every group but validation/ and test/) at the iterations it divides, as
// Megatron's --tensorboard-log-interval (metrics.h5 has every iteration).
RunMetrics open_metrics(const std::filesystem::path& file, const nlohmann::json& resolved,
                        std::optional<int64_t> resume_after, const std::string& tensorboard_dir,
                        int64_t tensorboard_interval = 1);

// The rows of `columns` (as TensorBoardWriter::series takes them) at the iterations `interval`
// divides, in each group but validation/ and test/ (whose rows are evaluations, all kept).
std::map<std::string, std::vector<double>> every_nth_iteration(const std::map<std::string, std::vector<double>>& columns,
                                                               int64_t interval);

}  // namespace megabatch::train
