// Flash attention on a GPU (FlashAttention-2's scheme, our own kernels): tiles of 64 queries
// by 64 keys, four warps of 16 rows each, products on tensor cores (mma.sync m16n8k16,
// bf16/fp16 operands, f32 accumulators), the softmax online in registers. Tiles are copied
// into shared memory with cp.async, the next under the current one's math, and the
// operands that must be read across rows come through ldmatrix's transposing load.
// - forward: a block per 64 queries of a (batch, head) walks the key tiles (a causal block
//   stops at its diagonal) and writes out and the rows' log-sum-exp;
// - backward, deterministic (no atomics): one kernel per 64 keys walks the query tiles for
//   dK and dV, another per 64 queries walks the key tiles for dQ; both recompute the
//   probabilities from lse, and read D = rowsum(dout * out) from a small kernel before them.
// q, k and v are read in place from qkv (B, T, H, 3, D), out written as (B, T, H, D) and
// the gradients added into dqkv: no permutes. Dropout draws each element's Philox bits as
// the explicit attention does, so the masks are the CPU's.
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"
#include "core/util/philox.h"

namespace megabatch::ops::cuda {

static_assert(takes_only<accepts::flash_attention_forward_key_mask.cuda.bits, uint8_t>() &&
              takes_only<accepts::flash_attention_backward_key_mask.cuda.bits, uint8_t>() &&
              takes_only<accepts::flash_attention_forward_lse.cuda.bits, float>() &&
              takes_only<accepts::flash_attention_backward_lse.cuda.bits, float>());

namespace {

constexpr int kRows = 64;   // queries (forward, dQ) or keys (dK dV) of a block
constexpr int kTile = 64;   // keys (forward, dQ) or queries (dK dV) of a tile
constexpr int kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;

struct Args {
  const void* qkv;
  const void* out;
  const void* dout;
  void* dst;          // forward: out; backward: dqkv
  float* lse;         // (B, H, T), natural log
  const float* rowdot;  // backward: dout . out per row (B, H, T)
  const uint8_t* mask;
  int B, H, T, D;
  bool causal;
  float scale_log2;  // softmax scale x log2(e)
  float scale;       // softmax scale
  // dropout
  bool drop;
  uint64_t key, stream;
  uint32_t threshold;
  float keep_scale;
  int64_t head_offset, total_heads;
};

// element (b, t, h, which, 0) of qkv: tokens are H * 3 * D apart, heads 3 * D
__device__ __forceinline__ int64_t qkv_at(const Args& a, int b, int t, int h, int which) {
  return ((static_cast<int64_t>(b) * a.T + t) * a.H + h) * 3 * a.D + which * a.D;
}
__device__ __forceinline__ int64_t out_at(const Args& a, int b, int t, int h) {
  return ((static_cast<int64_t>(b) * a.T + t) * a.H + h) * a.D;
}

__device__ __forceinline__ bool valid(const Args& a, int b, int i, int j) {
  if (j >= a.T || i >= a.T) return false;
  if (a.causal && j > i) return false;
  return !a.mask || a.mask[static_cast<int64_t>(b) * a.T + j] != 0;
}

// the dropout factor of element (b, h, i, j): 0 or 1 / (1 - p)
__device__ __forceinline__ float keep_factor(const Args& a, int b, int h, int i, int j) {
  if (!a.drop) return 1.0f;
  const uint64_t e = static_cast<uint64_t>(((static_cast<int64_t>(b) * a.total_heads + a.head_offset + h) * a.T + i) *
                                               static_cast<int64_t>(a.T) + j);
  const auto r = Philox4x32::generate(a.key, a.stream, e / 4);
  return r[e % 4] >= a.threshold ? a.keep_scale : 0.0f;
}

template <typename T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  if constexpr (std::is_same_v<T, bf16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}
template <typename T>
__device__ __forceinline__ float2 unpack(uint32_t u) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
  }
}

// c (16x8 f32) += a (16x16) b (16x8)
template <typename T>
__device__ __forceinline__ void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  __trap();  // flash_attention_supported keeps sm_75 on the explicit attention
#endif
}

