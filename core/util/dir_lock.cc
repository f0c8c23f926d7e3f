#include "core/util/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <iostream>
#include <utility>

#include "core/util/error.h"
#include "core/util/files.h"

namespace megabatch {

namespace fs = std::filesystem;

namespace {

std::string this_host() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

// "train (pid 123 on host h since 2026-11-25 15:10:02 UTC)"
std::string describe_self(std::string_view holder) {
  char when[32] = {};
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
  return std::string(holder) + " (pid " + std::to_string(::getpid()) + " on host " + this_host() + " since " + when + ")";
}

// The holder's description in the lock file, and its host ("" where the file does not say).
std::pair<std::string, std::string> read_holder(const fs::path& file) {
  std::string who = read_file_tail(file, 512);
  while (!who.empty() && (who.back() == '\n' || who.back() == '\r')) who.pop_back();
  const size_t on = who.find(" on host "), since = who.find(" since ");
  std::string host = on != std::string::npos && since != std::string::npos && since > on
                         ? who.substr(on + 9, since - on - 9)
                         : std::string();
  return {who.empty() ? std::string("another process") : who, host};
}

}  // namespace

DirLock::DirLock(const fs::path& dir, std::string_view holder, std::string_view advice, int other_host_wait_s) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(dir.string(), ": cannot create the directory (", ec.message(), ")");
  const fs::path file = dir / kFile;
  // O_CLOEXEC: the processes this one starts (a sweep's points) do not inherit the lock
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail(file.string(), ": cannot open the directory's lock file (", std::strerror(errno), ")");
  int waited_s = 0;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e == EINTR) continue;
    if (e != EWOULDBLOCK) {
      ::close(fd);
      if (e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS) return;  // no locks on this filesystem: held() is false
      fail(file.string(), ": cannot lock (", std::strerror(e), ")");
    }
    const auto [who, host] = read_holder(file);
    if (host.empty() || host == this_host() || waited_s >= other_host_wait_s) {
      ::close(fd);
      fail(dir.string(), " is in use by ", who, waited_s ? " (waited " + std::to_string(waited_s) + " s)" : "", ": ",
           advice);
    }
    if (waited_s == 0)
      std::cerr << "> " << dir.string() << " is locked by " << who << ": waiting up to " << other_host_wait_s
                << " s for it to end (a node that died keeps its locks on a network filesystem until the server "
                   "lets them go)"
                << std::endl;
    ::sleep(1);
    ++waited_s;
  }
  fd_ = fd;
  const std::string me = describe_self(holder) + "\n";
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t w = ::pwrite(fd_, me.data(), me.size(), 0);  // the message only: best effort
  }
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
}

}  // namespace megabatch
