// What the CUDA op kernels share: element types, loads and stores in f32, the run's stream,
// dtype dispatch, launch checks and fixed-order (deterministic) warp and block reductions.
//
// Every kernel computes in f32 whatever the storage type (bf16 and f16 are converted on
// load and rounded to nearest even on store, as the CPU emulation does), and every
// reduction has one order for a given launch shape, which the launchers fix: no
// floating-point atomics anywhere, so the same inputs give the same bits on every run.
//
// The kernels are also compiled as C++ for the CPU's warp emulator (MB_WARP_EMULATOR,
// tests/emulator): they live in namespace MB_CUDA_BACKEND (ops::emulated there, so the two
// builds of one kernel never meet at link time), declare shared memory with MB_DYNAMIC_SMEM
// and MB_SHARED_ARRAY, launch through launch(), and give each inline-PTX helper an emulated
// branch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#ifdef MB_WARP_EMULATOR
#include "tests/emulator/warp_emulator.h"
#define MB_CUDA_BACKEND emulated
#define MB_DYNAMIC_SMEM(name) unsigned char* name = ::megabatch::emu::dynamic_smem()
#define MB_SHARED_ARRAY(type, name, count) \
  static const char name##_declared = 0;   \
  type* const name = static_cast<type*>(::megabatch::emu::static_smem(&name##_declared, sizeof(type) * (count)))
#else
#define MB_CUDA_BACKEND cuda
#define MB_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#define MB_SHARED_ARRAY(type, name, count) __shared__ type name[count]
#endif

#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "core/device/cuda/check.h"
#include "core/device/runtime.h"
#include "core/ops/accepts.h"
#include "core/ops/backends.h"
#include "core/tensor/tensor.h"
#include "core/util/error.h"

namespace megabatch::ops::MB_CUDA_BACKEND {

using bf16 = __nv_bfloat16;
using f16 = __half;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(f16 x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ f16 from_f32<f16>(float x) { return __float2half_rn(x); }

// The stream every op of a tensor's device is issued on.
#ifdef MB_WARP_EMULATOR
inline cudaStream_t stream_of(const Tensor&) { return nullptr; }  // (the emulator runs a launch to its end)
#else
inline cudaStream_t stream_of(const Tensor& t) { return static_cast<cudaStream_t>(runtime::cuda_stream(t.device())); }
#endif

// Calls fn(T{}) with the element type of dtype d, which is one of `Accepted`: the CUDA
// column of the argument's row in core/ops/accepts.inc (with_type<accepts::sum_out.cuda.bits>).
// fn is compiled for each of those dtypes and for no other, so a row cannot promise a dtype
// its kernel does not take; the public op has checked d against the same row, so another
// dtype here is a bug of megabatch's.
template <uint32_t Accepted, typename Fn>
void with_type(DType d, const char* op, Fn&& fn) {
  constexpr DTypes accepted = DTypes::of_bits(Accepted);
  switch (d) {
    case DType::kF32:
      if constexpr (accepted.has(DType::kF32)) return fn(float{});
      break;
    case DType::kBF16:
      if constexpr (accepted.has(DType::kBF16)) return fn(bf16{});
      break;
    case DType::kF16:
      if constexpr (accepted.has(DType::kF16)) return fn(f16{});
      break;
    case DType::kF64:
      if constexpr (accepted.has(DType::kF64)) return fn(double{});
      break;
    default:
      break;
  }
  fail("internal error: ", op, ": a ", dtype_name(d), " tensor reached a CUDA kernel that takes ", accepted.names());
}

// The CUDA column of a row whose argument a kernel reads as exactly one type (a raw
// ptr<float>, ptr<int32_t>): compiled only while the row says so.
template <uint32_t Accepted, typename T>
constexpr bool takes_only() {
  return DTypes::of_bits(Accepted) == DTypes{dtype_of<T>()};
}

// Typed device pointers of a tensor (null for an undefined one).
template <typename T>
T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw()) : nullptr;
}

// Whether the current GPU lets a block have `smem` bytes of dynamic shared memory, with the
// opt-in (a T4: 64 KiB, sm_86 and sm_89: 99, an A100: 163, an H100: 227); the emulator's, any.
#ifdef MB_WARP_EMULATOR
inline bool dynamic_smem_fits(size_t) { return true; }
#else
inline bool dynamic_smem_fits(size_t smem) {
  int device = 0;
  MB_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::map<int, int> most;  // per GPU
  std::lock_guard<std::mutex> lock(mu);
  const auto [it, fresh] = most.try_emplace(device, 0);
  if (fresh) MB_CUDA_CHECK(cudaDeviceGetAttribute(&it->second, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return smem <= static_cast<size_t>(it->second);
}
#endif

#ifndef MB_WARP_EMULATOR
// Lets kernel k use smem bytes of dynamic shared memory on the current GPU (with its static
// shared memory, over 48 KiB takes an opt-in): a driver call once per kernel, GPU and larger
// size, not at every launch.
inline void allow_dynamic_smem(const void* k, size_t smem) {
  if (smem == 0) return;
  int device = 0;
  MB_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> allowed;
  std::lock_guard<std::mutex> lock(mu);
  size_t& most = allowed[{device, k}];
  if (smem <= most) return;
  MB_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  most = smem;
}
#endif

// Launches kernel k(args...) on stream st and checks the launch (on the warp emulator, runs
// it to its end). smem: bytes of dynamic shared memory (over 48 KiB allowed).
template <typename Kernel, typename... A>
void launch(Kernel k, dim3 grid, int threads, size_t smem, cudaStream_t st, const char* name, const A&... args) {
#ifdef MB_WARP_EMULATOR
  (void)st;
  emu::launch(name, grid, dim3(static_cast<unsigned>(threads)), smem, [=] { k(args...); });
#else
  allow_dynamic_smem(reinterpret_cast<const void*>(k), smem);
  k<<<grid, threads, smem, st>>>(args...);
  MB_CUDA_LAUNCHED(name);
#endif
}

inline int blocks_for(int64_t n, int threads, int64_t cap = 65535LL * 8) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > cap ? cap : b));
}

// ---- elementwise maps, 16 bytes a thread ------------------------------------------------
// out[j] = f(in_0[j], in_1[j], ...) (all of type T, computed in f32) for j < n. Each thread
// loads and stores kVec<T> elements at a time (16 bytes: one vector instruction each) where
// every pointer is 16-byte aligned, the last partial vector one element at a time; a view
// that starts mid-vector takes the one-at-a-time kernel. `out` may be one of the inputs.
template <typename T>
constexpr int kVec = static_cast<int>(16 / sizeof(T));
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Whether every pointer given is 16-byte aligned (null ones are skipped): the launchers'
// test for the kernels that load Pack<T, kVec<T>>.
template <typename... P>
bool aligned16(const P*... p) {
  return ((!p || reinterpret_cast<uintptr_t>(p) % 16 == 0) && ...);
}

template <typename F, typename T, int V, size_t... I>
__device__ __forceinline__ float apply_at(const F& f, const Pack<T, V>* x, int k, std::index_sequence<I...>) {
  return f(to_f32(x[I].v[k])...);
}

template <typename T, int V, typename F, typename... In>
__global__ void map_kernel(T* out, int64_t n, F f, const In*... in) {
  using P = Pack<T, V>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i * V < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if ((i + 1) * V <= n) {
      const P x[] = {reinterpret_cast<const P*>(in)[i]...};
      P y;
#pragma unroll
      for (int k = 0; k < V; ++k) y.v[k] = from_f32<T>(apply_at(f, x, k, std::index_sequence_for<In...>{}));
      reinterpret_cast<P*>(out)[i] = y;
    } else {
      for (int64_t j = i * V; j < n; ++j) out[j] = from_f32<T>(f(to_f32(in[j])...));
    }
  }
}

template <typename T, typename F, typename... In>
void map(const char* name, cudaStream_t st, T* out, int64_t n, F f, const In*... in) {
  static_assert((std::is_same_v<In, T> && ...), "map: every input has the output's type");
  if (n <= 0) return;
  constexpr int V = kVec<T>;
  if (aligned16(out, in...))
    launch(map_kernel<T, V, F, In...>, dim3(blocks_for((n + V - 1) / V, 256)), 256, 0, st, name, out, n, f, in...);
  else
    launch(map_kernel<T, 1, F, In...>, dim3(blocks_for(n, 256)), 256, 0, st, name, out, n, f, in...);
}

// ---- deterministic reductions (fixed tree for a given block size) ---------------------
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `scratch` holds 32 values of T in shared memory.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : T(0);
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
