// CUDA side of the device runtime: one stream per GPU, raw memory with counts, copies
// (host->device through pinned staging), and the stream hold that tests use.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/device/cuda/check.h"
#include "core/device/cuda/cuda_runtime.h"

namespace megabatch::cuda_rt {

void fail_call(const char* what, const char* error, const char* file, int line) {
  fail("CUDA error in ", what, " (", file, ":", line, "): ", error);
}

bool sync_after_launch() {
  static const bool on = [] {
    const char* v = std::getenv("MEGABATCH_CUDA_SYNC");
    return v && std::string(v) == "1";
  }();
  return on;
}

void check_launch(const char* kernel, const char* file, int line) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && sync_after_launch()) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) fail_call(kernel, cudaGetErrorString(e), file, line);
}

namespace {
// Host->device copies of up to kStageChunk bytes are staged in pinned memory: from a
// pageable source CUDA lets the driver wait for the stream before it copies (its API
// synchronization rules), which would make the host wait for the GPU at every batch upload.
// The chunks are filled in turn, and a chunk is filled again only once the device has
// passed the copies of its last use (an event recorded when it was left; long since, as the
// other chunks' bytes were copied in between).
constexpr size_t kStageChunk = size_t{2} << 20;
constexpr int kStageChunks = 4;
struct Staging {
  std::mutex mu;
  char* base = nullptr;  // kStageChunks x kStageChunk, pinned; allocated at the first copy
  cudaEvent_t left[kStageChunks] = {};  // (one never recorded counts as passed)
  int chunk = 0;    // the chunk being filled
  size_t used = 0;  // its bytes taken
};

struct PerDevice {
  cudaStream_t stream = nullptr;
  runtime::AllocStats stats;
  std::unique_ptr<Staging> staging = std::make_unique<Staging>();  // (lives until exit, as the stream)
};
std::mutex g_mu;
std::vector<PerDevice>& devices() {
  static auto* d = new std::vector<PerDevice>();  // lives until exit
  return *d;
}
PerDevice& per_device(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& all = devices();
  if (all.size() <= static_cast<size_t>(device)) all.resize(static_cast<size_t>(device) + 1);
  PerDevice& p = all[static_cast<size_t>(device)];
  if (!p.stream) {
    MB_CUDA_CHECK(cudaSetDevice(device));
    MB_CUDA_CHECK(cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking));
  }
  return p;
}
}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no GPU: not an error, just none
    return 0;
  }
  return n;
}

runtime::GpuInfo gpu_info(int index) {
  cudaDeviceProp p{};
  MB_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  runtime::GpuInfo g;
  g.name = p.name;
  g.major = p.major;
  g.minor = p.minor;
  g.total_memory = p.totalGlobalMem;
  g.multiprocessors = p.multiProcessorCount;
  return g;
}

size_t free_memory(int index) {
  int current = 0;
  MB_CUDA_CHECK(cudaGetDevice(&current));
  MB_CUDA_CHECK(cudaSetDevice(index));
  size_t free = 0, total = 0;
  MB_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  MB_CUDA_CHECK(cudaSetDevice(current));
  return free;
}

void* raw_alloc(int device, size_t bytes) {
  PerDevice& d = per_device(device);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("cuda:", device, ": out of memory allocating ", bytes >> 20, " MiB (", d.stats.bytes_reserved >> 20,
         " MiB held by this run, ", free_b >> 20, " MiB free of ", total_b >> 20,
         " MiB); lower --micro-batch-size or the model size (", cudaGetErrorString(e), ")");
  }
  std::lock_guard<std::mutex> lock(g_mu);
  ++d.stats.raw_allocs;
  d.stats.bytes_reserved += bytes;
  d.stats.max_bytes_reserved = std::max(d.stats.max_bytes_reserved, d.stats.bytes_reserved);
  return p;
}

void raw_free(int device, void* p, size_t bytes) {
  PerDevice& d = per_device(device);
  MB_CUDA_CHECK(cudaFree(p));
  std::lock_guard<std::mutex> lock(g_mu);
  ++d.stats.raw_frees;
  d.stats.bytes_reserved -= bytes;
}

void use_device(int device) {
  per_device(device);
  MB_CUDA_CHECK(cudaSetDevice(device));
}

