#include "core/train/run_metrics.h"

#include <cmath>

namespace megabatch::train {

std::map<std::string, std::vector<double>> every_nth_iteration(const std::map<std::string, std::vector<double>>& columns,
                                                               int64_t interval) {
  if (interval <= 1) return columns;
  std::map<std::string, std::vector<double>> kept;
  for (const auto& [name, values] : columns) {
    const std::string group = name.substr(0, name.find('/'));
    const auto steps = columns.find(group + "/iteration");
    if (group == "validation" || group == "test" || steps == columns.end()) {
      kept[name] = values;
      continue;
    }
    std::vector<double>& out = kept[name];
    for (size_t r = 0; r < values.size() && r < steps->second.size(); ++r)
      if (std::fmod(steps->second[r], static_cast<double>(interval)) == 0) out.push_back(values[r]);
  }
  return kept;
}

RunMetrics open_metrics(const std::filesystem::path& file, const nlohmann::json& resolved,
                        std::optional<int64_t> resume_after, const std::string& tensorboard_dir,
                        int64_t tensorboard_interval) {
  RunMetrics m;
  m.metrics = resume_after ? std::make_unique<io::MetricsFile>(file, resolved, *resume_after)
                           : std::make_unique<io::MetricsFile>(file, resolved);
  if (!tensorboard_dir.empty()) {
    m.tensorboard = std::make_unique<io::TensorBoardWriter>(tensorboard_dir);
    m.metrics->on_flush(
        [tb = m.tensorboard.get(), tensorboard_interval](const std::map<std::string, std::vector<double>>& rows) {
          if (tensorboard_interval > 1)
            tb->series(every_nth_iteration(rows, tensorboard_interval));
          else
            tb->series(rows);  // every row: no filtered copy
          tb->flush();
        });
  }
  return m;
}

}  // namespace megabatch::train
