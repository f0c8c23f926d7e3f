// Attention on a GPU, the first version (llm.c's layout): q, k, v permuted to
// (B, H, T, D), the score and value products as strided-batched cuBLASLt GEMMs, and one
// fused kernel for scale + causal/padding mask + bias + softmax + dropout (a block per
// query row), and its backward (softmax backward that zeroes masked entries, dropout mask
// regenerated from Philox exactly as on the CPU). Scores and their gradients are f32;
// probabilities are saved in the activation dtype. A flash-style kernel can replace the
// core later behind the same API.
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"
#include "core/ops/cuda/gemm.h"
#include "core/util/philox.h"

namespace megabatch::ops::cuda {

// The arguments these kernels read as one type (raw pointers), as their rows in
// core/ops/accepts.inc say: a row that widened would not build.
static_assert(takes_only<accepts::attention_forward_key_mask.cuda.bits, uint8_t>() &&
              takes_only<accepts::attention_backward_key_mask.cuda.bits, uint8_t>() &&
              takes_only<accepts::cross_attention_forward_key_mask.cuda.bits, uint8_t>() &&
              takes_only<accepts::cross_attention_backward_key_mask.cuda.bits, uint8_t>() &&
              takes_only<accepts::attention_forward_documents.cuda.bits, int32_t>());

namespace {

constexpr int kThreads = 256;

struct Geometry {
  int64_t B, Tq, Tk, H, D;
  bool causal;
  int64_t head_offset, total_heads;
  const int32_t* documents = nullptr;  // self-attention's forward: (B, T), or null
};

struct DropoutArgs {
  bool on = false;
  uint64_t key = 0, stream = 0;
  uint32_t threshold = 0;
  float scale = 1.0f;
};

DropoutArgs dropout_args(const DropoutKey* d) {
  DropoutArgs a;
  if (!d || d->p <= 0) return a;
  a.on = true;
  a.key = d->key;
  a.stream = d->stream;
  a.threshold = static_cast<uint32_t>(static_cast<uint64_t>(d->p * 4294967296.0));
  a.scale = static_cast<float>(1.0 / (1.0 - d->p));
  return a;
}

// Whether element (b, h, i, j) of the probabilities is kept: the draw of its index in the
// full (B, total heads, Tq, Tk) tensor, as the CPU's block masks.
__device__ __forceinline__ bool kept(const DropoutArgs& d, const Geometry& g, int64_t b, int64_t h, int64_t i, int64_t j) {
  const uint64_t e = static_cast<uint64_t>(((b * g.total_heads + g.head_offset + h) * g.Tq + i) * g.Tk + j);
  const auto r = Philox4x32::generate(d.key, d.stream, e / 4);
  return r[e % 4] >= d.threshold;
}

__device__ __forceinline__ bool valid(const Geometry& g, const uint8_t* mask, int64_t b, int64_t i, int64_t j) {
  if (g.causal && j > i) return false;
  if (g.documents && g.documents[b * g.Tq + i] != g.documents[b * g.Tk + j]) return false;
  return !mask || mask[b * g.Tk + j] != 0;
}

// Where head h's vector sits in a token's row of the projection's output: its heads in groups
// of `per` (grouped-query attention; else 1), each group `stride` vectors of D, the vector at
// `which` within it (+ h % per for a group's queries). Self-attention: stride per + 2, q at 0,
// k at per, v at per + 1; cross-attention's kv: stride 2; q and out: stride 1.
struct Slot {
  int64_t stride, which;
  int64_t per = 1;
  bool query = false;
  __device__ __forceinline__ int64_t at(int64_t b, int64_t t, int64_t h, int64_t Tn, int64_t H, int64_t D) const {
    return ((b * Tn + t) * (H / per) + h / per) * stride * D + (which + (query ? h % per : 0)) * D;
  }
  // query heads that share one destination vector (a group's key or value)
  int64_t sharing() const { return query ? 1 : per; }
};

// src (B, T, ...) at `slot` -> dst (B, H, T, D)
template <typename T>
__global__ void to_heads_kernel(T* dst, const T* src, int64_t B, int64_t Tn, int64_t H, int64_t D, Slot slot) {
  const int64_t n = B * H * Tn * D;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, t = (e / D) % Tn, h = (e / (D * Tn)) % H, b = e / (D * Tn * H);
    dst[e] = src[slot.at(b, t, h, Tn, H, D) + d];
  }
}

// dst (B, T, ...) at `slot` (= or +=) src (B, H, T, D); where heads share a vector (a group's
// key or value), the sum of theirs in head order
template <typename T>
__global__ void from_heads_kernel(T* dst, const T* src, int64_t B, int64_t Tn, int64_t H, int64_t D, Slot slot,
                                  int64_t share, bool accumulate) {
  const int64_t U = H / share, n = B * U * Tn * D;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, t = (e / D) % Tn, u = (e / (D * Tn)) % U, b = e / (D * Tn * U);
    float sum = 0;
    for (int64_t i = 0; i < share; ++i) sum += to_f32(src[((b * H + u * share + i) * Tn + t) * D + d]);
    T& out = dst[slot.at(b, t, u * share, Tn, H, D) + d];
    out = from_f32<T>(accumulate ? to_f32(out) + sum : sum);
  }
}

