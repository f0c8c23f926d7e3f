// LayerNorm and RMSNorm on a GPU. The forward and din: a warp per row, the row in
// registers, 16 bytes a load (common.cuh's Pack), where the rows are whole vectors of at
// most kMaxPacks x 32 vectors (bf16: 2,048 columns; GPT-2's 768 and BERT-large's 1,024 among
// them); otherwise a block per row. The parameter gradients in two fixed-order passes over
// row chunks (no atomics).
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

#include <type_traits>

namespace megabatch::ops::MB_CUDA_BACKEND {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunkRows = 64;

constexpr int kRowWarps = 8;  // rows (warps) a block of the warp-per-row kernels
constexpr int kMaxPacks = 8;  // 16-byte vectors a lane holds, at most

// Loads the kPacks vectors of a row (C / V of them) that lane `lane` holds, as f32: vector
// lane + 32 k; those past the row's end read as 0 (and are never stored).
template <typename T, int V, int kPacks>
__device__ __forceinline__ void load_row(float (&x)[kPacks][V], const T* row, int64_t packs, int lane) {
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int64_t p = lane + 32 * k;
    if (p < packs) {
      const Pack<T, V> v = reinterpret_cast<const Pack<T, V>*>(row)[p];
#pragma unroll
      for (int e = 0; e < V; ++e) x[k][e] = to_f32(v.v[e]);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) x[k][e] = 0.0f;
    }
  }
}

// The forward, a warp per row (see the top). kResidual: the row is in + in2, rounded to T as
// residual_forward rounds it, and written to sum.
template <typename T, bool kRms, int kPacks, bool kResidual>
__global__ void __launch_bounds__(32 * kRowWarps) norm_forward_rows_kernel(T* out, float* mean, float* rstd, const T* in,
                                                                           const T* w, const T* b, int64_t n, int64_t C,
                                                                           float eps, T* sum, const T* in2) {
  constexpr int V = kVec<T>;
  using P = Pack<T, V>;
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowWarps) + threadIdx.x / 32, packs = C / V;
  if (row >= n) return;
  float x[kPacks][V];
  load_row<T, V, kPacks>(x, in + row * C, packs, lane);
  if constexpr (kResidual) {
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int64_t p = lane + 32 * k;
      if (p >= packs) continue;
      const P y = reinterpret_cast<const P*>(in2 + row * C)[p];
      P s;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        s.v[e] = from_f32<T>(x[k][e] + to_f32(y.v[e]));
        x[k][e] = to_f32(s.v[e]);
      }
      reinterpret_cast<P*>(sum + row * C)[p] = s;
    }
  }
  float m = 0;
  if (!kRms) {
    float s = 0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e) s += x[k][e];
    m = warp_sum(s) / static_cast<float>(C);
  }
  float v = 0;
#pragma unroll
  for (int k = 0; k < kPacks; ++k)
    if (lane + 32 * k < packs)
#pragma unroll
      for (int e = 0; e < V; ++e) v += (x[k][e] - m) * (x[k][e] - m);
  const float r = rsqrtf(warp_sum(v) / static_cast<float>(C) + eps);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int64_t p = lane + 32 * k;
    if (p >= packs) continue;
    const P wv = reinterpret_cast<const P*>(w)[p];
    P bv;
    if (!kRms) bv = reinterpret_cast<const P*>(b)[p];
    P y;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float xh = (x[k][e] - m) * r;
      y.v[e] = from_f32<T>(kRms ? xh * to_f32(wv.v[e]) : xh * to_f32(wv.v[e]) + to_f32(bv.v[e]));
    }
    reinterpret_cast<P*>(out + row * C)[p] = y;
  }
  if (lane == 0) {
    if (!kRms) mean[row] = m;
    rstd[row] = r;
  }
}

