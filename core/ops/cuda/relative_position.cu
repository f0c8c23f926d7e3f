// T5's relative position bias on a GPU; the backward gives each (bucket, head) entry of the
// table one block, which sums its positions in a fixed order (no atomics).
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

namespace megabatch::ops::MB_CUDA_BACKEND {

// The arguments these kernels read as one type (raw pointers), as their rows in
// core/ops/accepts.inc say: a row that widened would not build.
static_assert(takes_only<accepts::relative_bias_forward_buckets.cuda.bits, int32_t>() &&
              takes_only<accepts::relative_bias_backward_buckets.cuda.bits, int32_t>());

namespace {

template <typename T>
__global__ void relative_bias_forward_kernel(T* out, const T* table, const int32_t* buckets, int64_t H, int64_t E) {
  for (int64_t x = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; x < H * E;
       x += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t h = x / E, e = x % E;
    out[x] = table[static_cast<int64_t>(buckets[e]) * H + h];
  }
}

// block (bucket, h): dtable[bucket, h] += sum of dout[h, e] over positions e in that bucket
template <typename T>
__global__ void relative_bias_backward_kernel(float* dtable, const T* dout, const int32_t* buckets, int64_t H, int64_t E) {
  MB_SHARED_ARRAY(float, scratch, 32);
  const int64_t bucket = blockIdx.x / H, h = blockIdx.x % H;
  float s = 0;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
    if (buckets[e] == bucket) s += to_f32(dout[h * E + e]);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) dtable[bucket * H + h] += s;
}

}  // namespace

void relative_bias_forward(const Tensor& out, const Tensor& table, const Tensor& buckets) {
  const int64_t H = table.dim(1), E = static_cast<int64_t>(buckets.numel());
  with_type<accepts::relative_bias_forward_table.cuda.bits>(table.dtype(), "relative_bias_forward", [&](auto zero) {
    using T = decltype(zero);
    launch(relative_bias_forward_kernel<T>, dim3(blocks_for(H * E, 256)), 256, 0, stream_of(table),
           "relative_bias_forward_kernel", ptr<T>(out), ptr<T>(table), ptr<int32_t>(buckets), H, E);
  });
}

void relative_bias_backward(const Tensor& dtable, const Tensor& dout, const Tensor& buckets) {
  const int64_t NB = dtable.dim(0), H = dtable.dim(1), E = static_cast<int64_t>(buckets.numel());
  if (NB * H == 0) return;
  with_type<accepts::relative_bias_backward_dout.cuda.bits>(dout.dtype(), "relative_bias_backward", [&](auto zero) {
    using T = decltype(zero);
    launch(relative_bias_backward_kernel<T>, dim3(static_cast<unsigned>(NB * H)), 256, 0, stream_of(dout),
           "relative_bias_backward_kernel", ptr<float>(dtable), ptr<T>(dout), ptr<int32_t>(buckets), H, E);
  });
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