// One block per query row (b, h, i): scores S (scaled) + bias, masked softmax -> probs,
// dropped probabilities -> dropped.
template <typename T>
__global__ void softmax_forward_kernel(T* probs, T* dropped, const float* scores, const T* bias, const uint8_t* mask,
                                       Geometry g, DropoutArgs d) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;  // (b * H + h) * Tq + i
  const int64_t i = row % g.Tq, h = (row / g.Tq) % g.H, b = row / (g.Tq * g.H);
  const float* s = scores + row * g.Tk;
  const T* bs = bias ? bias + (h * g.Tq + i) * g.Tk : nullptr;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < g.Tk; j += blockDim.x)
    if (valid(g, mask, b, i, j)) m = fmaxf(m, s[j] + (bs ? to_f32(bs[j]) : 0.0f));
  m = block_max(m, scratch);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < g.Tk; j += blockDim.x)
    if (valid(g, mask, b, i, j)) sum += expf(s[j] + (bs ? to_f32(bs[j]) : 0.0f) - m);
  sum = block_sum(sum, scratch);
  const float inv = m == -INFINITY ? 0.0f : 1.0f / sum;  // every key masked: probabilities 0
  T* p = probs + row * g.Tk;
  T* pd = dropped + row * g.Tk;
  for (int64_t j = threadIdx.x; j < g.Tk; j += blockDim.x) {
    const float v = valid(g, mask, b, i, j) && inv > 0 ? expf(s[j] + (bs ? to_f32(bs[j]) : 0.0f) - m) * inv : 0.0f;
    p[j] = from_f32<T>(v);
    pd[j] = from_f32<T>(d.on ? (kept(d, g, b, h, i, j) ? v * d.scale : 0.0f) : v);
  }
}

// Dropped probabilities from the saved ones (backward).
template <typename T>
__global__ void dropped_kernel(T* dropped, const T* probs, Geometry g, DropoutArgs d) {
  const int64_t n = g.B * g.H * g.Tq * g.Tk;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = e % g.Tk, i = (e / g.Tk) % g.Tq, h = (e / (g.Tk * g.Tq)) % g.H, b = e / (g.Tk * g.Tq * g.H);
    dropped[e] = from_f32<T>(kept(d, g, b, h, i, j) ? to_f32(probs[e]) * d.scale : 0.0f);
  }
}

// One block per row: dP = dropout backward of dP' (f32, in grad), dS = P (dP - sum P dP);
// ds_scaled = scale dS in the activation dtype (for the GEMMs); with keep_f32, dS (f32)
// overwrites grad (for the bias gradient).
template <typename T>
__global__ void softmax_backward_kernel(T* ds_scaled, float* grad, const T* probs, Geometry g, DropoutArgs d, float scale,
                                        bool keep_f32) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t i = row % g.Tq, h = (row / g.Tq) % g.H, b = row / (g.Tq * g.H);
  float* dp = grad + row * g.Tk;
  const T* p = probs + row * g.Tk;
  float dot = 0;
  for (int64_t j = threadIdx.x; j < g.Tk; j += blockDim.x) {
    const float v = d.on ? (kept(d, g, b, h, i, j) ? dp[j] * d.scale : 0.0f) : dp[j];
    dot += to_f32(p[j]) * v;
  }
  dot = block_sum(dot, scratch);
  T* out = ds_scaled + row * g.Tk;
  for (int64_t j = threadIdx.x; j < g.Tk; j += blockDim.x) {
    const float v = d.on ? (kept(d, g, b, h, i, j) ? dp[j] * d.scale : 0.0f) : dp[j];
    const float ds = to_f32(p[j]) * (v - dot);
    out[j] = from_f32<T>(scale * ds);
    if (keep_f32) dp[j] = ds;
  }
}

// dbias (H, Tq, Tk) += sum over b of dS (B, H, Tq, Tk), batch rows in order.
__global__ void bias_grad_kernel(float* dbias, const float* ds, int64_t B, int64_t H, int64_t E) {
  const int64_t n = H * E;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = 0;
    for (int64_t b = 0; b < B; ++b) s += ds[b * n + e];
    dbias[e] += s;
  }
}