// din += rstd (g - mean(g) - xhat mean(g xhat)), g = dout w, a warp per row (see the top).
template <typename T, bool kRms, int kPacks>
__global__ void __launch_bounds__(32 * kRowWarps) norm_din_rows_kernel(T* din, const T* dout, const T* in, const T* w,
                                                                       const float* mean, const float* rstd, int64_t n,
                                                                       int64_t C) {
  constexpr int V = kVec<T>;
  using P = Pack<T, V>;
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowWarps) + threadIdx.x / 32, packs = C / V;
  if (row >= n) return;
  const float m = kRms ? 0.0f : mean[row], r = rstd[row];
  float g[kPacks][V], xh[kPacks][V];
  load_row<T, V, kPacks>(g, dout + row * C, packs, lane);
  load_row<T, V, kPacks>(xh, in + row * C, packs, lane);
  float sg = 0, sgx = 0;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int64_t p = lane + 32 * k;
    if (p >= packs) continue;
    const P wv = reinterpret_cast<const P*>(w)[p];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      g[k][e] *= to_f32(wv.v[e]);
      xh[k][e] = (xh[k][e] - m) * r;
      sg += g[k][e];
      sgx += g[k][e] * xh[k][e];
    }
  }
  sg = kRms ? 0.0f : warp_sum(sg) / static_cast<float>(C);
  sgx = warp_sum(sgx) / static_cast<float>(C);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int64_t p = lane + 32 * k;
    if (p >= packs) continue;
    P d = reinterpret_cast<const P*>(din + row * C)[p];
#pragma unroll
    for (int e = 0; e < V; ++e) d.v[e] = from_f32<T>(to_f32(d.v[e]) + r * (g[k][e] - sg - xh[k][e] * sgx));
    reinterpret_cast<P*>(din + row * C)[p] = d;
  }
}

// The vectors a lane holds for rows of C columns of T: 1, 2, 4 or 8, or 0 where the rows
// are not whole vectors, start unaligned or are too wide (the block-per-row kernels).
template <typename T, typename... P>
int packs_per_lane(int64_t C, const P*... pointers) {
  constexpr int V = kVec<T>;
  if (C % V != 0 || !aligned16(pointers...)) return 0;
  const int64_t per_lane = (C / V + 31) / 32;
  for (int k = 1; k <= kMaxPacks; k *= 2)
    if (per_lane <= k) return k;
  return 0;
}

// Calls fn(std::integral_constant<int, K>{}) for K = kpl (1, 2, 4 or 8).
template <typename Fn>
void with_packs(int kpl, Fn&& fn) {
  switch (kpl) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    default: return fn(std::integral_constant<int, 8>{});
  }
}

// out = (x - mean) rstd w + b, or with rms: x rstd w. mean is null for RMSNorm.
template <typename T, bool kRms>
__global__ void norm_forward_kernel(T* out, float* mean, float* rstd, const T* in, const T* w, const T* b, int64_t C,
                                    float eps) {
  MB_SHARED_ARRAY(float, scratch, 32);
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
  MB_SHARED_ARRAY(float, scratch, 32);
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
    const int kpl = packs_per_lane<T>(C, ptr<T>(out), ptr<T>(in), ptr<T>(weight), ptr<T>(bias));
    if (kpl > 0) {
      with_packs(kpl, [&](auto k) {
        launch(norm_forward_rows_kernel<T, kRms, decltype(k)::value, false>, dim3(blocks_for(n, kRowWarps, n)),
               32 * kRowWarps, 0, stream_of(in), "norm_forward_rows_kernel", ptr<T>(out), ptr<float>(mean),
               ptr<float>(rstd), ptr<T>(in), ptr<T>(weight), ptr<T>(bias), n, C, static_cast<float>(eps),
               static_cast<T*>(nullptr), static_cast<const T*>(nullptr));
      });
      return;
    }
    launch(norm_forward_kernel<T, kRms>, dim3(static_cast<unsigned>(n)), kThreads, 0, stream_of(in),
           "norm_forward_kernel", ptr<T>(out), ptr<float>(mean), ptr<float>(rstd), ptr<T>(in), ptr<T>(weight),
           ptr<T>(bias), C, static_cast<float>(eps));
  });
}

