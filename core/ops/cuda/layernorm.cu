// LayerNorm and RMSNorm on a GPU: a block per row for the forward and for din; the
// parameter gradients in two fixed-order passes over row chunks (no atomics).
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

namespace megabatch::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunkRows = 64;

// out = (x - mean) rstd w + b, or with rms: x rstd w. mean is null for RMSNorm.
template <typename T, bool kRms>
__global__ void norm_forward_kernel(T* out, float* mean, float* rstd, const T* in, const T* w, const T* b, int64_t C,
                                    float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* x = in + row * C;
  float m = 0;
  if (!kRms) {
    float s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += to_f32(x[c]);
    m = block_sum(s, scratch) / static_cast<float>(C);
  }
  float v = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = to_f32(x[c]) - m;
    v += d * d;
  }
  const float r = rsqrtf(block_sum(v, scratch) / static_cast<float>(C) + eps);
  T* y = out + row * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float xh = (to_f32(x[c]) - m) * r;
    y[c] = from_f32<T>(kRms ? xh * to_f32(w[c]) : xh * to_f32(w[c]) + to_f32(b[c]));
  }
  if (threadIdx.x == 0) {
    if (!kRms) mean[row] = m;
    rstd[row] = r;
  }
}

// din += rstd (g - mean(g) - xhat mean(g xhat)), g = dout w (RMSNorm: no mean(g) term).
template <typename T, bool kRms>
__global__ void norm_din_kernel(T* din, const T* dout, const T* in, const T* w, const float* mean, const float* rstd,
                                int64_t C) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* x = in + row * C;
  const T* dy = dout + row * C;
  const float m = kRms ? 0.0f : mean[row], r = rstd[row];
  float sg = 0, sgx = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = to_f32(dy[c]) * to_f32(w[c]);
    sg += g;
    sgx += g * (to_f32(x[c]) - m) * r;
  }
  sg = kRms ? 0.0f : block_sum(sg, scratch) / static_cast<float>(C);
  sgx = block_sum(sgx, scratch) / static_cast<float>(C);
  T* dx = din + row * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float xh = (to_f32(x[c]) - m) * r;
    dx[c] = from_f32<T>(to_f32(dx[c]) + r * (to_f32(dy[c]) * to_f32(w[c]) - sg - xh * sgx));
  }
}

// Partial parameter gradients of rows [k R, (k + 1) R): pw[k][c] = sum dy xhat, pb[k][c] = sum dy.
template <typename T, bool kRms>
__global__ void norm_param_partials_kernel(float* pw, float* pb, const T* dout, const T* in, const float* mean,
                                           const float* rstd, int64_t n, int64_t C) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t r0 = blockIdx.y * kChunkRows, r1 = min(n, r0 + kChunkRows);
  float sw = 0, sb = 0;
  for (int64_t i = r0; i < r1; ++i) {
    const float dy = to_f32(dout[i * C + c]);
    const float xh = (to_f32(in[i * C + c]) - (kRms ? 0.0f : mean[i])) * rstd[i];
    sw += dy * xh;
    sb += dy;
  }
  pw[blockIdx.y * C + c] = sw;
  if (pb) pb[blockIdx.y * C + c] = sb;
}

__global__ void add_chunk_sums_kernel(float* out, const float* partial, int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float s = 0;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * C + c];
  out[c] += s;
}

int64_t rows(const Tensor& t) { return static_cast<int64_t>(t.numel()) / t.shape().back(); }

template <bool kRms>
void forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in, const Tensor& weight,
             const Tensor& bias, double eps) {
  const int64_t n = rows(in), C = in.shape().back();
  if (n == 0) return;
  constexpr const Accepts& row = kRms ? accepts::rmsnorm_forward_in : accepts::layernorm_forward_in;
  with_type<row.cuda.bits>(in.dtype(), row.op, [&](auto zero) {
    using T = decltype(zero);
    norm_forward_kernel<T, kRms><<<static_cast<unsigned>(n), kThreads, 0, stream_of(in)>>>(
        ptr<T>(out), ptr<float>(mean), ptr<float>(rstd), ptr<T>(in), ptr<T>(weight), ptr<T>(bias), C,
        static_cast<float>(eps));
    MB_CUDA_LAUNCHED("norm_forward_kernel");
  });
}

template <bool kRms>
void backward(const Tensor& din, const Tensor& dweight, const Tensor& dbias, const Tensor& dout, const Tensor& in,
              const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  const int64_t n = rows(in), C = in.shape().back();
  if (n == 0) return;
  const cudaStream_t s = stream_of(in);
  constexpr const Accepts& row = kRms ? accepts::rmsnorm_backward_in : accepts::layernorm_backward_in;
  with_type<row.cuda.bits>(in.dtype(), row.op, [&](auto zero) {
    using T = decltype(zero);
    if (din.defined()) {
      norm_din_kernel<T, kRms><<<static_cast<unsigned>(n), kThreads, 0, s>>>(ptr<T>(din), ptr<T>(dout), ptr<T>(in),
                                                                              ptr<T>(weight), ptr<float>(mean),
                                                                              ptr<float>(rstd), C);
      MB_CUDA_LAUNCHED("norm_din_kernel");
    }
    if (!dweight.defined() && !dbias.defined()) return;
    const int64_t chunks = (n + kChunkRows - 1) / kChunkRows;
    Tensor pw({chunks, C}, DType::kF32, in.device()), pb;
    if (dbias.defined()) pb.resize({chunks, C}, DType::kF32, in.device());
    const dim3 grid(static_cast<unsigned>((C + 127) / 128), static_cast<unsigned>(chunks));
    norm_param_partials_kernel<T, kRms><<<grid, 128, 0, s>>>(ptr<float>(pw), ptr<float>(pb), ptr<T>(dout), ptr<T>(in),
                                                              ptr<float>(mean), ptr<float>(rstd), n, C);
    MB_CUDA_LAUNCHED("norm_param_partials_kernel");
    if (dweight.defined()) {
      add_chunk_sums_kernel<<<blocks_for(C, 128), 128, 0, s>>>(ptr<float>(dweight), ptr<float>(pw), chunks, C);
      MB_CUDA_LAUNCHED("add_chunk_sums_kernel");
    }
    if (dbias.defined()) {
      add_chunk_sums_kernel<<<blocks_for(C, 128), 128, 0, s>>>(ptr<float>(dbias), ptr<float>(pb), chunks, C);
      MB_CUDA_LAUNCHED("add_chunk_sums_kernel");
    }
  });
}

}  // namespace

void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in,
                       const Tensor& weight, const Tensor& bias, double eps) {
  forward<false>(out, mean, rstd, in, weight, bias, eps);
}

void layernorm_backward(const Tensor& din, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& in, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  backward<false>(din, dweight, dbias, dout, in, weight, mean, rstd);
}

void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& weight, double eps) {
  forward<true>(out, Tensor(), rstd, in, weight, Tensor(), eps);
}

void rmsnorm_backward(const Tensor& din, const Tensor& dweight, const Tensor& dout, const Tensor& in,
                      const Tensor& weight, const Tensor& rstd) {
  backward<true>(din, dweight, Tensor(), dout, in, weight, Tensor(), rstd);
}

}  // namespace megabatch::ops::cuda
