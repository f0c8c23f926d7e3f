// DirLock: one writer per directory. Two processes writing one directory (two `train` runs
// given one --run-dir or --save, a sweep started again while it still runs) would interleave
// their logs and overwrite each other's metrics and checkpoints, and both would say they
// finished; the second is refused instead, naming the first.
//
// An flock(2) on DIR/.megabatch.lock, held while the object lives. The kernel releases it
// when the process ends however it ends (kill -9 included), so a crash never leaves a stale
// lock to clean up. The file says who holds it, for the refusal's message.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace megabatch {

class DirLock {
 public:
  // Creates DIR if needed and takes its lock for `holder` ("train", "sweep run"), or throws
  // Error: "DIR is in use by <holder> (pid P on host H since T): <advice>". A holder on this
  // host is alive (the kernel frees a dead one's lock at once), so that refusal is immediate;
  // a holder on another host sharing DIR over a network filesystem may be a node that died,
  // whose lock the file server keeps until its lease runs out (a requeued Slurm job on a new
  // node), so that one is waited for, up to `other_host_wait_s`, saying so once on stderr.
  // On a filesystem without file locks it holds nothing and held() says so.
  DirLock(const std::filesystem::path& dir, std::string_view holder, std::string_view advice,
          int other_host_wait_s = 180);
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock();

  bool held() const { return fd_ >= 0; }
  static constexpr const char* kFile = ".megabatch.lock";

 private:
  int fd_ = -1;
};

}  // namespace megabatch