__device__ __forceinline__ uint32_t ld32(const void* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A fragment (16 rows x 16 columns, row-major source with `stride` elements per row) of
// rows r0.. and columns c0..: register k holds two neighbours of one row.
template <typename T>
__device__ __forceinline__ void load_a(uint32_t* a, const T* src, int stride, int r0, int c0, int g, int t) {
  a[0] = ld32(src + (r0 + g) * stride + c0 + 2 * t);
  a[1] = ld32(src + (r0 + g + 8) * stride + c0 + 2 * t);
  a[2] = ld32(src + (r0 + g) * stride + c0 + 8 + 2 * t);
  a[3] = ld32(src + (r0 + g + 8) * stride + c0 + 8 + 2 * t);
}
// The A fragment of a product's left operand from the accumulators of the previous one:
// two 16x8 tiles c_lo, c_hi (columns k..k+7, k+8..k+15) of f32 become one 16x16 operand.
template <typename T>
__device__ __forceinline__ void a_from_acc(uint32_t* a, const float* c_lo, const float* c_hi) {
  a[0] = pack<T>(c_lo[0], c_lo[1]);
  a[1] = pack<T>(c_lo[2], c_lo[3]);
  a[2] = pack<T>(c_hi[0], c_hi[1]);
  a[3] = pack<T>(c_hi[2], c_hi[3]);
}
// B fragment (16 k x 8 n) where the source holds row n, column k contiguous (stride per n).
template <typename T>
__device__ __forceinline__ void load_b(uint32_t& b0, uint32_t& b1, const T* src, int stride, int n0, int k0, int g, int t) {
  b0 = ld32(src + (n0 + g) * stride + k0 + 2 * t);
  b1 = ld32(src + (n0 + g) * stride + k0 + 8 + 2 * t);
}

// B fragments of two n-tiles (n0.., n0 + 8..) over k rows k0..k0 + 15 of a row-major [k][n]
// source: ldmatrix's transposing load gives each thread its two neighbours along k.
template <typename T>
__device__ __forceinline__ void load_b_trans(uint32_t* lo, uint32_t* hi, const T* src, int stride, int k0, int n0, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int m = lane / 8, r = lane % 8;
  const T* p = src + (k0 + (m & 1) * 8 + r) * stride + n0 + (m >> 1) * 8;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(lo[0]), "=r"(lo[1]), "=r"(hi[0]), "=r"(hi[1])
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
#else
  __trap();
#endif
}

// Starts copying rows [row0, row0 + 64) of a q/k/v/dout-like tensor into shared memory
// (`rows`, stride D + 8) without waiting (cp.async; rows past T become zeros). `at(t)` is
// the element offset of token t's head vector.
template <typename T, int D, typename At>
__device__ __forceinline__ void load_tile_async(T* rows, const T* src, int row0, int T_, At at) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int chunks = D / 8;  // 16-byte pieces of a row
  for (int c = threadIdx.x; c < kTile * chunks; c += kThreads) {
    const int r = c / chunks, d0 = (c % chunks) * 8, t = row0 + r;
    const T* from = t < T_ ? src + at(t) + d0 : src;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(rows + r * (D + 8) + d0))), "l"(from),
                 "r"(t < T_ ? 16 : 0));
  }
#else
  __trap();
