// A warp emulator: runs megabatch's CUDA kernels on the CPU, thread by thread, so that the
// machines without a GPU (CI's, and most of ours) test what a kernel computes, where it
// reads and writes, and the order its threads wait on each other in.
//
// A kernel source compiled as C++ with MB_WARP_EMULATOR defined (tests/emulator/*_emulated.cc
// include the .cu files) reaches this header through core/ops/cuda/common.cuh. Each CUDA
// thread becomes a fiber of one OS thread; a block's fibers share its shared memory. The
// warp-wide instructions the kernels use (mma.sync m16n8k16, ldmatrix, shuffles) are
// collectives: every lane of the warp deposits its operands, the last to arrive computes
// the results of all 32 from the PTX ISA's fragment layouts, and each lane takes its own.
// __syncthreads is a barrier of the block's live threads. cp.async copies land when the
// issuing thread's cp.async.wait_group says they must (kDeferred: a read before the wait
// sees the old bytes) or as they are issued (kEager: a copy into a buffer that another warp
// still reads shows). At most `resident` blocks run at once, and the next starts when one
// ends, as on a GPU whose SMs hold that many; the order in which the runnable threads take
// turns is round robin or, with a seed, random (a missing barrier then shows as a wrong
// result). A barrier no thread can reach, or threads that only poll, end the launch with an
// error saying so; so do __trap() and an ldmatrix row or cp.async address off its 16 bytes.
//
// What it does not model: speed, the hardware's order of f32 sums inside an mma (it sums in
// f64 and rounds once), and memory ordering (memory is one, sequentially consistent). The
// tests that need the GPU stay in the gpu label.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace megabatch::emu {

enum class Copies { kDeferred, kEager };

struct Options {
  int resident = 4;       // blocks running at once
  uint64_t seed = 0;      // 0: threads take turns round robin; else in a random order from this seed
  Copies copies = Copies::kDeferred;
};
// The options of the launches that follow (per OS thread; the emulator runs on the caller's).
void set_options(const Options& o);
const Options& options();

// Runs `kernel` (one call is one CUDA thread) over grid x block threads with `smem` bytes of
// dynamic shared memory a block. Throws std::runtime_error naming `name` on a deadlock, a
// __trap(), or lanes of a warp meeting at different collectives.
void launch(const char* name, dim3 grid, dim3 block, size_t smem, std::function<void()> kernel);
// How many launches this thread has run to their end.
int64_t launches();
// How many warp-wide mma instructions (m16n8k16) the launches of this thread have run: the
// tensor-core work a kernel did, so that a test can see which tiles it skipped.
int64_t mmas();
// How many Philox blocks the flash kernels' dropout has drawn on this thread (each draw is
// ten rounds of integer products a thread; a test counts them per score).
int64_t philox_blocks();
void count_philox_block();

// ---- what a kernel calls (through the macros below) -----------------------------------
const uint3& thread_index();
const uint3& block_index();
const dim3& block_dim();
const dim3& grid_dim();
unsigned char* dynamic_smem();
// A kernel's __shared__ array (MB_SHARED_ARRAY): `bytes` of the block's shared memory, the
// same for every thread of the block that asks with the same `declaration` (the address of a
// static that stands for it), 16-byte aligned and not zeroed.
void* static_smem(const void* declaration, size_t bytes);
void syncthreads();
uint64_t shfl_xor_bits(uint64_t v, int lane_mask);
template <typename T>
T shfl_xor(T v, int lane_mask) {
  static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
  uint64_t bits = 0;
  __builtin_memcpy(&bits, &v, sizeof(T));
  bits = shfl_xor_bits(bits, lane_mask);
  T out;
  __builtin_memcpy(&out, &bits, sizeof(T));
  return out;
}
// d (16x8 f32) = a (16x16) b (16x8) + c, the operands in mma.sync m16n8k16's fragments
void mma_m16n8k16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1, bool bf16);
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: this lane's row address in, four
// registers out
void ldmatrix_x4(uint32_t* r, const void* row, bool trans);
void cp_async16(void* dst, const void* src, int src_bytes);
void cp_commit();
void cp_wait(int groups_in_flight);
int atomic_add(int* p, int v);
void poll();  // a wait that polls (spins): lets the others run, and watches for a deadlock
[[noreturn]] void trap(const char* why);
float ex2(float x);

}  // namespace megabatch::emu

#define threadIdx (::megabatch::emu::thread_index())
#define blockIdx (::megabatch::emu::block_index())
#define blockDim (::megabatch::emu::block_dim())
#define gridDim (::megabatch::emu::grid_dim())
#define __syncthreads() ::megabatch::emu::syncthreads()
#define __shfl_xor_sync(mask, v, lane_mask) ::megabatch::emu::shfl_xor(v, lane_mask)
#define __ldcg(p) (*(p))
#define __stcg(p, v) (*(p) = (v))
#define atomicAdd(p, v) ::megabatch::emu::atomic_add(p, v)
#define __nanosleep(ns) ::megabatch::emu::poll()
#define __trap() ::megabatch::emu::trap("__trap()")
#define __launch_bounds__(...)
// the CUDA device functions the kernels call that C++ lacks (rsqrtf: exact here, within 2
// ulp on a GPU)
inline int min(int a, int b) { return a < b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline float rsqrtf(float x) { return 1.0f / __builtin_sqrtf(x); }
