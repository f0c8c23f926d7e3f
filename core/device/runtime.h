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
// Copies `bytes` from src on device `from` to dst on device `to`. A host-to-device copy of
// up to 2 MiB (a batch, a plugin's tables, a step's numbers) is staged in pinned memory: it
// returns without waiting for the device, and src may change at once. A larger one (weights,
// checkpoints) may let the driver wait for the device's stream first. A copy to the host waits
// for the device's stream to reach it (the data is there when the call returns).
void copy_bytes(void* dst, Device to, const void* src, Device from, size_t bytes);
// Copies `bytes` of device d's memory to host memory as copy_bytes does (waiting for d's
// stream) and counts it as a read of device values by the host, on the CPU too: what the host
// reads on a CPU run it would wait for on a GPU. The tensors' to_host_* and the plugins'
// host->download read through here.
void read_back(void* host_dst, const void* src, Device d, size_t bytes);
// The reads of device values by the host in this process so far: read_back() on any device
// and any other copy from a GPU to the host (not Readback's, which wait for nothing). The
// tests count them over steps that must not wait for the device.
int64_t host_reads();
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

// ---- holding the stream (tests) --------------------------------------------------------
// Holds d's stream where it is constructed: what is issued after it runs only once release()
// is called, or once `seconds` have passed. A test issues work behind a hold to prove that the
// host never waits for the device while issuing it: a host that waited would wait out the
// deadline, and release() says so. (Kernel launches beyond what the driver queues, about a
// thousand, would wait too: hold a few hundred at most.) Not for a CPU device.
class StreamHold {
 public:
  StreamHold(Device d, double seconds);
  ~StreamHold();  // releases, if release() was not called
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;
  // Lets the stream go on, waits until it has run everything issued so far, and returns whether
  // the hold ran out its deadline (the host waited for the device behind it).
  bool release();

 private:
  Device device_;
  void* hold_ = nullptr;
};

// ---- per-device context for the CUDA code (opaque here) --------------------------------
// The CUDA stream of device d as a void* (cudaStream_t), for plugins and the kernels.
void* cuda_stream(Device d);

// Cumulative counts of raw device allocations and frees since start: the steady-state
// training step must not change them (the caching allocator serves it).
struct AllocStats {
  int64_t raw_allocs = 0, raw_frees = 0;
  size_t bytes_reserved = 0;  // held from the device, cached or in use
  size_t max_bytes_reserved = 0;  // the most held at once since start
  size_t bytes_in_use = 0;
};
AllocStats alloc_stats(Device d);

}  // namespace megabatch::runtime
