// The gradient chores on a GPU: one pass for unscale + inf check (per-block flags combined
// in order), the norm from fixed-order partial sums, one-thread kernels for the scalars.
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

namespace megabatch::ops::MB_CUDA_BACKEND {

// The arguments these kernels read as one type (raw pointers), as their rows in
// core/ops/accepts.inc say: a row that widened would not build.
static_assert(takes_only<accepts::unscale_and_check_grads.cuda.bits, float>() &&
              takes_only<accepts::unscale_and_check_found_inf.cuda.bits, float>() &&
              takes_only<accepts::unscale_and_check_scaler.cuda.bits, float>() &&
              takes_only<accepts::loss_scaler_update_scaler.cuda.bits, float>() &&
              takes_only<accepts::loss_scaler_update_found_inf.cuda.bits, float>() &&
              takes_only<accepts::split_sum_squares_x.cuda.bits, float>() &&
              takes_only<accepts::split_sum_squares_out.cuda.bits, double>() &&
              takes_only<accepts::split_sum_squares_of_growth_x.cuda.bits, float>() &&
              takes_only<accepts::split_sum_squares_of_growth_out.cuda.bits, double>() &&
              takes_only<accepts::clip_coefficient_norm.cuda.bits, double>() &&
              takes_only<accepts::clip_coefficient_sums.cuda.bits, double>() &&
              takes_only<accepts::scale_by_x.cuda.bits, float>() &&
              takes_only<accepts::scale_by_factor.cuda.bits, double>());

namespace {

constexpr int kThreads = 256;

__global__ void unscale_kernel(float* g, int64_t n, const float* scaler, int* block_bad) {
  MB_SHARED_ARRAY(int, any, 1);
  if (threadIdx.x == 0) any[0] = 0;
  __syncthreads();
  const float inv = 1.0f / scaler[0];
  int bad = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = g[i];
    bad |= !isfinite(v);
    g[i] = v * inv;
  }
  if (bad) any[0] = 1;  // a benign race: every writer writes 1
  __syncthreads();
  if (threadIdx.x == 0) block_bad[blockIdx.x] = any[0];
}

__global__ void any_kernel(float* found_inf, const int* block_bad, int blocks) {
  int bad = 0;
  for (int b = 0; b < blocks; ++b) bad |= block_bad[b];
  found_inf[0] = bad ? 1.0f : 0.0f;
}

__global__ void scaler_kernel(float* s, const float* found_inf, ops::LossScalerConfig c) {
  ops::LossScalerState st{s[0], s[1], s[2]};
  ops::update_loss_scale(st, found_inf[0] != 0.0f, c);
  s[0] = st.scale;
  s[1] = st.growth_tracker;
  s[2] = st.hysteresis_tracker;
}

__global__ void add_segments_kernel(double* out, const double* per, int64_t sharded, int64_t total) {
  double a = 0, b = 0;
  for (int64_t s = 0; s < sharded; ++s) a += per[s];
  for (int64_t s = sharded; s < total; ++s) b += per[s];
  out[0] = a;
  out[1] = b;
}

__global__ void clip_kernel(double* norm, const double* sums, double max_norm) {
  const double n = sqrt(sums[0] + sums[1]);
  const double coeff = max_norm > 0 ? fmin(1.0, max_norm / (n + 1e-6)) : 1.0;
  norm[0] = n;
  norm[1] = coeff;
  norm[2] = n * coeff;
}

__global__ void scale_by_kernel(float* x, int64_t n, const double* factor, size_t index) {
  const float c = static_cast<float>(factor[index]);
  if (c == 1.0f) return;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] *= c;
}

}  // namespace

void unscale_and_check(const Tensor& grads, const Tensor& found_inf, const Tensor& scaler) {
  const int64_t n = static_cast<int64_t>(grads.numel());
  const int blocks = blocks_for(n, kThreads, 4096);
  Tensor flags({blocks}, DType::kI32, grads.device());
  launch(unscale_kernel, dim3(blocks), kThreads, 0, stream_of(grads), "unscale_kernel", ptr<float>(grads), n,
         ptr<float>(scaler), ptr<int32_t>(flags));
  launch(any_kernel, dim3(1), 1, 0, stream_of(grads), "any_kernel", ptr<float>(found_inf), ptr<int32_t>(flags), blocks);
}

void loss_scaler_update(const Tensor& scaler, const Tensor& found_inf, const ops::LossScalerConfig& config) {
  launch(scaler_kernel, dim3(1), 1, 0, stream_of(scaler), "scaler_kernel", ptr<float>(scaler), ptr<float>(found_inf),
         config);
}

namespace {

// out[0], out[1] = the totals over the sharded and the replicated segments of what
// segment_sums(per, segments) gives per segment (f64 (S)), each added in parameter order
template <typename SegmentSums>
void split_totals(const Tensor& out, const Tensor& x, const std::vector<std::pair<size_t, size_t>>& sharded,
                  const std::vector<std::pair<size_t, size_t>>& replicated, SegmentSums segment_sums) {
  std::vector<std::pair<size_t, size_t>> all = sharded;
  all.insert(all.end(), replicated.begin(), replicated.end());
  Tensor per({static_cast<int64_t>(std::max<size_t>(all.size(), 1))}, DType::kF64, x.device());
  segment_sums(per.flat(0, all.size()), all);
  launch(add_segments_kernel, dim3(1), 1, 0, stream_of(x), "add_segments_kernel", ptr<double>(out), ptr<double>(per),
         static_cast<int64_t>(sharded.size()), static_cast<int64_t>(all.size()));
}

}  // namespace

void split_sum_squares(const Tensor& out, const Tensor& x, const std::vector<std::pair<size_t, size_t>>& sharded,
                       const std::vector<std::pair<size_t, size_t>>& replicated) {
  split_totals(out, x, sharded, replicated,
               [&](const Tensor& per, const auto& all) { segment_sum_squares(per, x, all); });
}

void split_sum_squares_of_growth(const Tensor& out, const Tensor& x, const Tensor& prev,
                                 const std::vector<std::pair<size_t, size_t>>& sharded,
                                 const std::vector<std::pair<size_t, size_t>>& replicated) {
  split_totals(out, x, sharded, replicated,
               [&](const Tensor& per, const auto& all) { segment_sum_squares_of_growth(per, x, prev, all); });
}

void clip_coefficient(const Tensor& norm, const Tensor& sums, double max_norm) {
  launch(clip_kernel, dim3(1), 1, 0, stream_of(norm), "clip_kernel", ptr<double>(norm), ptr<double>(sums), max_norm);
}

void scale_by(const Tensor& x, const Tensor& factor, size_t index) {
  const int64_t n = static_cast<int64_t>(x.numel());
  launch(scale_by_kernel, dim3(blocks_for(n, kThreads)), kThreads, 0, stream_of(x), "scale_by_kernel", ptr<float>(x), n,
         ptr<double>(factor), index);
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
