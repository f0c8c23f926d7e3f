// Residual add and gradient accumulation on a GPU.
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

namespace megabatch::ops::cuda {
namespace {

template <typename T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

template <typename T>
__global__ void accumulate_kernel(T* d, const T* g, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    d[i] = from_f32<T>(to_f32(d[i]) + to_f32(g[i]));
}

}  // namespace

void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t n = static_cast<int64_t>(a.numel());
  with_type<accepts::residual_forward_a.cuda.bits>(a.dtype(), "residual_forward", [&](auto zero) {
    using T = decltype(zero);
    add_kernel<T><<<blocks_for(n, 256), 256, 0, stream_of(a)>>>(ptr<T>(out), ptr<T>(a), ptr<T>(b), n);
    MB_CUDA_LAUNCHED("add_kernel");
  });
}

void residual_backward(const Tensor& da, const Tensor& db, const Tensor& dout) {
  const int64_t n = static_cast<int64_t>(dout.numel());
  with_type<accepts::residual_backward_dout.cuda.bits>(dout.dtype(), "residual_backward", [&](auto zero) {
    using T = decltype(zero);
    for (const Tensor* d : {&da, &db}) {
      if (!d->defined()) continue;
      accumulate_kernel<T><<<blocks_for(n, 256), 256, 0, stream_of(dout)>>>(ptr<T>(*d), ptr<T>(dout), n);
      MB_CUDA_LAUNCHED("accumulate_kernel");
    }
  });
}

}  // namespace megabatch::ops::cuda