template <typename T>
void to_heads(const Tensor& dst, const Tensor& src, int64_t B, int64_t Tn, int64_t H, int64_t D, Slot slot,
              cudaStream_t s) {
  to_heads_kernel<T><<<blocks_for(B * H * Tn * D, 256), 256, 0, s>>>(ptr<T>(dst), ptr<T>(src), B, Tn, H, D, slot);
  MB_CUDA_LAUNCHED("to_heads_kernel");
}

template <typename T>
void from_heads(const Tensor& dst, const Tensor& src, int64_t B, int64_t Tn, int64_t H, int64_t D, Slot slot,
                bool accumulate, cudaStream_t s) {
  const int64_t share = slot.sharing();
  from_heads_kernel<T><<<blocks_for(B * (H / share) * Tn * D, 256), 256, 0, s>>>(ptr<T>(dst), ptr<T>(src), B, Tn, H, D,
                                                                                 slot, share, accumulate);
  MB_CUDA_LAUNCHED("from_heads_kernel");
}

// The query, key and value slots of a self-attention qkv (attention.h's layout).
struct SelfSlots {
  Slot q, k, v;
  explicit SelfSlots(const AttentionShape& s) {
    const int64_t per = heads_per_group(s);
    q = Slot{per + 2, 0, per, true};
    k = Slot{per + 2, per, per};
    v = Slot{per + 2, per + 1, per};
  }
};
constexpr Slot kHeads{1, 0};  // q, out, dout: (B, T, H, D)

// One strided-batched product over the B * H heads.
void batched(const Tensor& C, const Tensor& A, Trans ta, const Tensor& Bm, Trans tb, int64_t M, int64_t N, int64_t K,
             int64_t lda, int64_t ldb, int64_t ldc, int64_t batch, float alpha, float beta, cudaStream_t s) {
  GemmArgs g;
  g.ta = ta;
  g.tb = tb;
  g.M = M, g.N = N, g.K = K;
  g.A = A.raw(), g.B = Bm.raw(), g.C = C.raw();
  g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  g.ab = A.dtype();
  g.c = C.dtype();
  g.alpha = alpha, g.beta = beta;
  g.batch = batch;
  g.stride_a = (ta == Trans::N ? M : K) * lda;
  g.stride_b = (tb == Trans::N ? K : N) * ldb;
  g.stride_c = M * ldc;
  lt_gemm(C.device(), s, g);
}

// Forward of the core on permuted q (B, H, Tq, D), k and v (B, H, Tk, D): out_heads
// (B, H, Tq, D) and the saved probabilities.
template <typename T>
void core_forward(const Geometry& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out_heads,
                  const Tensor& probs, const Tensor& mask, const Tensor& bias, const DropoutKey* dropout) {
  const cudaStream_t s = stream_of(q);
  const Device dev = q.device();
  const int64_t BH = g.B * g.H;
  Tensor scores({BH, g.Tq, g.Tk}, DType::kF32, dev), dropped({BH, g.Tq, g.Tk}, q.dtype(), dev);
  const float scale = 1.0f / sqrtf(static_cast<float>(g.D));
  batched(scores, q, Trans::N, k, Trans::T, g.Tq, g.Tk, g.D, g.D, g.D, g.Tk, BH, scale, 0.0f, s);
  softmax_forward_kernel<T><<<static_cast<unsigned>(BH * g.Tq), kThreads, 0, s>>>(
      ptr<T>(probs), ptr<T>(dropped), ptr<float>(scores), ptr<T>(bias), ptr<uint8_t>(mask), g, dropout_args(dropout));
  MB_CUDA_LAUNCHED("softmax_forward_kernel");
  batched(out_heads, dropped, Trans::N, v, Trans::N, g.Tq, g.D, g.Tk, g.Tk, g.D, g.D, BH, 1.0f, 0.0f, s);
}

