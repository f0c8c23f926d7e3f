// Row gathers on a GPU.
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

namespace megabatch::ops::MB_CUDA_BACKEND {

// The arguments these kernels read as one type (raw pointers), as their rows in
// core/ops/accepts.inc say: a row that widened would not build.
static_assert(takes_only<accepts::gather_rows_rows.cuda.bits, int32_t>() &&
              takes_only<accepts::scatter_add_rows_rows.cuda.bits, int32_t>() &&
              takes_only<accepts::scatter_rows_rows.cuda.bits, int32_t>());

namespace {

template <typename T>
__global__ void gather_rows_kernel(T* out, const T* in, const int32_t* rows, int64_t m, int64_t C) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < m * C;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[e] = in[static_cast<int64_t>(rows[e / C]) * C + e % C];
}

// rows are distinct: each destination element has one writer
template <typename T>
__global__ void scatter_rows_kernel(T* dst, const T* src, const int32_t* rows, int64_t m, int64_t C) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < m * C;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[static_cast<int64_t>(rows[e / C]) * C + e % C] = src[e];
}

// rows are distinct: each destination element has one writer
template <typename T>
__global__ void scatter_add_rows_kernel(T* dst, const T* src, const int32_t* rows, int64_t m, int64_t C) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < m * C;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T& d = dst[static_cast<int64_t>(rows[e / C]) * C + e % C];
    d = from_f32<T>(to_f32(d) + to_f32(src[e]));
  }
}

}  // namespace

void gather_rows(const Tensor& out, const Tensor& in, const Tensor& rows) {
  const int64_t m = static_cast<int64_t>(rows.numel()), C = in.shape().back();
  if (m == 0) return;
  with_type<accepts::gather_rows_in.cuda.bits>(in.dtype(), "gather_rows", [&](auto zero) {
    using T = decltype(zero);
    launch(gather_rows_kernel<T>, dim3(blocks_for(m * C, 256)), 256, 0, stream_of(in), "gather_rows_kernel",
           ptr<T>(out), ptr<T>(in), ptr<int32_t>(rows), m, C);
  });
}

void scatter_rows(const Tensor& dst, const Tensor& src, const Tensor& rows) {
  const int64_t m = static_cast<int64_t>(rows.numel()), C = src.shape().back();
  if (m == 0) return;
  with_type<accepts::scatter_rows_src.cuda.bits>(src.dtype(), "scatter_rows", [&](auto zero) {
    using T = decltype(zero);
    launch(scatter_rows_kernel<T>, dim3(blocks_for(m * C, 256)), 256, 0, stream_of(src), "scatter_rows_kernel",
           ptr<T>(dst), ptr<T>(src), ptr<int32_t>(rows), m, C);
  });
}

void scatter_add_rows(const Tensor& dst, const Tensor& src, const Tensor& rows) {
  const int64_t m = static_cast<int64_t>(rows.numel()), C = src.shape().back();
  if (m == 0) return;
  with_type<accepts::scatter_add_rows_src.cuda.bits>(src.dtype(), "scatter_add_rows", [&](auto zero) {
    using T = decltype(zero);
    launch(scatter_add_rows_kernel<T>, dim3(blocks_for(m * C, 256)), 256, 0, stream_of(src), "scatter_add_rows_kernel",
           ptr<T>(dst), ptr<T>(src), ptr<int32_t>(rows), m, C);
  });
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