namespace {
// Queues the copy of `bytes` (at most kStageChunk) from host memory to dst through the staging
// chunks; the source may change as soon as this returns.
void staged_copy(PerDevice& d, int device, void* dst, const void* src, size_t bytes) {
  Staging& s = *d.staging;
  std::lock_guard<std::mutex> lock(s.mu);  // the copy is queued inside: its chunk's event must follow it
  if (!s.base) {
    int current = 0;  // the events belong to the stream's device
    MB_CUDA_CHECK(cudaGetDevice(&current));
    MB_CUDA_CHECK(cudaSetDevice(device));
    MB_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&s.base), kStageChunks * kStageChunk, cudaHostAllocPortable));
    for (cudaEvent_t& e : s.left) MB_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    MB_CUDA_CHECK(cudaSetDevice(current));
  }
  size_t at = (s.used + 15) / 16 * 16;
  if (at + bytes > kStageChunk) {  // on to the next chunk, once the device is past its last use
    MB_CUDA_CHECK(cudaEventRecord(s.left[s.chunk], d.stream));
    s.chunk = (s.chunk + 1) % kStageChunks;
    MB_CUDA_CHECK(cudaEventSynchronize(s.left[s.chunk]));
    at = 0;
  }
  char* staged = s.base + static_cast<size_t>(s.chunk) * kStageChunk + at;
  std::memcpy(staged, src, bytes);
  s.used = at + bytes;
  MB_CUDA_CHECK(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, d.stream));
}
}  // namespace

void copy_bytes(void* dst, const void* src, size_t bytes, int device, int kind) {
  PerDevice& d = per_device(device);
  if (kind == 0 && bytes <= kStageChunk) {
    staged_copy(d, device, dst, src, bytes);
    return;
  }
  const cudaMemcpyKind k = kind == 0 ? cudaMemcpyHostToDevice : kind == 1 ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
  MB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, d.stream));
  if (kind == 1) MB_CUDA_CHECK(cudaStreamSynchronize(d.stream));
}

void fill_zero(void* p, int device, size_t bytes) {
  MB_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, per_device(device).stream));
}

void synchronize(int device) { MB_CUDA_CHECK(cudaStreamSynchronize(per_device(device).stream)); }

void* stream(int device) { return per_device(device).stream; }

void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  MB_CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}

void pinned_free(void* p) { cudaFreeHost(p); }

void* event_create() {
  cudaEvent_t e = nullptr;
  MB_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void event_destroy(void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }

void copy_to_host_async(void* dst, const void* src, size_t bytes, int device, void* event) {
  PerDevice& d = per_device(device);
  MB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, d.stream));
  MB_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), d.stream));
}

void event_wait(void* e) { MB_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e))); }

namespace {
struct Hold {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false, ran_out = false;
  double seconds = 0;
};
// Runs on the driver's callback thread when the stream reaches the hold: the stream waits
// here until the host opens the hold or the deadline passes.
void CUDART_CB hold_stream_here(void* p) {
  Hold& h = *static_cast<Hold*>(p);
  std::unique_lock<std::mutex> lock(h.mu);
  h.ran_out = !h.cv.wait_for(lock, std::chrono::duration<double>(h.seconds), [&] { return h.open; });
}
}  // namespace

void* hold_stream(int device, double seconds) {
  auto* h = new Hold;
  h->seconds = seconds;
  const cudaError_t e = cudaLaunchHostFunc(per_device(device).stream, hold_stream_here, h);
  if (e != cudaSuccess) delete h;
  MB_CUDA_CHECK(e);
  return h;
}

bool release_stream(void* hold, int device) {
  auto* h = static_cast<Hold*>(hold);
  {
    std::lock_guard<std::mutex> lock(h->mu);
    h->open = true;
  }
  h->cv.notify_all();
  // once the stream has run, the callback is done with h (on an error h stays: it may not have run)
  MB_CUDA_CHECK(cudaStreamSynchronize(per_device(device).stream));
  const bool ran_out = h->ran_out;
  delete h;
  return ran_out;
}

runtime::AllocStats alloc_stats(int device) {
  PerDevice& d = per_device(device);
  std::lock_guard<std::mutex> lock(g_mu);
  runtime::AllocStats s = d.stats;
  s.bytes_in_use = 0;
  return s;
}

}  // namespace megabatch::cuda_rt
