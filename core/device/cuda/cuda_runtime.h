// The CUDA side of core/device/runtime.h, implemented in runtime.cu (CUDA builds only).
// Plain C++: dispatch code includes it and calls it through MB_CUDA(...).
#pragma once

#include <cstddef>

#include "core/device/runtime.h"

namespace megabatch::cuda_rt {

int device_count();
runtime::GpuInfo gpu_info(int index);
size_t free_memory(int index);  // cudaMemGetInfo on that GPU
void* raw_alloc(int device, size_t bytes);
void raw_free(int device, void* p, size_t bytes);
void use_device(int device);
// kind: 0 host->device (up to 2 MiB staged in pinned memory), 1 device->host (waits for the
// stream), 2 device->device
void copy_bytes(void* dst, const void* src, size_t bytes, int device, int kind);
void fill_zero(void* p, int device, size_t bytes);
void synchronize(int device);
void* stream(int device);
runtime::AllocStats alloc_stats(int device);
// pinned host memory and events for runtime::Readback
void* pinned_alloc(size_t bytes);
void pinned_free(void* p);
void* event_create();
void event_destroy(void* e);
void copy_to_host_async(void* dst, const void* src, size_t bytes, int device, void* event);  // then records event
void event_wait(void* e);
// runtime::StreamHold: a host function on the stream that waits until released or `seconds`
// pass; release_stream opens it, waits for the stream, and says whether the deadline passed
void* hold_stream(int device, double seconds);
bool release_stream(void* hold, int device);

}  // namespace megabatch::cuda_rt