#endif
}
__device__ __forceinline__ void cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// waits until at most N of this thread's copy groups are still in flight
template <int N>
__device__ __forceinline__ void cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// ---- forward ----------------------------------------------------------------------------
// Key and value tiles are double-buffered: the next tile's copy runs under this one's math.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(Args a) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int RS = D + 8;
  T* Kb = reinterpret_cast<T*>(smem);  // [2][64][RS]
  T* Vb = Kb + 2 * kTile * RS;         // [2][64][RS]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.y / a.H, h = blockIdx.y % a.H;
  const int q_block = blockIdx.x * kRows, q0 = q_block + warp * 16;
  const T* qkv = static_cast<const T*>(a.qkv);
  auto k_at = [&](int tok) { return qkv_at(a, b, tok, h, 1); };
  auto v_at = [&](int tok) { return qkv_at(a, b, tok, h, 2); };
  const int q_last = min(q_block + kRows, a.T) - 1;
  const int tiles = a.causal ? q_last / kTile + 1 : (a.T + kTile - 1) / kTile;
  load_tile_async<T, D>(Kb, qkv, 0, a.T, k_at);
  load_tile_async<T, D>(Vb, qkv, 0, a.T, v_at);
  cp_commit();
  // this warp's 16 query rows as A fragments (rows past T read as zeros)
  uint32_t qf[D / 16][4];
  {
    const int r[2] = {q0 + g, q0 + g + 8};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int row = r[k & 1];
        qf[ks][k] = row < a.T ? ld32(qkv + qkv_at(a, b, row, h, 0) + ks * 16 + (k >> 1) * 8 + 2 * t) : 0u;
      }
  }
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int kt = 0; kt < tiles; ++kt) {
    const int k0 = kt * kTile, buf = kt & 1;
    if (kt + 1 < tiles) {
      load_tile_async<T, D>(Kb + (buf ^ 1) * kTile * RS, qkv, k0 + kTile, a.T, k_at);
      load_tile_async<T, D>(Vb + (buf ^ 1) * kTile * RS, qkv, k0 + kTile, a.T, v_at);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const T* Ks = Kb + buf * kTile * RS;
    const T* Vs = Vb + buf * kTile * RS;
    if (!(a.causal && k0 > q0 + 15)) {  // else every key of the tile is after this warp's rows
      float s[8][4];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          uint32_t b0, b1;
          load_b(b0, b1, Ks, RS, n * 8, ks * 16, g, t);
          mma<T>(s[n], qf[ks], b0, b1);
        }
      }
      // mask, scale (log2 units), row maxima
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = q0 + g + (e >= 2 ? 8 : 0), j = k0 + n * 8 + 2 * t + (e & 1);
          s[n][e] = valid(a, b, i, j) ? s[n][e] * a.scale_log2 : -INFINITY;
          mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
        }
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(m[r], mx[r]);
        alpha[r] = m[r] == -INFINITY ? 0.0f : exp2f(m[r] - m_new);
        m[r] = m_new;
        l[r] *= alpha[r];
      }
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][0] *= alpha[0], o[n][1] *= alpha[0];
        o[n][2] *= alpha[1], o[n][3] *= alpha[1];
      }
      // probabilities (unnormalized), their sums before dropout, dropped ones for the product
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          const float p = s[n][e] == -INFINITY ? 0.0f : exp2f(s[n][e] - m[r]);
          l[r] += p;
          s[n][e] = a.drop && p != 0.0f ? p * keep_factor(a, b, h, q0 + g + 8 * r, k0 + n * 8 + 2 * t + (e & 1)) : p;
        }
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        uint32_t pa[4];
        a_from_acc<T>(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t lo[2], hi[2];
          load_b_trans(lo, hi, Vs, RS, kk * 16, n * 8, lane);
          mma<T>(o[n], pa, lo[0], lo[1]);
          mma<T>(o[n + 1], pa, hi[0], hi[1]);
        }
      }
    }
    __syncthreads();  // the next iteration's copy overwrites this buffer
  }
  T* out = static_cast<T*>(a.dst);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int i = q0 + g + 8 * r;
    if (i >= a.T) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;  // every key masked: output 0
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<uint32_t*>(out + out_at(a, b, i, h) + n * 8 + 2 * t) = pack<T>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    if (t == 0)
      a.lse[(static_cast<int64_t>(b) * a.H + h) * a.T + i] = l[r] > 0.0f ? (m[r] + log2f(l[r])) / kLog2e : INFINITY;
  }
}

// ---- backward ---------------------------------------------------------------------------
// D_i = dout_i . out_i (f32), a warp per row
template <typename T>
__global__ void rowdot_kernel(float* rowdot, Args a) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // (b, h, i)
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<int64_t>(a.B) * a.H * a.T) return;
  const int i = static_cast<int>(row % a.T), h = static_cast<int>((row / a.T) % a.H), b = static_cast<int>(row / (static_cast<int64_t>(a.T) * a.H));
  const T* o = static_cast<const T*>(a.out) + out_at(a, b, i, h);
  const T* d = static_cast<const T*>(a.dout) + out_at(a, b, i, h);
  float acc = 0;
  for (int k = lane; k < a.D; k += 32) acc += to_f32(o[k]) * to_f32(d[k]);
  acc = warp_sum(acc);
  if (lane == 0) rowdot[row] = acc;
}

// Adds the 16 x D accumulator of rows r (per thread: rows g, g + 8) into dqkv slot `which`.
template <typename T, int D>
__device__ __forceinline__ void add_rows(const Args& a, int b, int h, int row0, int which, float (*acc)[4], float factor,
                                         int g, int t) {
  T* dst = static_cast<T*>(a.dst);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int tok = row0 + g + 8 * r;
    if (tok >= a.T) continue;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      uint32_t* p = reinterpret_cast<uint32_t*>(dst + qkv_at(a, b, tok, h, which) + n * 8 + 2 * t);
      const float2 old = unpack<T>(*p);
      *p = pack<T>(old.x + acc[n][2 * r] * factor, old.y + acc[n][2 * r + 1] * factor);
    }
  }
}

