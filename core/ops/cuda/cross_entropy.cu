// The pieces of the vocabulary-parallel cross entropy on a GPU: a block per row for the
// reductions over the vocabulary, a thread per row for the rest; and ce_whole_rows, the
// pieces in one kernel for rows that hold the whole vocabulary. Per-row values in f32.
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

namespace megabatch::ops::MB_CUDA_BACKEND {

// The arguments these kernels read as one type (raw pointers), as their rows in
// core/ops/accepts.inc say: a row that widened would not build.
static_assert(takes_only<accepts::ce_target_logit_targets.cuda.bits, int32_t>() &&
              takes_only<accepts::ce_loss_targets.cuda.bits, int32_t>() &&
              takes_only<accepts::ce_backward_targets.cuda.bits, int32_t>() &&
              takes_only<accepts::ce_backward_loss_scale.cuda.bits, float>() &&
              takes_only<accepts::ce_backward_exps_targets.cuda.bits, int32_t>() &&
              takes_only<accepts::ce_backward_exps_loss_scale.cuda.bits, float>() &&
              takes_only<accepts::ce_whole_rows_targets.cuda.bits, int32_t>() &&
              takes_only<accepts::ce_whole_rows_loss_scale.cuda.bits, float>());

namespace {

constexpr int kThreads = 256;

// One row's reductions by the whole block (every thread gets the result), for the pieces
// (ce_whole_rows makes one online pass instead).
// The largest logit (fmaxf passes over a NaN, which then poisons the sum of exps).
template <typename T>
__device__ float block_row_max(const T* l, int64_t V, float* scratch) {
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, to_f32(l[j]));
  return block_max(m, scratch);
}

// sum_j exp(l_j - m); with kKeep the logits become those exps.
template <bool kKeep, typename T>
__device__ float block_row_sum_exps(T* l, int64_t V, float m, float* scratch) {
  float s = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float e = expf(to_f32(l[j]) - m);
    if constexpr (kKeep) l[j] = from_f32<T>(e);
    s += e;
  }
  return block_sum(s, scratch);
}

template <typename T>
__global__ void row_max_kernel(float* rowmax, const T* logits, int64_t V) {
  MB_SHARED_ARRAY(float, scratch, 32);
  const float m = block_row_max(logits + blockIdx.x * V, V, scratch);
  if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}

// sumexp = sum_j exp(l_j - max) per row; with kKeep the logits become those exps.
template <typename T, bool kKeep>
__global__ void sum_exp_kernel(float* sumexp, T* logits, const float* rowmax, int64_t V) {
  MB_SHARED_ARRAY(float, scratch, 32);
  const float s = block_row_sum_exps<kKeep>(logits + blockIdx.x * V, V, rowmax[blockIdx.x], scratch);
  if (threadIdx.x == 0) sumexp[blockIdx.x] = s;
}

template <typename T>
__global__ void target_logit_kernel(float* target, const T* logits, const int32_t* targets, int64_t n, int64_t V,
                                    int64_t v_begin) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t t = static_cast<int64_t>(targets[i]) - v_begin;
  target[i] = (t >= 0 && t < V) ? to_f32(logits[i * V + t]) : 0.0f;
}

__global__ void loss_kernel(float* losses, const float* rowmax, const float* sumexp, const float* target,
                            const int32_t* targets, int64_t n, int32_t ignore) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  losses[i] = targets[i] == ignore ? 0.0f : logf(sumexp[i]) + rowmax[i] - target[i];
}

template <typename T>
__global__ void ce_backward_kernel(T* dlogits, const T* logits, const float* rowmax, const float* sumexp,
                                   const int32_t* targets, int64_t V, int64_t v_begin, int32_t ignore, float scale,
                                   const float* loss_scale) {
  const int64_t i = blockIdx.x;
  if (targets[i] == ignore) return;
  const float dloss = scale * (loss_scale ? loss_scale[0] : 1.0f);
  const float m = rowmax[i], g = dloss / sumexp[i];
  const int64_t t = static_cast<int64_t>(targets[i]) - v_begin;
  const T* l = logits + i * V;
  T* d = dlogits + i * V;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    float v = to_f32(d[j]) + g * expf(to_f32(l[j]) - m);
    if (j == t) v -= dloss;
    d[j] = from_f32<T>(v);
  }
}

// Each element is read and then written by the same thread: dlogits may be exps.
template <typename T>
__global__ void backward_exps_kernel(T* dlogits, const T* exps, const float* sumexp, const int32_t* targets,
                                     int64_t V, int64_t v_begin, int32_t ignore, float scale, const float* loss_scale) {
  const int64_t i = blockIdx.x;
  const bool counted = targets[i] != ignore;
  const float dloss = scale * (loss_scale ? loss_scale[0] : 1.0f);
  const float g = counted ? dloss / sumexp[i] : 0.0f;
  const int64_t t = counted ? static_cast<int64_t>(targets[i]) - v_begin : -1;
  const T* e = exps + i * V;
  T* d = dlogits + i * V;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    float v = g * to_f32(e[j]);
    if (j == t) v -= dloss;
    d[j] = from_f32<T>(v);
  }
}