// Backward of the core: dq (B, H, Tq, D), dk, dv (B, H, Tk, D) written; dbias += ...
template <typename T>
void core_backward(const Geometry& g, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout_heads,
                   const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs, const Tensor& dbias,
                   const DropoutKey* dropout) {
  const cudaStream_t s = stream_of(q);
  const Device dev = q.device();
  const int64_t BH = g.B * g.H;
  const DropoutArgs d = dropout_args(dropout);
  const float scale = 1.0f / sqrtf(static_cast<float>(g.D));
  Tensor dropped;
  const Tensor* pv = &probs;
  if (d.on) {
    dropped.resize({BH, g.Tq, g.Tk}, q.dtype(), dev);
    dropped_kernel<T><<<blocks_for(BH * g.Tq * g.Tk, 256), 256, 0, s>>>(ptr<T>(dropped), ptr<T>(probs), g, d);
    MB_CUDA_LAUNCHED("dropped_kernel");
    pv = &dropped;
  }
  // dV = P'^T dO;  dP' = dO V^T (f32)
  batched(dv, *pv, Trans::T, dout_heads, Trans::N, g.Tk, g.D, g.Tq, g.Tk, g.D, g.D, BH, 1.0f, 0.0f, s);
  Tensor grad({BH, g.Tq, g.Tk}, DType::kF32, dev), ds({BH, g.Tq, g.Tk}, q.dtype(), dev);
  batched(grad, dout_heads, Trans::N, v, Trans::T, g.Tq, g.Tk, g.D, g.D, g.D, g.Tk, BH, 1.0f, 0.0f, s);
  softmax_backward_kernel<T><<<static_cast<unsigned>(BH * g.Tq), kThreads, 0, s>>>(ptr<T>(ds), ptr<float>(grad),
                                                                                    ptr<T>(probs), g, d, scale,
                                                                                    dbias.defined());
  MB_CUDA_LAUNCHED("softmax_backward_kernel");
  if (dbias.defined()) {
    bias_grad_kernel<<<blocks_for(g.H * g.Tq * g.Tk, 256), 256, 0, s>>>(ptr<float>(dbias), ptr<float>(grad), g.B, g.H,
                                                                        g.Tq * g.Tk);
    MB_CUDA_LAUNCHED("bias_grad_kernel");
  }
  // dQ = s dS K;  dK = s dS^T Q  (the scale is already in ds)
  batched(dq, ds, Trans::N, k, Trans::N, g.Tq, g.D, g.Tk, g.Tk, g.D, g.D, BH, 1.0f, 0.0f, s);
  batched(dk, ds, Trans::T, q, Trans::N, g.Tk, g.D, g.Tq, g.Tk, g.D, g.D, BH, 1.0f, 0.0f, s);
}

Geometry self_geometry(const AttentionShape& s) {
  return {s.B, s.T, s.T, s.H, s.D, s.causal, s.head_offset, s.total_heads ? s.total_heads : s.H};
}
Geometry cross_geometry(const CrossAttentionShape& s) {
  return {s.B, s.Tq, s.Tk, s.H, s.D, false, s.head_offset, s.total_heads ? s.total_heads : s.H};
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& probs, const Tensor& qkv, const Tensor& key_mask,
                       const AttentionShape& sh, const DropoutKey* dropout, const Tensor& bias,
                       const Tensor& documents) {
  Geometry g = self_geometry(sh);
  g.documents = ptr<int32_t>(documents);
  if (g.B * g.H * g.Tq == 0) return;
  const cudaStream_t s = stream_of(qkv);
  with_type<accepts::attention_forward_qkv.cuda.bits>(qkv.dtype(), "attention_forward", [&](auto zero) {
    using T = decltype(zero);
    const Device dev = qkv.device();
    Tensor q({g.B, g.H, g.Tq, g.D}, qkv.dtype(), dev), k(q.shape(), qkv.dtype(), dev), v(q.shape(), qkv.dtype(), dev),
        oh(q.shape(), qkv.dtype(), dev);
    const SelfSlots at(sh);
    to_heads<T>(q, qkv, g.B, g.Tq, g.H, g.D, at.q, s);
    to_heads<T>(k, qkv, g.B, g.Tq, g.H, g.D, at.k, s);
    to_heads<T>(v, qkv, g.B, g.Tq, g.H, g.D, at.v, s);
    core_forward<T>(g, q, k, v, oh, probs, key_mask, bias, dropout);
    from_heads<T>(out, oh, g.B, g.Tq, g.H, g.D, kHeads, false, s);
  });
}