// dK and dV of 64 keys: each warp 16 keys, over the query tiles (double-buffered).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_dkdv_kernel(Args a) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int RS = D + 8;
  T* Kown = reinterpret_cast<T*>(smem);  // this block's keys [64][RS]
  T* Vown = Kown + kRows * RS;           // and values
  T* Qb = Vown + kRows * RS;             // query tiles [2][64][RS]
  T* dOb = Qb + 2 * kTile * RS;          // dout tiles [2][64][RS]
  float* lse2 = reinterpret_cast<float*>(dOb + 2 * kTile * RS);  // [2][64], log2 units
  float* rd = lse2 + 2 * kTile;                                   // [2][64]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.y / a.H, h = blockIdx.y % a.H;
  const int k_block = blockIdx.x * kRows, kw = warp * 16, j0 = k_block + kw;
  const T* qkv = static_cast<const T*>(a.qkv);
  const T* dout = static_cast<const T*>(a.dout);
  auto q_at = [&](int tok) { return qkv_at(a, b, tok, h, 0); };
  auto o_at = [&](int tok) { return out_at(a, b, tok, h); };
  // stage the query tile qt into buffer buf: q and dout by copy, lse and D by the threads
  auto stage = [&](int qt, int buf) {
    const int i0 = qt * kTile;
    load_tile_async<T, D>(Qb + buf * kTile * RS, qkv, i0, a.T, q_at);
    load_tile_async<T, D>(dOb + buf * kTile * RS, dout, i0, a.T, o_at);
    for (int r = threadIdx.x; r < kTile; r += kThreads) {
      const int i = i0 + r;
      const int64_t at = (static_cast<int64_t>(b) * a.H + h) * a.T + i;
      lse2[buf * kTile + r] = i < a.T ? a.lse[at] * kLog2e : INFINITY;
      rd[buf * kTile + r] = i < a.T ? a.rowdot[at] : 0.0f;
    }
  };
  const int first = a.causal ? k_block / kTile : 0, tiles = (a.T + kTile - 1) / kTile;
  load_tile_async<T, D>(Kown, qkv, k_block, a.T, [&](int tok) { return qkv_at(a, b, tok, h, 1); });
  load_tile_async<T, D>(Vown, qkv, k_block, a.T, [&](int tok) { return qkv_at(a, b, tok, h, 2); });
  stage(first, 0);
  cp_commit();
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;
  for (int qt = first; qt < tiles; ++qt) {
    const int i0 = qt * kTile, buf = (qt - first) & 1;
    if (qt + 1 < tiles) {
      stage(qt + 1, buf ^ 1);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const T* Qs = Qb + buf * kTile * RS;
    const T* dOs = dOb + buf * kTile * RS;
    const float* L = lse2 + buf * kTile;
    const float* R = rd + buf * kTile;
    if (!(a.causal && i0 + kTile - 1 < j0)) {  // else every query of the tile is before this warp's keys
      // S^T (16 keys x 64 queries) = K Q^T and dP^T = V dout^T
      float st[8][4], dpt[8][4];
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t ka[4], va[4];
        load_a(ka, Kown, RS, kw, ks * 16, g, t);
        load_a(va, Vown, RS, kw, ks * 16, g, t);
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          uint32_t b0, b1;
          load_b(b0, b1, Qs, RS, n * 8, ks * 16, g, t);
          mma<T>(st[n], ka, b0, b1);
          load_b(b0, b1, dOs, RS, n * 8, ks * 16, g, t);
          mma<T>(dpt[n], va, b0, b1);
        }
      }
      // P^T, and st <- (P Z)^T for dV, dpt <- dS^T for dK
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = j0 + g + (e >= 2 ? 8 : 0), il = n * 8 + 2 * t + (e & 1), i = i0 + il;
          const float p = valid(a, b, i, j) ? exp2f(st[n][e] * a.scale_log2 - L[il]) : 0.0f;
          const float z = p != 0.0f ? keep_factor(a, b, h, i, j) : 0.0f;
          st[n][e] = p * z;
          dpt[n][e] = p * (z * dpt[n][e] - R[il]);
        }
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        uint32_t pa[4], sa[4];
        a_from_acc<T>(pa, st[2 * kk], st[2 * kk + 1]);
        a_from_acc<T>(sa, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t lo[2], hi[2];
          load_b_trans(lo, hi, dOs, RS, kk * 16, n * 8, lane);
          mma<T>(dv[n], pa, lo[0], lo[1]);
          mma<T>(dv[n + 1], pa, hi[0], hi[1]);
          load_b_trans(lo, hi, Qs, RS, kk * 16, n * 8, lane);
          mma<T>(dk[n], sa, lo[0], lo[1]);
          mma<T>(dk[n + 1], sa, hi[0], hi[1]);
        }
      }
    }
    __syncthreads();  // the next iteration's copy overwrites this buffer
  }
  add_rows<T, D>(a, b, h, j0, 1, dk, a.scale, g, t);
  add_rows<T, D>(a, b, h, j0, 2, dv, 1.0f, g, t);
}

