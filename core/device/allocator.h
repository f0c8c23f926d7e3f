// One caching allocator per device: the memory of every tensor on a GPU comes from it, so
// that a training step, which allocates the same sizes every time, never calls cudaMalloc
// or cudaFree once the first step has run. Freed blocks are kept in a cache by size and
// handed out again for requests of the same size class; when the device is out of memory
// the cache is returned to the device and the allocation retried once.
//
// CPU memory is allocated directly (64-byte aligned): the C library already caches, and a
// CPU run's peak RSS stays what the tensors need.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/device/device.h"

namespace megabatch {

class CachingAllocator {
 public:
  explicit CachingAllocator(Device d) : device_(d) {}
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // At least `bytes` (rounded up to its size class), aligned to 256 bytes. Not zeroed.
  void* allocate(size_t bytes);
  void free(void* p);
  // Returns every cached (unused) block to the device.
  void release_cached();
  size_t bytes_in_use() const;
  size_t max_bytes_in_use() const;  // the most in use at once since start

  // The size class of a request: multiples of 512 bytes up to 1 MiB, then multiples of
  // 1/8 of the next power of two (so a cached block wastes at most 12.5%).
  static size_t size_class(size_t bytes);

 private:
  Device device_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cached_;       // free blocks by size
  std::unordered_map<void*, size_t> in_use_;  // live blocks and their sizes
  size_t in_use_bytes_ = 0, max_in_use_bytes_ = 0;
};

// The process-wide allocator of a device (created on first use).
CachingAllocator& allocator(Device d);

// Tensor memory: zero-filled, from the device's allocator (CPU: aligned_alloc).
void* device_alloc_zeroed(Device d, size_t bytes);
void device_free(Device d, void* p);

// The tensor memory of device d now and at most at once since the process started (PyTorch's
// memory_allocated and max_memory_allocated): on a GPU the caching allocator's blocks in use
// (at their size classes); on the CPU the blocks device_alloc_zeroed holds (by
// malloc_usable_size), for every CPU tensor of the process.
struct TensorMemory {
  size_t in_use = 0, peak = 0;
};
TensorMemory tensor_memory(Device d);

}  // namespace megabatch
