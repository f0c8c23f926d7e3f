// File helpers: read-only memory maps, whole-file reads, atomic writes, the asset cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace megabatch {

// A read-only memory map of a whole file. Move-only; unmaps on destruction.
//
// A file that shrinks while it is mapped (truncated, or rewritten in place, under a running
// job) makes a read past its new end raise SIGBUS. Every mapping is registered with a
// SIGBUS handler: inside read_guarded() the read becomes an Error naming the file; anywhere
// else the process prints that error and exits 1, instead of dying of a signal.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::filesystem::path& path);  // throws Error naming the path
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

  // Runs read(), which reads this mapping; a SIGBUS inside it (the file shrank) is an Error
  // "<path>: the file is shorter than when it was opened (...)". read() must leave nothing to
  // clean up when it is cut short (it copies bytes out; it may throw).
  template <typename Fn>
  void read_guarded(Fn&& read) const {
    guarded_call([](void* f) { (*static_cast<std::remove_reference_t<Fn>*>(f))(); }, &read);
  }

 private:
  void guarded_call(void (*fn)(void*), void* ctx) const;
  void reset();
  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int slot_ = -1;  // in the SIGBUS handler's table of mappings
};

// The whole file as bytes; throws Error naming the path when it cannot be read.
std::string read_file(const std::filesystem::path& path, std::string_view what = "file");

// The last `bytes` bytes of a file (all of it when shorter); "" when it cannot be read (a
// log that is not there yet).
std::string read_file_tail(const std::filesystem::path& path, size_t bytes);

// What a shell command wrote to its stdout, and its exit status (-1 where it did not exit
// normally); none where it could not be started.
struct CommandOutput {
  std::string text;
  int status = -1;
};
std::optional<CommandOutput> read_command(const std::string& command);

// Writes to PATH.tmp, flushes it to disk and renames it over PATH, so a reader (or a
// crash) only ever sees the old or the complete new file.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // removes the temporary file unless commit() ran

  void write(const void* data, size_t n);
  void commit();  // fsync + rename; throws Error on failure (disk full names the path)
  const std::filesystem::path& path() const { return path_; }
  uint64_t bytes_written() const { return written_; }

 private:
  std::filesystem::path path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

// parent/1, parent/2, ...: the first that does not exist (where earlier runs' files are kept).
std::filesystem::path first_free_numbered(const std::filesystem::path& parent);

// Whether p is a directory itself, not a symlink to one (what a tool that deletes may enter).
bool is_real_dir(const std::filesystem::path& p);

// `text` as the whole of PATH, through an AtomicFile.
void write_file_atomic(const std::filesystem::path& path, std::string_view text);

// Calls fn(line, line_number) for each line of text (numbered from 1, without the '\n'
// and a trailing '\r'); a final line without '\n' counts, an empty text has no lines.
template <typename Fn>
void for_each_line(std::string_view text, Fn&& fn) {
  size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos = eol + 1;
    fn(line, ++line_no);
  }
}

// The directory of the running program (build/bin, or PREFIX/bin installed), where its
// sibling programs are and from which ../lib and ../share are found; empty when
// /proc/self/exe cannot be read.
std::filesystem::path program_dir();

// The asset cache that setup.sh fills: $MEGABATCH_ASSETS, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/megabatch.
std::filesystem::path asset_dir();
// asset_dir() / relative, or an Error that says to run ./setup.sh when it is missing.
std::filesystem::path asset_path(std::string_view relative);

}  // namespace megabatch
