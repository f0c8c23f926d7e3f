// Embedding lookup on a GPU, and a deterministic backward: the token positions are sorted
// by id (a stable radix sort, so equal ids keep their order), and the first position of
// each id's run adds the whole run, in order, into that one table row: every row has one
// writer and no atomics are needed.
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

#ifdef MB_WARP_EMULATOR
#include <algorithm>
#else
#include <cub/cub.cuh>
#endif

namespace megabatch::ops::MB_CUDA_BACKEND {

// The arguments these kernels read as one type (raw pointers), as their rows in
// core/ops/accepts.inc say: a row that widened would not build.
static_assert(takes_only<accepts::embedding_forward_ids.cuda.bits, int32_t>() &&
              takes_only<accepts::embedding_backward_ids.cuda.bits, int32_t>());

namespace {

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* ids, const T* table, int64_t n, int64_t C,
                                         int64_t row_begin, int64_t rows, bool accumulate) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n * C;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / C, c = e % C;
    const int64_t r = static_cast<int64_t>(ids[i]) - row_begin;
    const bool inside = r >= 0 && r < rows;
    const float v = inside ? to_f32(table[r * C + c]) : 0.0f;
    if (accumulate) {
      if (inside) out[e] = from_f32<T>(to_f32(out[e]) + v);
    } else {
      out[e] = from_f32<T>(v);
    }
  }
}

// Block k handles sorted position k if it starts a run of equal ids: its threads cover the
// columns, summing the run's rows of dout in position order, then adding once.
template <typename T>
__global__ void embedding_backward_kernel(float* dtable, const T* dout, const int32_t* sorted_ids,
                                          const int32_t* sorted_pos, int64_t n, int64_t C, int64_t row_begin,
                                          int64_t rows) {
  const int64_t k = blockIdx.x;
  const int32_t id = sorted_ids[k];
  if (k > 0 && sorted_ids[k - 1] == id) return;  // not the start of a run
  const int64_t r = static_cast<int64_t>(id) - row_begin;
  if (r < 0 || r >= rows) return;  // another shard's row
  int64_t end = k + 1;
  while (end < n && sorted_ids[end] == id) ++end;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float s = 0;
    for (int64_t j = k; j < end; ++j) s += to_f32(dout[static_cast<int64_t>(sorted_pos[j]) * C + c]);
    dtable[r * C + c] += s;
  }
}

__global__ void iota_kernel(int32_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = static_cast<int32_t>(i);
}

// sorted_ids, sorted_pos = ids, pos sorted by id, stably (equal ids keep their order): cub's
// radix sort of the 32 bits on a GPU. cub's kernels are CUDA only, so on the warp emulator
// std::stable_sort stands in for it, with the same result.
void sort_pairs(int32_t* sorted_ids, int32_t* sorted_pos, const int32_t* ids, const int32_t* pos, int64_t n, Device dev,
                cudaStream_t s) {
#ifdef MB_WARP_EMULATOR
  (void)dev;
  (void)s;
  std::copy(pos, pos + n, sorted_pos);
  std::stable_sort(sorted_pos, sorted_pos + n, [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  for (int64_t k = 0; k < n; ++k) sorted_ids[k] = ids[sorted_pos[k]];
#else
  size_t temp_bytes = 0;
  MB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ids, sorted_ids, pos, sorted_pos,
                                                static_cast<int>(n), 0, 32, s));
  Tensor temp({static_cast<int64_t>(temp_bytes) + 1}, DType::kU8, dev);
  MB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw(), temp_bytes, ids, sorted_ids, pos, sorted_pos,
                                                static_cast<int>(n), 0, 32, s));
#endif
}

}  // namespace

void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table, int64_t row_begin, bool accumulate) {
  const int64_t n = static_cast<int64_t>(ids.numel()), C = table.dim(1);
  if (n == 0) return;
  with_type<accepts::embedding_forward_table.cuda.bits>(table.dtype(), "embedding_forward", [&](auto zero) {
    using T = decltype(zero);
    launch(embedding_forward_kernel<T>, dim3(blocks_for(n * C, 256)), 256, 0, stream_of(table),
           "embedding_forward_kernel", ptr<T>(out), ptr<int32_t>(ids), ptr<T>(table), n, C, row_begin, table.dim(0),
           accumulate);
  });
}

void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids, int64_t row_begin) {
  const int64_t n = static_cast<int64_t>(ids.numel()), C = dtable.dim(1);
  if (n == 0) return;
  check(n < (int64_t{1} << 31), "embedding_backward: ", n, " tokens is more than one sort handles");
  const cudaStream_t s = stream_of(dtable);
  const Device dev = dtable.device();
  Tensor pos({n}, DType::kI32, dev), sorted_ids({n}, DType::kI32, dev), sorted_pos({n}, DType::kI32, dev);
  launch(iota_kernel, dim3(blocks_for(n, 256)), 256, 0, s, "iota_kernel", ptr<int32_t>(pos), n);
  sort_pairs(ptr<int32_t>(sorted_ids), ptr<int32_t>(sorted_pos), ptr<int32_t>(ids), ptr<int32_t>(pos), n, dev, s);
  with_type<accepts::embedding_backward_dout.cuda.bits>(dout.dtype(), "embedding_backward", [&](auto zero) {
    using T = decltype(zero);
    launch(embedding_backward_kernel<T>, dim3(static_cast<unsigned>(n)), 128, 0, s, "embedding_backward_kernel",
           ptr<float>(dtable), ptr<T>(dout), ptr<int32_t>(sorted_ids), ptr<int32_t>(sorted_pos), n, C, row_begin,
           dtable.dim(0));
  });
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
