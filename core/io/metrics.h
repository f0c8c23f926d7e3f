// metrics.h5: the run's resolved configuration as attributes of the root group (and
// the whole config as JSON text in attribute "config"), extendible 1-D series in groups
// ("train/lm_loss", "validation/lm_loss", ...), one value per logged row, and extendible
// 2-D series (rows x columns, e.g. "optimizer/trust_ratio": logged step x tensor) with
// string datasets beside them naming the columns ("optimizer/tensor_names").
//
// The file is built in memory (HDF5's core driver) and flush() writes its whole image to
// PATH.tmp, fsyncs it and renames it over PATH: the file on disk is always complete, so a
// run killed at any instant (kill -9 included) leaves a metrics.h5 that any HDF5 reader
// opens, with every interval flushed before the kill; a reader may open it while the run
// writes (it sees the last flush); a full disk is an error naming the file, with the
// previous version intact. A stale PATH.tmp is removed at the next start. (A flush writes
// the whole file, a few MB for a long run with diagnostics: cheap next to an interval.)
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace megabatch::io {

// "sop loss" -> "sop_loss": the metrics.h5 series of a console loss name.
inline std::string series_name(std::string name) {
  for (char& c : name)
    if (c == ' ') c = '_';
  return name;
}

class MetricsFile {
 public:
  // Creates (replacing) the file and writes the configuration attributes.
  MetricsFile(std::filesystem::path path, const nlohmann::json& config);
  // For a run resumed from a checkpoint at iteration `resume_after`: keeps an existing
  // file, drops the rows of every series group (train/, validation/, ...) whose
  // "iteration" is later than resume_after (written after the checkpoint by the run that
  // stopped), and rewrites the configuration attributes. Creates the file when missing.
  MetricsFile(std::filesystem::path path, const nlohmann::json& config, int64_t resume_after);
  ~MetricsFile();  // flushes; errors there are swallowed (call flush() to see them)
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  // Appends one value to series "group/name".
  void append(const std::string& series, double value);
  // Appends one row to 2-D series "group/name"; every row of a series has the same width.
  void append_row(const std::string& series, const std::vector<double>& row);
  // Writes a 1-D string dataset once (e.g. column names); later calls with the same
  // name must give the same strings.
  void set_strings(const std::string& name, const std::vector<std::string>& values);
  // Writes buffered values. Error naming the file on failure (disk full, ...).
  void flush();
  // Called at each flush with the new rows of every series ("train/lm_loss": values
  // appended since the last flush; a 2-D series a column each, named as
  // read_metric_series names them), e.g. to mirror them into TensorBoard.
  using Listener = std::function<void(const std::map<std::string, std::vector<double>>&)>;
  void on_flush(Listener listener) { listener_ = std::move(listener); }
  const std::filesystem::path& path() const { return path_; }

 private:
  void persist();  // the in-memory file's image to disk, atomically

  std::filesystem::path path_;
  int64_t file_ = -1;          // hid_t of the in-memory file
  std::vector<char> image_;    // reused between flushes
  struct Pending {
    size_t width = 0;  // 0: a 1-D series; otherwise the row width of a 2-D series
    std::vector<double> values;
  };
  std::map<std::string, Pending> pending_;
  std::map<std::string, std::vector<std::string>> strings_;  // written once, at the next flush
  std::map<std::string, std::vector<std::string>> written_strings_;
  std::set<std::string> kept_strings_;  // present in a continued file
  Listener listener_;
};

// Every numeric series of a metrics.h5, for exports: 1-D ones as they are ("train/lm_loss"
// -> values), 2-D ones a column each, named by the group's tensor_names
// ("optimizer/trust_ratio/embedding.word_embeddings.weight" -> values; the column index
// where the names are missing). A series' steps are "<group>/iteration" (group: the name's
// first component).
std::map<std::string, std::vector<double>> read_metric_series(const std::filesystem::path& path);

// Why the metrics.h5 at `path` cannot be read back, as a message that starts with the path
// ("" where every series reads): missing, not HDF5, cut short (a copy that stopped), a series
// whose values do not read. Cheap: it reads each series' last value, not the whole file.
std::string metrics_unreadable(const std::filesystem::path& path);

}  // namespace megabatch::io