// ce_whole_rows: a block per row, no temporaries, two reads of the row and at most one
// write, where the pieces make three reads and two writes over five launches. The first read
// keeps each thread's running max and its sum of exps relative to it (rescaled when the max
// grows), combined over the block in a fixed order; with the gradient, the second read
// writes it over the row, each exp recomputed in f32. V elements a thread at a time (16
// bytes, common.cuh's Pack) where the rows allow, the rest one by one. Blocks of 1024
// threads keep at most two rows per SM in flight (an H100: 264 rows, 26 MiB of bf16 rows
// 50,304 wide, inside its 50 MiB L2), so the second read can come from L2.
constexpr int kWholeRowThreads = 1024;

// (m, s) <- the running max and sum of exps after one more logit x. A NaN leaves the max
// and poisons the sum, as in the pieces; a -inf adds nothing, also while the max is -inf.
__device__ __forceinline__ void online_add(float& m, float& s, float x) {
  if (x > m) {
    s = s * expf(m - x);  // m = -inf: s is 0 (or NaN) and stays so
    m = x;
  }
  if (m != -INFINITY || x != x) s += expf(x - m);
}

template <typename T, int V>
__global__ void __launch_bounds__(kWholeRowThreads) whole_rows_kernel(float* losses, T* logits, const int32_t* targets,
                                                                      int64_t cols, int32_t ignore, bool grad,
                                                                      float scale, const float* loss_scale) {
  using P = Pack<T, V>;
  MB_SHARED_ARRAY(float, scratch, 32);
  const int64_t i = blockIdx.x, packs = cols / V;
  T* l = logits + i * cols;
  float m = -INFINITY, s = 0.0f;
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const P x = reinterpret_cast<const P*>(l)[p];
#pragma unroll
    for (int k = 0; k < V; ++k) online_add(m, s, to_f32(x.v[k]));
  }
  for (int64_t j = packs * V + threadIdx.x; j < cols; j += blockDim.x) online_add(m, s, to_f32(l[j]));
  const float row_max = block_max(m, scratch);
  const float s_rel = s == 0.0f ? 0.0f : s * expf(m - row_max);  // a NaN stays
  const int64_t t = targets[i];
  const bool counted = targets[i] != ignore;
  // read by every thread before the barrier in block_sum, so before any thread writes below
  const float target = (t >= 0 && t < cols) ? to_f32(l[t]) : 0.0f;
  const float sum = block_sum(s_rel, scratch);
  if (threadIdx.x == 0) losses[i] = counted ? logf(sum) + row_max - target : 0.0f;
  if (!grad) return;
  const float dloss = scale * (loss_scale ? loss_scale[0] : 1.0f);
  const float g = counted ? dloss / sum : 0.0f;
  const int64_t tc = counted ? t : -1;
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    P x = reinterpret_cast<const P*>(l)[p];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float v = g * expf(to_f32(x.v[k]) - row_max);
      if (p * V + k == tc) v -= dloss;
      x.v[k] = from_f32<T>(v);
    }
    reinterpret_cast<P*>(l)[p] = x;
  }
  for (int64_t j = packs * V + threadIdx.x; j < cols; j += blockDim.x) {
    float v = g * expf(to_f32(l[j]) - row_max);
    if (j == tc) v -= dloss;
    l[j] = from_f32<T>(v);
  }
}

template <bool kKeep>
void sum_exps(const Tensor& sumexp, const Tensor& logits, const Tensor& rowmax) {
  const int64_t n = logits.dim(0), V = logits.dim(1);
  if (n == 0) return;
  constexpr const Accepts& row = kKeep ? accepts::ce_exps_logits : accepts::ce_sum_exp_logits;
  with_type<row.cuda.bits>(logits.dtype(), row.op, [&](auto zero) {
    using T = decltype(zero);
    launch(sum_exp_kernel<T, kKeep>, dim3(static_cast<unsigned>(n)), kThreads, 0, stream_of(logits), "sum_exp_kernel",
           ptr<float>(sumexp), ptr<T>(logits), ptr<float>(rowmax), V);
  });
}

}  // namespace

void ce_row_max(const Tensor& rowmax, const Tensor& logits) {
  const int64_t n = logits.dim(0), V = logits.dim(1);
  if (n == 0) return;
  with_type<accepts::ce_row_max_logits.cuda.bits>(logits.dtype(), "ce_row_max", [&](auto zero) {
    using T = decltype(zero);
    launch(row_max_kernel<T>, dim3(static_cast<unsigned>(n)), kThreads, 0, stream_of(logits), "row_max_kernel",
           ptr<float>(rowmax), ptr<T>(logits), V);
  });
}

