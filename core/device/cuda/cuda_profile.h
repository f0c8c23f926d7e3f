// The CUDA side of core/device/profile.h: CUPTI's activity records, implemented in
// cuda/profile.cc (CUDA builds only). Plain C++: profile.cc calls it through MB_CUDA(...).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace megabatch::cuda_profile {

struct Activity {
  uint64_t begin = 0, end = 0;  // ns, CUPTI's clock (timestamp())
  uint32_t correlation = 0;     // of the API call that issued it
  bool copy = false;            // memset or memcpy
  std::string name;             // the kernel's (demangled), "memset" or "memcpy"
};
struct Collected {
  std::vector<Activity> activities;
  std::unordered_map<uint32_t, uint64_t> external;  // correlation id -> the id pushed then
  uint64_t dropped = 0;
};

// A kernel's demangled name, shortened to what a reader needs (cuda/profile.cc).
std::string short_kernel_name(std::string demangled);

// Starts recording kernels, memsets, memcpys and external correlations (an Error with
// CUPTI's message where it cannot, e.g. another profiler holds the device).
void start();
// Ends recording and returns everything recorded since start().
Collected stop();
uint64_t timestamp();
// The id every CUDA call issued by this thread carries until pop().
void push(uint64_t id);
void pop();

}  // namespace megabatch::cuda_profile