void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                        const Tensor& key_mask, const AttentionShape& sh, const DropoutKey* dropout,
                        const Tensor& dbias) {
  (void)key_mask;  // masked entries have probability 0: their gradient vanishes by itself
  const Geometry g = self_geometry(sh);
  if (g.B * g.H * g.Tq == 0) return;
  const cudaStream_t s = stream_of(qkv);
  with_type<accepts::attention_backward_qkv.cuda.bits>(qkv.dtype(), "attention_backward", [&](auto zero) {
    using T = decltype(zero);
    const Device dev = qkv.device();
    const std::vector<int64_t> shape{g.B, g.H, g.Tq, g.D};
    Tensor q(shape, qkv.dtype(), dev), k(shape, qkv.dtype(), dev), v(shape, qkv.dtype(), dev), doh(shape, qkv.dtype(), dev);
    Tensor dq(shape, qkv.dtype(), dev), dk(shape, qkv.dtype(), dev), dv(shape, qkv.dtype(), dev);
    const SelfSlots at(sh);
    to_heads<T>(q, qkv, g.B, g.Tq, g.H, g.D, at.q, s);
    to_heads<T>(k, qkv, g.B, g.Tq, g.H, g.D, at.k, s);
    to_heads<T>(v, qkv, g.B, g.Tq, g.H, g.D, at.v, s);
    to_heads<T>(doh, dout, g.B, g.Tq, g.H, g.D, kHeads, s);
    core_backward<T>(g, dq, dk, dv, doh, q, k, v, probs, dbias, dropout);
    from_heads<T>(dqkv, dq, g.B, g.Tq, g.H, g.D, at.q, true, s);
    from_heads<T>(dqkv, dk, g.B, g.Tq, g.H, g.D, at.k, true, s);
    from_heads<T>(dqkv, dv, g.B, g.Tq, g.H, g.D, at.v, true, s);
  });
}

void cross_attention_forward(const Tensor& out, const Tensor& probs, const Tensor& q_in, const Tensor& kv,
                             const Tensor& key_mask, const CrossAttentionShape& sh, const DropoutKey* dropout) {
  const Geometry g = cross_geometry(sh);
  if (g.B * g.H * g.Tq == 0) return;
  const cudaStream_t s = stream_of(q_in);
  with_type<accepts::cross_attention_forward_q.cuda.bits>(q_in.dtype(), "cross_attention_forward", [&](auto zero) {
    using T = decltype(zero);
    const Device dev = q_in.device();
    Tensor q({g.B, g.H, g.Tq, g.D}, q_in.dtype(), dev), oh(q.shape(), q_in.dtype(), dev);
    Tensor k({g.B, g.H, g.Tk, g.D}, q_in.dtype(), dev), v(k.shape(), q_in.dtype(), dev);
    to_heads<T>(q, q_in, g.B, g.Tq, g.H, g.D, kHeads, s);
    to_heads<T>(k, kv, g.B, g.Tk, g.H, g.D, Slot{2, 0}, s);
    to_heads<T>(v, kv, g.B, g.Tk, g.H, g.D, Slot{2, 1}, s);
    core_forward<T>(g, q, k, v, oh, probs, key_mask, Tensor(), dropout);
    from_heads<T>(out, oh, g.B, g.Tq, g.H, g.D, kHeads, false, s);
  });
}

void cross_attention_backward(const Tensor& dq_out, const Tensor& dkv, const Tensor& dout, const Tensor& q_in,
                              const Tensor& kv, const Tensor& probs, const Tensor& key_mask,
                              const CrossAttentionShape& sh, const DropoutKey* dropout) {
  (void)key_mask;
  const Geometry g = cross_geometry(sh);
  if (g.B * g.H * g.Tq == 0) return;
  const cudaStream_t s = stream_of(q_in);
  with_type<accepts::cross_attention_backward_q.cuda.bits>(q_in.dtype(), "cross_attention_backward", [&](auto zero) {
    using T = decltype(zero);
    const Device dev = q_in.device();
    const DType t = q_in.dtype();
    Tensor q({g.B, g.H, g.Tq, g.D}, t, dev), doh(q.shape(), t, dev), dq(q.shape(), t, dev);
    Tensor k({g.B, g.H, g.Tk, g.D}, t, dev), v(k.shape(), t, dev), dk(k.shape(), t, dev), dv(k.shape(), t, dev);
    to_heads<T>(q, q_in, g.B, g.Tq, g.H, g.D, kHeads, s);
    to_heads<T>(k, kv, g.B, g.Tk, g.H, g.D, Slot{2, 0}, s);
    to_heads<T>(v, kv, g.B, g.Tk, g.H, g.D, Slot{2, 1}, s);
    to_heads<T>(doh, dout, g.B, g.Tq, g.H, g.D, kHeads, s);
    core_backward<T>(g, dq, dk, dv, doh, q, k, v, probs, Tensor(), dropout);
    from_heads<T>(dq_out, dq, g.B, g.Tq, g.H, g.D, kHeads, true, s);
    from_heads<T>(dkv, dk, g.B, g.Tk, g.H, g.D, Slot{2, 0}, true, s);
    from_heads<T>(dkv, dv, g.B, g.Tk, g.H, g.D, Slot{2, 1}, true, s);
  });
}

}  // namespace megabatch::ops::cuda
