// Helpers shared by the benchmark programs.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/util/args.h"

namespace megabatch::bench {

struct ChildResult {
  std::string output;     // its stdout
  long max_rss_kib = 0;   // its peak resident memory
};

// GLIBC_TUNABLES for a child whose malloc should keep what it frees: no block from mmap,
// no trimming of the heap. The PyTorch references take their CPU tensors from malloc, and
// glibc's defaults give every freed block over the mmap threshold (128 KiB and up) back
// to the kernel, so each step faults its pages in again: on the development VM (2026-11-24)
// that was three quarters of PyTorch's training step and 86-92% of its AdamW step. PyTorch's CPU
// tuning advice is an allocator that caches; this is glibc's own way to get one, so the
// reference is measured at its best and with the defaults, side by side.
inline constexpr const char* kMallocKeepsFreed = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776";
// The environment entry that sets it, for run_child.
inline std::string malloc_keeps_freed_env() { return std::string("GLIBC_TUNABLES=") + kMallocKeepsFreed; }

// Runs a program in a child process, so that its peak RSS is its own (fork, then exec
// at once: OpenMP's thread pool does not survive a fork without exec), with `env`
// ("NAME=VALUE" each) added to its environment. Throws with the child's output when it fails.
inline ChildResult run_child(std::vector<std::string> args, std::vector<std::string> env = {}) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe");
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 1);
    std::vector<char*> argv;
    for (auto& x : args) argv.push_back(x.data());
    argv.push_back(nullptr);
    for (auto& e : env) putenv(e.data());  // (env outlives the exec)
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  ChildResult r;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) r.output.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  rusage ru{};
  wait4(pid, &status, 0, &ru);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("benchmark child " + args[0] + " failed: " + r.output);
  r.max_rss_kib = ru.ru_maxrss;
  return r;
}

// A benchmark's main: runs body(), which parses and reads every flag before it touches a
// device (a typo is reported as such, not as a missing GPU, and before the minutes a run takes).
// A bad flag (FlagError: its message names the program already) exits 2, any other error 1,
// each message printed once.
template <typename Body>
int guarded_main(const std::string& program, Body body) {
  try {
    return body();
  } catch (const FlagError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << program << ": " << e.what() << "\n";
    return 1;
  }
}

// The number after "key " in a child's output.
inline double value_of(const std::string& output, const std::string& key) {
  const size_t at = output.find(key + " ");
  if (at == std::string::npos) throw std::runtime_error("benchmark child printed no '" + key + "': " + output);
  return std::stod(output.substr(at + key.size() + 1));
}

// The median of timings (the upper one of an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace megabatch::bench
