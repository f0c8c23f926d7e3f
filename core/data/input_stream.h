// Reading a corpus file line by line, plain or compressed (gzip, xz, zstd: the format is
// recognized by its magic bytes, whatever the name), through zlib, liblzma and libzstd.
// Decompression runs in a thread of its own, a few MB ahead of the reader, so that it
// overlaps the tokenization of the lines already read. Errors (a corrupt or truncated
// stream, a read error) name the file and the compressed byte offset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace megabatch::data {

enum class Compression { kNone, kGzip, kXz, kZstd };
const char* compression_name(Compression c);
// What the file's first bytes say.
Compression detect_compression(const std::filesystem::path& path);
// The name without a compression extension (.gz, .xz, .zst): "wiki.jsonl.xz" -> "wiki.jsonl".
std::filesystem::path strip_compression_extension(const std::filesystem::path& path);

class InputStream {
 public:
  explicit InputStream(const std::filesystem::path& path);  // Error naming the path if it cannot be read
  ~InputStream();
  InputStream(const InputStream&) = delete;
  InputStream& operator=(const InputStream&) = delete;

  // The next line without its '\n' (a last line without one counts); false at the end.
  // Throws Error on a corrupt, truncated or unreadable input.
  bool getline(std::string& line);
  Compression compression() const { return compression_; }

 private:
  struct Pipe;
  bool refill();
  std::filesystem::path path_;
  Compression compression_ = Compression::kNone;
  std::unique_ptr<Pipe> pipe_;
  std::string chunk_;  // decompressed bytes being read
  size_t at_ = 0;
  bool done_ = false;
};

}  // namespace megabatch::data
