// metrics.h5: the run's resolved configuration as attributes of the root group (and
// the whole config as JSON text in attribute "config"), and extendible 1-D series in
// groups ("train/lm_loss", "validation/lm_loss", ...), one value per logged row.
//
// Rows are buffered and written by flush(), which opens the file, appends, and closes it
// again: between flushes the file on disk is complete and readable by anything (h5py,
// h5dump), so a killed run keeps every flushed row and loses at most one interval.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace megabatch::io {

class MetricsFile {
 public:
  // Creates (replacing) the file and writes the configuration attributes.
  MetricsFile(std::filesystem::path path, const nlohmann::json& config);
  ~MetricsFile();  // flushes; errors there are swallowed (call flush() to see them)
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  // Appends one value to series "group/name".
  void append(const std::string& series, double value);
  // Writes buffered values. Error naming the file on failure (disk full, removed, ...).
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::map<std::string, std::vector<double>> pending_;
};

}  // namespace megabatch::io
