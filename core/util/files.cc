#include "core/util/files.h"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <utility>

#include "core/util/error.h"

namespace megabatch {

namespace fs = std::filesystem;

// ---- SIGBUS from a mapped file that shrank -------------------------------------------
namespace {

// The mappings the handler knows: a fixed table (the handler may neither lock nor
// allocate); a slot is free while its begin is null.
struct MappedRange {
  std::atomic<const uint8_t*> begin{nullptr};
  std::atomic<size_t> size{0};
  char path[1024] = {};
};
constexpr int kMappedSlots = 256;
MappedRange g_mapped[kMappedSlots];
thread_local sigjmp_buf* t_guard = nullptr;  // set inside MappedFile::guarded_call
thread_local int t_fault_slot = -1;

int mapped_slot_of(const void* address) {
  const auto* a = static_cast<const uint8_t*>(address);
  for (int i = 0; i < kMappedSlots; ++i) {
    const uint8_t* b = g_mapped[i].begin.load(std::memory_order_acquire);
    if (b && a >= b && a < b + g_mapped[i].size.load(std::memory_order_relaxed)) return i;
  }
  return -1;
}

extern "C" void on_sigbus(int sig, siginfo_t* info, void*) {
  const int slot = mapped_slot_of(info->si_addr);
  if (slot >= 0 && t_guard) {
    t_fault_slot = slot;
    siglongjmp(*t_guard, 1);
  }
  if (slot >= 0) {  // outside a guarded read: say which file, and end as an error (status 1)
    const char* head = "error: ";
    const char* tail =
        ": the file became shorter while this process read it (truncated or rewritten in place); restore it, or "
        "write a new dataset under another name, and start again\n";
    (void)!::write(2, head, std::strlen(head));
    (void)!::write(2, g_mapped[slot].path, std::strlen(g_mapped[slot].path));
    (void)!::write(2, tail, std::strlen(tail));
    ::_exit(1);
  }
  ::signal(sig, SIG_DFL);  // not ours: the default action when the access repeats
}

int register_mapping(const uint8_t* data, size_t size, const fs::path& path) {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return ::sigaction(SIGBUS, &sa, nullptr) == 0;
  }();
  static std::mutex slots;
  if (!installed || data == nullptr) return -1;
  std::lock_guard<std::mutex> lock(slots);
  for (int i = 0; i < kMappedSlots; ++i) {
    if (g_mapped[i].begin.load(std::memory_order_relaxed) != nullptr) continue;
    std::snprintf(g_mapped[i].path, sizeof g_mapped[i].path, "%s", path.c_str());
    g_mapped[i].size.store(size, std::memory_order_relaxed);
    g_mapped[i].begin.store(data, std::memory_order_release);
    return i;
  }
  return -1;  // more than kMappedSlots mappings at once: the rest are not guarded
}

}  // namespace

void MappedFile::guarded_call(void (*fn)(void*), void* ctx) const {
  sigjmp_buf here;
  sigjmp_buf* const outer = t_guard;
  if (sigsetjmp(here, 1) != 0) {  // a SIGBUS in one of the mappings
    t_guard = outer;
    std::error_code ec;
    const auto now = fs::file_size(path_, ec);
    const int slot = t_fault_slot;
    fail(slot >= 0 ? g_mapped[slot].path : path_.c_str(), ": the file is shorter than when this run opened it (",
         size_, " bytes then, ", ec ? std::string("unreadable") : std::to_string(now) + " now",
         "): it was truncated or rewritten in place while the run read it; restore it, or write a new dataset under "
         "another name, and start again");
  }
  t_guard = &here;
  try {
    fn(ctx);
  } catch (...) {
    t_guard = outer;
    throw;
  }
  t_guard = outer;
}

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
    slot_ = register_mapping(data_, size_, path_);
  }
  ::close(fd);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)), slot_(std::exchange(other.slot_, -1)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    slot_ = std::exchange(other.slot_, -1);
  }
  return *this;
}

MappedFile::~MappedFile() { reset(); }

void MappedFile::reset() {
  if (slot_ >= 0) g_mapped[slot_].begin.store(nullptr, std::memory_order_release);
  slot_ = -1;
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
  // what the user gave, and what to do, before the temporary file's name (which they did not give)
  std::error_code ec;
  if (fs::is_directory(path_, ec)) fail(path_.string(), ": is a directory; give the path of a file to write");
  const fs::path dir = path_.parent_path();
  if (!dir.empty() && !fs::is_directory(dir, ec))
    fail(path_.string(), ": cannot write it: ", dir.string(),
         fs::exists(dir, ec) ? " is not a directory" : " does not exist; create it first");
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    fail(path_.string(), ": cannot create its temporary file ", tmp_.string(), " (", std::strerror(errno), ")");
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

std::filesystem::path first_free_numbered(const std::filesystem::path& parent) {
  std::filesystem::path p;
  for (int n = 1; std::filesystem::exists(p = parent / std::to_string(n)); ++n) {
  }
  return p;
}

bool is_real_dir(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::symlink_status(p, ec).type() == std::filesystem::file_type::directory;
}

}  // namespace megabatch
