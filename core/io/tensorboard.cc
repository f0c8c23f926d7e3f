#include "core/io/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/io/tensorboard_event.pb.h"
#include "core/util/error.h"

namespace megabatch::io {
namespace fs = std::filesystem;

namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;  // reversed Castagnoli polynomial
    t[i] = c;
  }
  return t;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

TensorBoardWriter::TensorBoardWriter(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  check(!ec, dir.string(), ": cannot create the TensorBoard directory (", ec.message(), ")");
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const auto t = static_cast<long long>(now_seconds());
  path_ = dir / ("events.out.tfevents." + std::to_string(t) + "." + host + "." + std::to_string(getpid()) + ".megabatch");
  file_ = std::fopen(path_.c_str(), "wb");
  check(file_ != nullptr, path_.string(), ": cannot write the TensorBoard event file (", std::strerror(errno), ")");
  tensorboard::Event e;
  e.set_wall_time(now_seconds());
  e.set_file_version("brain.Event:2");
  record(e.SerializeAsString());
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::record(const std::string& data) {
  unsigned char header[12];
  const uint64_t n = data.size();
  for (int i = 0; i < 8; ++i) header[i] = static_cast<unsigned char>(n >> (8 * i));  // little-endian
  const uint32_t len_crc = masked_crc32c(header, 8);
  for (int i = 0; i < 4; ++i) header[8 + i] = static_cast<unsigned char>(len_crc >> (8 * i));
  const uint32_t data_crc = masked_crc32c(data.data(), data.size());
  unsigned char footer[4];
  for (int i = 0; i < 4; ++i) footer[i] = static_cast<unsigned char>(data_crc >> (8 * i));
  const bool ok = std::fwrite(header, 1, 12, file_) == 12 && std::fwrite(data.data(), 1, data.size(), file_) == data.size() &&
                  std::fwrite(footer, 1, 4, file_) == 4;
  check(ok, path_.string(), ": cannot write a TensorBoard record (", std::strerror(errno), ")");
}

void TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value, double wall_time) {
  tensorboard::Event e;
  e.set_wall_time(wall_time < 0 ? now_seconds() : wall_time);
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  record(e.SerializeAsString());
}

void TensorBoardWriter::series(const std::map<std::string, std::vector<double>>& columns, size_t first,
                               double wall_time) {
  for (const auto& [name, values] : columns) {  // a series' steps: "<group>/iteration", group its first component
    const auto slash = name.find('/');
    if (slash == std::string::npos) continue;
    const auto steps = columns.find(name.substr(0, slash) + "/iteration");
    if (steps == columns.end() || steps->first == name) continue;
    const std::vector<double>& s = steps->second;
    for (size_t r = first; r < values.size() && r < s.size(); ++r)
      if (std::isfinite(s[r])) scalar(name, static_cast<int64_t>(s[r]), values[r], wall_time);
  }
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0)  // errno read after the call, not among check's arguments
    fail(path_.string(), ": cannot write the TensorBoard event file (", std::strerror(errno), ")");
}

}  // namespace megabatch::io