void ce_sum_exp(const Tensor& sumexp, const Tensor& logits, const Tensor& rowmax) {
  sum_exps<false>(sumexp, logits, rowmax);
}

void ce_target_logit(const Tensor& target, const Tensor& logits, const Tensor& targets, int64_t v_begin) {
  const int64_t n = logits.dim(0), V = logits.dim(1);
  if (n == 0) return;
  with_type<accepts::ce_target_logit_logits.cuda.bits>(logits.dtype(), "ce_target_logit", [&](auto zero) {
    using T = decltype(zero);
    launch(target_logit_kernel<T>, dim3(blocks_for(n, 128)), 128, 0, stream_of(logits), "target_logit_kernel",
           ptr<float>(target), ptr<T>(logits), ptr<int32_t>(targets), n, V, v_begin);
  });
}

void ce_loss(const Tensor& losses, const Tensor& rowmax, const Tensor& sumexp, const Tensor& target,
             const Tensor& targets, int32_t ignore) {
  const int64_t n = static_cast<int64_t>(losses.numel());
  if (n == 0) return;
  static_assert(takes_only<accepts::ce_loss_losses.cuda.bits, float>(), "loss_kernel reads f32 losses");
  launch(loss_kernel, dim3(blocks_for(n, 128)), 128, 0, stream_of(losses), "loss_kernel", ptr<float>(losses),
         ptr<float>(rowmax), ptr<float>(sumexp), ptr<float>(target), ptr<int32_t>(targets), n, ignore);
}

void ce_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& rowmax, const Tensor& sumexp,
                 const Tensor& targets, int64_t v_begin, int32_t ignore, float scale, const Tensor& loss_scale) {
  const int64_t n = logits.dim(0), V = logits.dim(1);
  if (n == 0) return;
  with_type<accepts::ce_backward_logits.cuda.bits>(logits.dtype(), "ce_backward", [&](auto zero) {
    using T = decltype(zero);
    launch(ce_backward_kernel<T>, dim3(static_cast<unsigned>(n)), kThreads, 0, stream_of(logits), "ce_backward_kernel",
           ptr<T>(dlogits), ptr<T>(logits), ptr<float>(rowmax), ptr<float>(sumexp), ptr<int32_t>(targets), V, v_begin,
           ignore, scale, ptr<float>(loss_scale));
  });
}

void ce_exps(const Tensor& sumexp, const Tensor& logits, const Tensor& rowmax) {
  sum_exps<true>(sumexp, logits, rowmax);
}

void ce_backward_exps(const Tensor& dlogits, const Tensor& exps, const Tensor& sumexp, const Tensor& targets,
                      int64_t v_begin, int32_t ignore, float scale, const Tensor& loss_scale) {
  const int64_t n = exps.dim(0), V = exps.dim(1);
  if (n == 0) return;
  with_type<accepts::ce_backward_exps_exps.cuda.bits>(exps.dtype(), "ce_backward_exps", [&](auto zero) {
    using T = decltype(zero);
    launch(backward_exps_kernel<T>, dim3(static_cast<unsigned>(n)), kThreads, 0, stream_of(exps),
           "backward_exps_kernel", ptr<T>(dlogits), ptr<T>(exps), ptr<float>(sumexp), ptr<int32_t>(targets), V, v_begin,
           ignore, scale, ptr<float>(loss_scale));
  });
}

void ce_whole_rows(const Tensor& losses, const Tensor& logits, const Tensor& targets, int32_t ignore, bool grad,
                   float scale, const Tensor& loss_scale) {
  const int64_t n = logits.dim(0), V = logits.dim(1);
  if (n == 0) return;
  // the losses follow the logits (their accumulator type): f32 for every dtype a GPU takes
  static_assert(!DTypes::of_bits(accepts::ce_whole_rows_logits.cuda.bits).has(DType::kF64), "f32 losses only");
  with_type<accepts::ce_whole_rows_logits.cuda.bits>(logits.dtype(), "ce_whole_rows", [&](auto zero) {
    using T = decltype(zero);
    constexpr int W = kVec<T>;  // rows of whole 16-byte vectors: every row starts aligned
    if (V % W == 0 && aligned16(ptr<T>(logits)))
      launch(whole_rows_kernel<T, W>, dim3(static_cast<unsigned>(n)), kWholeRowThreads, 0, stream_of(logits),
             "whole_rows_kernel", ptr<float>(losses), ptr<T>(logits), ptr<int32_t>(targets), V, ignore, grad, scale,
             ptr<float>(loss_scale));
    else
      launch(whole_rows_kernel<T, 1>, dim3(static_cast<unsigned>(n)), kWholeRowThreads, 0, stream_of(logits),
             "whole_rows_kernel", ptr<float>(losses), ptr<T>(logits), ptr<int32_t>(targets), V, ignore, grad, scale,
             ptr<float>(loss_scale));
  });
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
