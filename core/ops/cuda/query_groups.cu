// Grouped-query attention's layout change on a GPU (query_groups.h): a thread per channel of a
// head (expand) or of a group (reduce), the sums in fp32 in head order as on the CPU.
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

namespace megabatch::ops::MB_CUDA_BACKEND {
namespace {

// n = rows x heads x D: element e is channel c of head h in row r
template <typename T>
__global__ void expand_kernel(T* qkv, const T* grouped, int64_t n, QueryGroupShape s) {
  const int64_t D = s.head_dim, per = s.heads / s.groups;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = e % D, h = (e / D) % s.heads, r = e / (D * s.heads);
    const T* group = grouped + r * (s.heads + 2 * s.groups) * D + (h / per) * (per + 2) * D;
    T* head = qkv + (r * s.heads + h) * 3 * D;
    head[c] = group[(h % per) * D + c];
    head[D + c] = group[per * D + c];
    head[2 * D + c] = group[(per + 1) * D + c];
  }
}

// n = rows x groups x D: element e is channel c of group g in row r
template <typename T>
__global__ void reduce_kernel(T* dgrouped, const T* dqkv, int64_t n, QueryGroupShape s) {
  const int64_t D = s.head_dim, per = s.heads / s.groups;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = e % D, g = (e / D) % s.groups, r = e / (D * s.groups);
    T* group = dgrouped + r * (s.heads + 2 * s.groups) * D + g * (per + 2) * D;
    const T* heads = dqkv + (r * s.heads + g * per) * 3 * D;
    float k = 0.0f, v = 0.0f;
    for (int64_t j = 0; j < per; ++j) {
      group[j * D + c] = heads[j * 3 * D + c];
      k += to_f32(heads[j * 3 * D + D + c]);
      v += to_f32(heads[j * 3 * D + 2 * D + c]);
    }
    group[per * D + c] = from_f32<T>(k);
    group[(per + 1) * D + c] = from_f32<T>(v);
  }
}

}  // namespace

void expand_query_groups(const Tensor& qkv, const Tensor& grouped, const QueryGroupShape& s) {
  with_type<accepts::expand_query_groups_grouped.cuda.bits>(grouped.dtype(), "expand_query_groups", [&](auto zero) {
    using T = decltype(zero);
    const int64_t n = static_cast<int64_t>(qkv.numel()) / 3;
    if (n > 0)
      launch(expand_kernel<T>, dim3(blocks_for(n, 256)), 256, 0, stream_of(qkv), "expand_query_groups", ptr<T>(qkv),
             ptr<T>(grouped), n, s);
  });
}

void reduce_query_groups(const Tensor& dgrouped, const Tensor& dqkv, const QueryGroupShape& s) {
  with_type<accepts::reduce_query_groups_dqkv.cuda.bits>(dqkv.dtype(), "reduce_query_groups", [&](auto zero) {
    using T = decltype(zero);
    const int64_t n = static_cast<int64_t>(dqkv.numel()) / (3 * s.heads) * s.groups;
    if (n > 0)
      launch(reduce_kernel<T>, dim3(blocks_for(n, 256)), 256, 0, stream_of(dqkv), "reduce_query_groups",
             ptr<T>(dgrouped), ptr<T>(dqkv), n, s);
  });
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