// dQ of 64 queries: each warp 16 queries, over the key tiles (double-buffered).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_dq_kernel(Args a) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int RS = D + 8;
  T* Kb = reinterpret_cast<T*>(smem);  // [2][64][RS]
  T* Vb = Kb + 2 * kTile * RS;         // [2][64][RS]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.y / a.H, h = blockIdx.y % a.H;
  const int q_block = blockIdx.x * kRows, q0 = q_block + warp * 16;
  const T* qkv = static_cast<const T*>(a.qkv);
  const T* dout = static_cast<const T*>(a.dout);
  auto k_at = [&](int tok) { return qkv_at(a, b, tok, h, 1); };
  auto v_at = [&](int tok) { return qkv_at(a, b, tok, h, 2); };
  const int q_last = min(q_block + kRows, a.T) - 1;
  const int tiles = a.causal ? q_last / kTile + 1 : (a.T + kTile - 1) / kTile;
  load_tile_async<T, D>(Kb, qkv, 0, a.T, k_at);
  load_tile_async<T, D>(Vb, qkv, 0, a.T, v_at);
  cp_commit();
  uint32_t qf[D / 16][4], df[D / 16][4];
  float lse2[2], rd[2];
  {
    const int r[2] = {q0 + g, q0 + g + 8};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int row = r[k & 1], col = ks * 16 + (k >> 1) * 8 + 2 * t;
        qf[ks][k] = row < a.T ? ld32(qkv + qkv_at(a, b, row, h, 0) + col) : 0u;
        df[ks][k] = row < a.T ? ld32(dout + out_at(a, b, row, h) + col) : 0u;
      }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int64_t at = (static_cast<int64_t>(b) * a.H + h) * a.T + r[k];
      lse2[k] = r[k] < a.T ? a.lse[at] * kLog2e : INFINITY;
      rd[k] = r[k] < a.T ? a.rowdot[at] : 0.0f;
    }
  }
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  for (int kt = 0; kt < tiles; ++kt) {
    const int k0 = kt * kTile, buf = kt & 1;
    if (kt + 1 < tiles) {
      load_tile_async<T, D>(Kb + (buf ^ 1) * kTile * RS, qkv, k0 + kTile, a.T, k_at);
      load_tile_async<T, D>(Vb + (buf ^ 1) * kTile * RS, qkv, k0 + kTile, a.T, v_at);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const T* Ks = Kb + buf * kTile * RS;
    const T* Vs = Vb + buf * kTile * RS;
    if (!(a.causal && k0 > q0 + 15)) {
      float s[8][4], dp[8][4];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          uint32_t b0, b1;
          load_b(b0, b1, Ks, RS, n * 8, ks * 16, g, t);
          mma<T>(s[n], qf[ks], b0, b1);
          load_b(b0, b1, Vs, RS, n * 8, ks * 16, g, t);
          mma<T>(dp[n], df[ks], b0, b1);
        }
      }
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, i = q0 + g + 8 * r, j = k0 + n * 8 + 2 * t + (e & 1);
          const float p = valid(a, b, i, j) ? exp2f(s[n][e] * a.scale_log2 - lse2[r]) : 0.0f;
          const float z = p != 0.0f ? keep_factor(a, b, h, i, j) : 0.0f;
          s[n][e] = p * (z * dp[n][e] - rd[r]);  // dS
        }
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        uint32_t sa[4];
        a_from_acc<T>(sa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t lo[2], hi[2];
          load_b_trans(lo, hi, Ks, RS, kk * 16, n * 8, lane);
          mma<T>(dq[n], sa, lo[0], lo[1]);
          mma<T>(dq[n + 1], sa, hi[0], hi[1]);
        }
      }
    }
    __syncthreads();
  }
  add_rows<T, D>(a, b, h, q0, 0, dq, a.scale, g, t);
}

