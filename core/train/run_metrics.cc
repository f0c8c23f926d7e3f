#include "core/train/run_metrics.h"

namespace megabatch::train {

RunMetrics open_metrics(const std::filesystem::path& file, const nlohmann::json& resolved,
                        std::optional<int64_t> resume_after, const std::string& tensorboard_dir) {
  RunMetrics m;
  m.metrics = resume_after ? std::make_unique<io::MetricsFile>(file, resolved, *resume_after)
                           : std::make_unique<io::MetricsFile>(file, resolved);
  if (!tensorboard_dir.empty()) {
    m.tensorboard = std::make_unique<io::TensorBoardWriter>(tensorboard_dir);
    m.metrics->on_flush([tb = m.tensorboard.get()](const std::map<std::string, std::vector<double>>& rows) {
      tb->series(rows);
      tb->flush();
    });
  }
  return m;
}

}  // namespace megabatch::train
