// A run's metrics: RUN_DIR/metrics.h5 (continued after the resume point's iteration when
// resuming, else new) and, with --tensorboard-dir, TensorBoard event files written from each
// flush of it.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/io/metrics.h"
#include "core/io/tensorboard.h"

namespace megabatch::train {

struct RunMetrics {
  std::unique_ptr<io::TensorBoardWriter> tensorboard;  // declared first: metrics (its listener) goes first
  std::unique_ptr<io::MetricsFile> metrics;
};

// `resume_after`: the iteration a resumed run continues from (rows after it are dropped);
// `tensorboard_dir` empty: no TensorBoard files.
RunMetrics open_metrics(const std::filesystem::path& file, const nlohmann::json& resolved,
                        std::optional<int64_t> resume_after, const std::string& tensorboard_dir);

}  // namespace megabatch::train
