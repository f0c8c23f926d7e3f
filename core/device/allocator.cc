#include "core/device/allocator.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "core/device/runtime.h"
#include "core/util/error.h"

namespace megabatch {

size_t CachingAllocator::size_class(size_t bytes) {
  if (bytes == 0) bytes = 1;
  constexpr size_t kSmall = size_t{1} << 20;
  if (bytes <= kSmall) return (bytes + 511) / 512 * 512;
  const size_t step = std::bit_ceil(bytes) / 8;
  return (bytes + step - 1) / step * step;
}

CachingAllocator::~CachingAllocator() {
  // Process exit: blocks still in use belong to static tensors; the driver reclaims them.
  try {
    release_cached();
  } catch (...) {
  }
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t size = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = cached_.find(size); it != cached_.end()) {
    void* p = it->second;
    cached_.erase(it);
    in_use_.emplace(p, size);
    in_use_bytes_ += size;
    max_in_use_bytes_ = std::max(max_in_use_bytes_, in_use_bytes_);
    return p;
  }
  void* p = nullptr;
  try {
    p = runtime::raw_alloc(device_, size);
  } catch (const Error&) {
    if (cached_.empty()) throw;
    for (auto& [s, q] : cached_) runtime::raw_free(device_, q, s);  // out of memory: give the cache back, try again
    cached_.clear();
    p = runtime::raw_alloc(device_, size);
  }
  in_use_.emplace(p, size);
  in_use_bytes_ += size;
  max_in_use_bytes_ = std::max(max_in_use_bytes_, in_use_bytes_);
  return p;
}

void CachingAllocator::free(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_use_.find(p);
  if (it == in_use_.end()) return;
  in_use_bytes_ -= it->second;
  cached_.emplace(it->second, p);
  in_use_.erase(it);
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [s, p] : cached_) runtime::raw_free(device_, p, s);
  cached_.clear();
}

size_t CachingAllocator::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_bytes_;
}

size_t CachingAllocator::max_bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return max_in_use_bytes_;
}

namespace {
// The CPU's tensor memory (device_alloc_zeroed's blocks): now, and the most at once.
std::atomic<size_t> g_cpu_in_use{0}, g_cpu_peak{0};

void count_cpu_alloc(void* p) {
  const size_t now = g_cpu_in_use += malloc_usable_size(p);
  size_t peak = g_cpu_peak.load();
  while (now > peak && !g_cpu_peak.compare_exchange_weak(peak, now)) {
  }
}
}  // namespace

CachingAllocator& allocator(Device d) {
  static std::mutex mu;
  // Deliberately never destroyed: tensors with static lifetime free into it at exit.
  static auto* per_gpu = new std::vector<std::unique_ptr<CachingAllocator>>();
  std::lock_guard<std::mutex> lock(mu);
  check(d.is_cuda(), "internal error: the caching allocator serves GPUs; CPU memory is allocated directly");
  if (per_gpu->size() <= static_cast<size_t>(d.index)) per_gpu->resize(static_cast<size_t>(d.index) + 1);
  auto& a = (*per_gpu)[static_cast<size_t>(d.index)];
  if (!a) a = std::make_unique<CachingAllocator>(d);
  return *a;
}

void* device_alloc_zeroed(Device d, size_t bytes) {
  if (d.is_cpu()) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, rounded == 0 ? 64 : rounded);
    count_cpu_alloc(p);
    return p;
  }
  void* p = allocator(d).allocate(bytes);
  runtime::fill_zero(p, d, bytes);
  return p;
}

void device_free(Device d, void* p) {
  if (d.is_cpu()) {
    if (p) g_cpu_in_use -= malloc_usable_size(p);
    std::free(p);
  } else {
    allocator(d).free(p);
  }
}

TensorMemory tensor_memory(Device d) {
  if (d.is_cpu()) return {g_cpu_in_use.load(), g_cpu_peak.load()};
  const CachingAllocator& a = allocator(d);
  return {a.bytes_in_use(), a.max_bytes_in_use()};
}

}  // namespace megabatch