// sum = a + b, then the forward of sum: in one pass where the warp-per-row kernel takes the
// rows, else residual_forward and forward.
template <bool kRms>
void residual_forward_norm(const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& a,
                           const Tensor& b, const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t n = rows(a), C = a.shape().back();
  if (n == 0) return;
  constexpr const Accepts& row = kRms ? accepts::rmsnorm_residual_forward_a : accepts::layernorm_residual_forward_a;
  static_assert(row.cuda == (kRms ? accepts::rmsnorm_forward_in : accepts::layernorm_forward_in).cuda,
                "the unfused path takes what the fused one does");
  bool fused = false;
  with_type<row.cuda.bits>(a.dtype(), row.op, [&](auto zero) {
    using T = decltype(zero);
    const int kpl = packs_per_lane<T>(C, ptr<T>(sum), ptr<T>(out), ptr<T>(a), ptr<T>(b), ptr<T>(weight), ptr<T>(bias));
    if (kpl == 0) return;
    with_packs(kpl, [&](auto k) {
      launch(norm_forward_rows_kernel<T, kRms, decltype(k)::value, true>, dim3(blocks_for(n, kRowWarps, n)),
             32 * kRowWarps, 0, stream_of(a), "norm_forward_rows_kernel (residual)", ptr<T>(out), ptr<float>(mean),
             ptr<float>(rstd), ptr<T>(a), ptr<T>(weight), ptr<T>(bias), n, C, static_cast<float>(eps), ptr<T>(sum),
             static_cast<const T*>(ptr<T>(b)));
    });
    fused = true;
  });
  if (fused) return;
  residual_forward(sum, a, b);
  forward<kRms>(out, mean, rstd, sum, weight, bias, eps);
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
      const int kpl = packs_per_lane<T>(C, ptr<T>(din), ptr<T>(dout), ptr<T>(in), ptr<T>(weight));
      if (kpl > 0) {
        with_packs(kpl, [&](auto k) {
          launch(norm_din_rows_kernel<T, kRms, decltype(k)::value>, dim3(blocks_for(n, kRowWarps, n)), 32 * kRowWarps,
                 0, s, "norm_din_rows_kernel", ptr<T>(din), ptr<T>(dout), ptr<T>(in), ptr<T>(weight), ptr<float>(mean),
                 ptr<float>(rstd), n, C);
        });
      } else {
        launch(norm_din_kernel<T, kRms>, dim3(static_cast<unsigned>(n)), kThreads, 0, s, "norm_din_kernel", ptr<T>(din),
               ptr<T>(dout), ptr<T>(in), ptr<T>(weight), ptr<float>(mean), ptr<float>(rstd), C);
      }
    }
    if (!dweight.defined() && !dbias.defined()) return;
    const int64_t chunks = (n + kChunkRows - 1) / kChunkRows;
    Tensor pw({chunks, C}, DType::kF32, in.device()), pb;
    if (dbias.defined()) pb.resize({chunks, C}, DType::kF32, in.device());
    const dim3 grid(static_cast<unsigned>((C + 127) / 128), static_cast<unsigned>(chunks));
    launch(norm_param_partials_kernel<T, kRms>, grid, 128, 0, s, "norm_param_partials_kernel", ptr<float>(pw),
           ptr<float>(pb), ptr<T>(dout), ptr<T>(in), ptr<float>(mean), ptr<float>(rstd), n, C);
    if (dweight.defined())
      launch(add_chunk_sums_kernel, dim3(blocks_for(C, 128)), 128, 0, s, "add_chunk_sums_kernel", ptr<float>(dweight),
             ptr<float>(pw), chunks, C);
    if (dbias.defined())
      launch(add_chunk_sums_kernel, dim3(blocks_for(C, 128)), 128, 0, s, "add_chunk_sums_kernel", ptr<float>(dbias),
             ptr<float>(pb), chunks, C);
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

void layernorm_residual_forward(const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias, double eps) {
  residual_forward_norm<false>(sum, out, mean, rstd, a, b, weight, bias, eps);
}

void rmsnorm_residual_forward(const Tensor& sum, const Tensor& out, const Tensor& rstd, const Tensor& a,
                              const Tensor& b, const Tensor& weight, double eps) {
  residual_forward_norm<true>(sum, out, Tensor(), rstd, a, b, weight, Tensor(), eps);
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
