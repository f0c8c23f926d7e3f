// TensorBoard event files (train --tensorboard-dir, sweep export --tensorboard): scalars
// as Event/Summary protocol buffers (core/io/tensorboard_event.proto, serialized by the
// protobuf library) in TFRecord framing: per record a little-endian uint64 length, the
// masked CRC32C of those 8 bytes, the data, the masked CRC32C of the data.
//
// One writer makes one file, DIR/events.out.tfevents.<unix time>.<host>.<pid>.megabatch,
// whose first record carries the file version "brain.Event:2" as TensorFlow's writer does.
// Records are appended and flushed to the OS at each flush(): a killed run leaves every
// flushed record readable (a reader stops at a torn last record).
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace megabatch::io {

// CRC32C (Castagnoli) of `n` bytes, and TensorFlow's masking of it for TFRecords.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One scalar event; wall_time in seconds since the epoch (< 0: now).
  void scalar(const std::string& tag, int64_t step, double value, double wall_time = -1);
  // Series as read_metric_series gives them ("train/iteration", "train/lm_loss",
  // "optimizer/trust_ratio/<tensor>", ...): each series other than a group's iteration
  // becomes the tag of the same name, its rows at the steps of "<group>/iteration" (group:
  // the name's first component; rows `first` on).
  void series(const std::map<std::string, std::vector<double>>& columns, size_t first = 0, double wall_time = -1);
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  void record(const std::string& data);
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace megabatch::io
