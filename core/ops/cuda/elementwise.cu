// Dtype conversion and scaling on a GPU.
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

namespace megabatch::ops::MB_CUDA_BACKEND {
namespace {

template <typename D, typename S>
__global__ void cast_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = from_f32<D>(to_f32(src[i]));
}

template <typename T>
__global__ void scale_kernel(T* x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = from_f32<T>(to_f32(x[i]) * s);
}

}  // namespace

void cast(const Tensor& dst, const Tensor& src) {
  const int64_t n = static_cast<int64_t>(src.numel());
  if (n == 0) return;
  with_type<accepts::cast_dst.cuda.bits>(dst.dtype(), "cast", [&](auto dz) {
    using D = decltype(dz);
    with_type<accepts::cast_src.cuda.bits>(src.dtype(), "cast", [&](auto sz) {
      using S = decltype(sz);
      launch(cast_kernel<D, S>, dim3(blocks_for(n, 256)), 256, 0, stream_of(src), "cast_kernel", ptr<D>(dst),
             ptr<S>(src), n);
    });
  });
}

void scale(const Tensor& x, float s) {
  const int64_t n = static_cast<int64_t>(x.numel());
  if (n == 0) return;
  with_type<accepts::scale_x.cuda.bits>(x.dtype(), "scale", [&](auto zero) {
    using T = decltype(zero);
    launch(scale_kernel<T>, dim3(blocks_for(n, 256)), 256, 0, stream_of(x), "scale_kernel", ptr<T>(x), s, n);
  });
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
