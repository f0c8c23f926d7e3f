// Philox normal draws on a GPU: the CPU's numbers (philox_normal is host/device code).
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"
#include "core/util/philox.h"

namespace megabatch::ops::MB_CUDA_BACKEND {

// The arguments these kernels read as one type (raw pointers), as their rows in
// core/ops/accepts.inc say: a row that widened would not build.
static_assert(takes_only<accepts::normal_fill_out.cuda.bits, float>());

namespace {
__global__ void normal_kernel(float* out, int64_t n, uint64_t key, ShardLayout layout) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = static_cast<float>(philox_normal(key, static_cast<uint64_t>(layout.full_index(i))));
}
}  // namespace

void normal_fill(const Tensor& out, uint64_t key, const ShardLayout& layout) {
  const int64_t n = static_cast<int64_t>(out.numel());
  if (n == 0) return;
  launch(normal_kernel, dim3(blocks_for(n, 256)), 256, 0, stream_of(out), "normal_kernel", ptr<float>(out), n, key,
         layout);
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
