#include "core/device/runtime.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

#include "core/device/allocator.h"
#include "core/device/dispatch.h"
#include "core/util/error.h"
#if MEGABATCH_WITH_CUDA
#include "core/device/cuda/cuda_runtime.h"
#endif

namespace megabatch {

void fail_no_cuda() {
  fail("this megabatch was built without CUDA: configure where nvcc is found (or with "
       "-DMEGABATCH_CUDA=ON -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc) and rebuild, or run with --device cpu");
}

}  // namespace megabatch

namespace megabatch::runtime {

bool built_with_cuda() { return MEGABATCH_WITH_CUDA != 0; }

int cuda_device_count() {
#if MEGABATCH_WITH_CUDA
  return cuda_rt::device_count();
#else
  return 0;
#endif
}

GpuInfo gpu_info([[maybe_unused]] int index) {
  MB_CUDA(return cuda_rt::gpu_info(index));
}

namespace {
// A number from a file (the first on its line after `key`, or the whole file when key is
// empty); nullopt when the file or key is missing or says "max".
std::optional<size_t> read_number(const char* file, const std::string& key, size_t unit) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (!key.empty() && line.rfind(key, 0) != 0) continue;
    std::istringstream ss(key.empty() ? line : line.substr(key.size()));
    size_t v = 0;
    if (ss >> v) return v * unit;
    return std::nullopt;
  }
  return std::nullopt;
}
}  // namespace

AvailableMemory available_memory(Device d) {
  AvailableMemory m;
  if (d.is_cuda()) {
    MB_CUDA(m.bytes = cuda_rt::free_memory(d.index); m.source = "free on " + d.str() + " (cudaMemGetInfo)"; return m);
  }
  const auto avail = read_number("/proc/meminfo", "MemAvailable:", 1024);
  m.bytes = avail.value_or(std::numeric_limits<size_t>::max());
  m.source = "MemAvailable in /proc/meminfo";
  const auto limit = read_number("/sys/fs/cgroup/memory.max", "", 1), used = read_number("/sys/fs/cgroup/memory.current", "", 1);
  if (limit && used && *limit > *used && *limit - *used < m.bytes) {
    m.bytes = *limit - *used;
    m.source = "the cgroup's memory.max less memory.current";
  }
  return m;
}

void* raw_alloc(Device d, [[maybe_unused]] size_t bytes) {
  if (d.is_cpu()) fail("internal error: raw_alloc is for GPUs");
  MB_CUDA(return cuda_rt::raw_alloc(d.index, bytes));
}

void raw_free(Device d, [[maybe_unused]] void* p, [[maybe_unused]] size_t bytes) {
  if (d.is_cpu()) return;
  MB_CUDA(cuda_rt::raw_free(d.index, p, bytes));
}

namespace {
std::atomic<int64_t> g_host_reads{0};
}  // namespace

void copy_bytes(void* dst, Device to, const void* src, Device from, size_t bytes) {
  if (bytes == 0) return;
  if (to.is_cpu() && from.is_cpu()) {
    std::memmove(dst, src, bytes);
    return;
  }
  if (to.is_cpu()) ++g_host_reads;
  if (to.is_cuda() && from.is_cuda() && to.index != from.index)
    fail("copy between GPUs ", from.str(), " and ", to.str(), " is not supported");
  MB_CUDA(cuda_rt::copy_bytes(dst, src, bytes, to.is_cuda() ? to.index : from.index,
                              from.is_cpu() ? 0 : to.is_cpu() ? 1 : 2));
}

void read_back(void* host_dst, const void* src, Device d, size_t bytes) {
  if (bytes == 0) return;
  if (d.is_cpu()) ++g_host_reads;  // (copy_bytes counts a GPU's)
  copy_bytes(host_dst, Device::cpu(), src, d, bytes);
}

int64_t host_reads() { return g_host_reads.load(); }

void fill_zero(void* p, Device d, size_t bytes) {
  if (bytes == 0) return;
  if (d.is_cpu()) {
    std::memset(p, 0, bytes);
    return;
  }
  MB_CUDA(cuda_rt::fill_zero(p, d.index, bytes));
}

void synchronize(Device d) {
  if (d.is_cpu()) return;
  MB_CUDA(cuda_rt::synchronize(d.index));
}

void use_device(Device d) {
  if (d.is_cpu()) return;
  MB_CUDA(cuda_rt::use_device(d.index));
}

void* cuda_stream(Device d) {
  if (d.is_cpu()) return nullptr;
  MB_CUDA(return cuda_rt::stream(d.index));
}

Readback::Readback(Device d, size_t bytes) : device_(d), bytes_(bytes) {
  if (d.is_cpu()) {
    host_ = std::malloc(bytes ? bytes : 1);
    return;
  }
  MB_CUDA(host_ = cuda_rt::pinned_alloc(bytes ? bytes : 1); event_ = cuda_rt::event_create());
}

Readback::~Readback() {
  if (device_.is_cpu()) {
    std::free(host_);
    return;
  }
#if MEGABATCH_WITH_CUDA
  cuda_rt::pinned_free(host_);
  cuda_rt::event_destroy(event_);
#endif
}

void Readback::start(const void* src) {
  pending_ = true;
  if (device_.is_cpu()) {
    std::memcpy(host_, src, bytes_);
    return;
  }
  MB_CUDA(cuda_rt::copy_to_host_async(host_, src, bytes_, device_.index, event_));
}

const void* Readback::get() {
  check(pending_, "internal error: Readback::get() before start()");
  if (device_.is_cuda()) MB_CUDA(cuda_rt::event_wait(event_));
  return host_;
}

StreamHold::StreamHold(Device d, [[maybe_unused]] double seconds) : device_(d) {
  if (!d.is_cuda()) fail("internal error: StreamHold on ", d.str());
  MB_CUDA(hold_ = cuda_rt::hold_stream(d.index, seconds));
}

StreamHold::~StreamHold() {
  if (!hold_) return;
  try {
    release();
  } catch (const std::exception&) {
    // a failed device runs nothing more: nothing to wait for
  }
}

bool StreamHold::release() {
  check(hold_ != nullptr, "internal error: StreamHold released twice");
  void* h = hold_;
  hold_ = nullptr;
#if MEGABATCH_WITH_CUDA
  return cuda_rt::release_stream(h, device_.index);
#else
  (void)h;
  return false;
#endif
}

AllocStats alloc_stats(Device d) {
  if (d.is_cpu()) return {};
  MB_CUDA(AllocStats s = cuda_rt::alloc_stats(d.index); s.bytes_in_use = allocator(d).bytes_in_use(); return s);
}

}  // namespace megabatch::runtime
