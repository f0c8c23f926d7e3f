// The device runtime as the rest of megabatch sees it: memory, copies, synchronization
// and what a GPU is. Nothing here includes a CUDA header, so every file may include it;
// in a build without CUDA the CUDA side reports that it is absent (cuda_available()
// false, and any CUDA request an Error saying how to build with CUDA).
//
// Every CUDA operation of a run is issued on one stream per device (the run's stream):
// ops, copies and plugin kernels are ordered by it, and host code waits only where it
// reads results back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>
#include <string>

#include "core/device/device.h"

namespace megabatch::runtime {

// ---- what this build and machine have --------------------------------------------------
bool built_with_cuda();
// GPUs visible to this process (0 without CUDA, without a driver, or without a GPU).
int cuda_device_count();

struct GpuInfo {
  std::string name;
  int major = 0, minor = 0;  // compute capability
  size_t total_memory = 0;   // bytes
  int multiprocessors = 0;
  bool has_bf16() const { return major >= 8; }  // bf16 arithmetic: Ampere (sm_80) and later
};
GpuInfo gpu_info(int index);

// Memory a new allocation can use now, in bytes, and where that figure comes from: on the
// CPU the smaller of MemAvailable (/proc/meminfo) and the cgroup's limit less its usage;
// on a GPU what cudaMemGetInfo calls free.
struct AvailableMemory {
  size_t bytes = 0;
  std::string source;
};
AvailableMemory available_memory(Device d);

// ---- raw memory (what the caching allocator draws from) -------------------------------
void* raw_alloc(Device d, size_t bytes);  // Error (with the device and size) when out of memory
void raw_free(Device d, void* p, size_t bytes);

// ---- copies and fills, ordered on the run's stream ------------------------------------
// Copies `bytes` from src on device `from` to dst on device `to`. Host-to-device copies
// return without waiting for the device; a copy to the host waits for the device's stream
// to reach it (the data is there when the call returns).
void copy_bytes(void* dst, Device to, const void* src, Device from, size_t bytes);
void fill_zero(void* p, Device d, size_t bytes);
// Waits until everything issued on d's stream has finished (no-op on the CPU).
void synchronize(Device d);
// Makes d the calling thread's current GPU (kernels launch there); no-op for the CPU.
void use_device(Device d);

// ---- reading device values later, without waiting now ---------------------------------
// Whether the host reads d's memory in place, at no cost and with nothing to wait for (the CPU).
inline bool host_reads_directly(Device d) { return d.is_cpu(); }
// start() queues a copy of `bytes` from device memory into host memory behind everything
// issued on the device's stream so far, and returns at once; get() waits for that copy
// only (usually long finished by then). The trainer reads each step's flags one step late
// this way, so no step waits for the GPU. On the CPU the copy happens in start().
class Readback {
 public:
  Readback(Device d, size_t bytes);
  ~Readback();
  Readback(const Readback&) = delete;
  Readback& operator=(const Readback&) = delete;
  void start(const void* src);
  bool pending() const { return pending_; }
  const void* get();  // the values of the last start()

 private:
  Device device_;
  size_t bytes_;
  void* host_ = nullptr;   // pinned on a GPU
  void* event_ = nullptr;  // cudaEvent_t
  bool pending_ = false;
};

// ---- copies to the device that never wait ---------------------------------------------
// copy() puts host data into pinned memory and queues its copy to device memory on the
// device's stream, then returns: the host need not wait (a copy from pageable memory may
// make the driver synchronize with the stream first). Generations alternate: next() ends one
// (an optimizer step) and starts the next in the pinned memory of the one before, once the
// device has passed that one's copies (long since, unless the host runs two generations
// ahead: then it waits). On the CPU copy() is a memcpy.
class Uploads {
 public:
  explicit Uploads(Device d);
  ~Uploads();
  Uploads(const Uploads&) = delete;
  Uploads& operator=(const Uploads&) = delete;
  void copy(void* device_dst, const void* host_src, size_t bytes);
  void next();
  size_t pinned_bytes() const;  // held in both generations

 private:
  struct Generation {
    std::vector<std::pair<void*, size_t>> blocks;  // pinned; copies go into the last
    size_t used = 0;                               // bytes of the last block taken
    void* event = nullptr;                         // recorded when the generation ends
    bool recorded = false;
  };
  void release(Generation& g);
  Device device_;
  Generation gens_[2];
  int cur_ = 0;
};

// ---- per-device context for the CUDA code (opaque here) --------------------------------
// The CUDA stream of device d as a void* (cudaStream_t), for plugins and the kernels.
void* cuda_stream(Device d);

// Cumulative counts of raw device allocations and frees since start: the steady-state
// training step must not change them (the caching allocator serves it).
struct AllocStats {
  int64_t raw_allocs = 0, raw_frees = 0;
  size_t bytes_reserved = 0;  // held from the device, cached or in use
  size_t bytes_in_use = 0;
};
AllocStats alloc_stats(Device d);

}  // namespace megabatch::runtime
