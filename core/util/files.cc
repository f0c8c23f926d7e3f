#include "core/util/files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "core/util/error.h"

namespace megabatch {

namespace fs = std::filesystem;

MappedFile::MappedFile(const fs::path& path) : path_(path) {
  // A FIFO or a device would block the open or never end: only regular files are read.
  struct stat pre {};
  if (::stat(path.c_str(), &pre) == 0 && !S_ISREG(pre.st_mode))
    fail(path.string(), ": not a regular file (", S_ISFIFO(pre.st_mode) ? "a FIFO" : S_ISDIR(pre.st_mode) ? "a directory" : "a device or socket",
         "); give the path of a file on disk");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(path.string(), ": cannot open (", std::strerror(errno), ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail(path.string(), ": cannot stat (", std::strerror(e), ")");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      fail(path.string(), ": cannot mmap ", size_, " bytes (", std::strerror(e), ")");
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { reset(); }

void MappedFile::reset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

std::string read_file(const fs::path& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))  // a FIFO or device would block or never end
    fail(path.string(), ": not a regular file; give the path of the ", what);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path.string(), ": cannot open ", what, " (", std::strerror(errno), ")");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(path.string(), ": error while reading ", what);
  return ss.str();
}

std::string read_file_tail(const fs::path& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  if (size < 0) return "";
  const std::streamoff from = size > static_cast<std::streamoff>(bytes) ? size - static_cast<std::streamoff>(bytes) : 0;
  in.seekg(from);
  std::string s(static_cast<size_t>(size - from), '\0');
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

std::optional<CommandOutput> read_command(const std::string& command) {
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return std::nullopt;
  CommandOutput out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.text.append(buf, n);
  const int rc = ::pclose(pipe);
  out.status = rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

AtomicFile::AtomicFile(fs::path path) : path_(std::move(path)) {
  tmp_ = path_;
  tmp_ += ".tmp";
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(tmp_.string(), ": cannot create (", std::strerror(errno), ")");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) {
    std::error_code ec;
    fs::remove(tmp_, ec);
  }
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(tmp_.string(), ": write failed after ", written_, " bytes (", std::strerror(errno),
           "); free space on the disk and re-run");
    }
    p += w;
    n -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail(tmp_.string(), ": fsync failed (", std::strerror(errno), ")");
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail(tmp_.string(), ": close failed (", std::strerror(errno), ")");
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    fail(path_.string(), ": cannot rename ", tmp_.string(), " into place (", std::strerror(errno), ")");
  committed_ = true;
}

void write_file_atomic(const fs::path& path, std::string_view text) {
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

fs::path program_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

fs::path asset_dir() {
  if (const char* env = std::getenv("MEGABATCH_ASSETS"); env != nullptr && *env != '\0') return env;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return fs::path(xdg) / "megabatch";
  const char* home = std::getenv("HOME");
  return fs::path(home != nullptr ? home : "/root") / ".cache" / "megabatch";
}

fs::path asset_path(std::string_view relative) {
  fs::path p = asset_dir() / relative;
  if (!fs::exists(p))
    fail(p.string(), ": asset not found; run ./setup.sh to install the data assets ",
         "(or set MEGABATCH_ASSETS to the folder that holds them)");
  return p;
}

}  // namespace megabatch