Args args_of(const AttentionShape& s, const DropoutKey* dropout, const Tensor& qkv, const Tensor& key_mask,
             const Tensor& lse) {
  Args a{};
  a.qkv = qkv.raw();
  a.lse = ptr<float>(lse);
  a.mask = ptr<uint8_t>(key_mask);
  a.B = static_cast<int>(s.B), a.H = static_cast<int>(s.H), a.T = static_cast<int>(s.T), a.D = static_cast<int>(s.D);
  a.causal = s.causal;
  a.scale = 1.0f / sqrtf(static_cast<float>(s.D));
  a.scale_log2 = a.scale * kLog2e;
  a.drop = dropout && dropout->p > 0;
  if (a.drop) {
    a.key = dropout->key;
    a.stream = dropout->stream;
    a.threshold = static_cast<uint32_t>(static_cast<uint64_t>(dropout->p * 4294967296.0));
    a.keep_scale = static_cast<float>(1.0 / (1.0 - dropout->p));
  }
  a.head_offset = s.head_offset;
  a.total_heads = s.total_heads ? s.total_heads : s.H;
  return a;
}

template <typename Kernel>
void launch(Kernel k, dim3 grid, size_t smem, cudaStream_t st, const Args& a, const char* name) {
  MB_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  k<<<grid, kThreads, smem, st>>>(a);
  MB_CUDA_LAUNCHED(name);
}

template <typename T, int D>
void forward(const Args& a, cudaStream_t st) {
  const dim3 grid((a.T + kRows - 1) / kRows, a.B * a.H);
  launch(flash_forward_kernel<T, D>, grid, 4 * kTile * (D + 8) * sizeof(T), st, a, "flash_forward_kernel");
}

template <typename T, int D>
void backward(const Args& a, cudaStream_t st) {
  const dim3 grid((a.T + kRows - 1) / kRows, a.B * a.H);
  constexpr size_t RS = D + 8;
  launch(flash_dkdv_kernel<T, D>, grid, 6 * kTile * RS * sizeof(T) + 4 * kTile * sizeof(float), st, a, "flash_dkdv_kernel");
  launch(flash_dq_kernel<T, D>, grid, 4 * kTile * RS * sizeof(T), st, a, "flash_dq_kernel");
}

}  // namespace

void flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& key_mask,
                             const AttentionShape& s, const DropoutKey* dropout) {
  if (s.B * s.H * s.T == 0) return;
  Args a = args_of(s, dropout, qkv, key_mask, lse);
  a.dst = out.raw();
  const cudaStream_t st = stream_of(qkv);
  with_type<accepts::flash_attention_forward_qkv.cuda.bits>(qkv.dtype(), "flash_attention_forward", [&](auto zero) {
    using T = decltype(zero);
    if (s.D == 64)
      forward<T, 64>(a, st);
    else
      forward<T, 128>(a, st);
  });
}

void flash_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, const Tensor& key_mask, const AttentionShape& s,
                              const DropoutKey* dropout) {
  if (s.B * s.H * s.T == 0) return;
  Args a = args_of(s, dropout, qkv, key_mask, lse);
  a.out = out.raw();
  a.dout = dout.raw();
  a.dst = dqkv.raw();
  const cudaStream_t st = stream_of(qkv);
  Tensor rowdot({s.B, s.H, s.T}, DType::kF32, qkv.device());
  a.rowdot = ptr<float>(rowdot);
  with_type<accepts::flash_attention_backward_qkv.cuda.bits>(qkv.dtype(), "flash_attention_backward", [&](auto zero) {
    using T = decltype(zero);
    const int64_t rows = s.B * s.H * s.T;
    rowdot_kernel<T><<<blocks_for(rows * 32, 256, rows * 32), 256, 0, st>>>(ptr<float>(rowdot), a);
    MB_CUDA_LAUNCHED("rowdot_kernel");
    if (s.D == 64)
      backward<T, 64>(a, st);
    else
      backward<T, 128>(a, st);
  });
}

}  // namespace megabatch::ops::cuda
