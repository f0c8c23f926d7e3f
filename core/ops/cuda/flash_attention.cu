// Flash attention on a GPU (FlashAttention-2's scheme, our own kernels): blocks of 64 or 128
// rows (flash_attention.cuh says which) walking tiles of 64 (kTile), a warp per 16 rows (the
// forward may take 32: ops::FlashForwardRows), products on tensor
// cores (mma.sync m16n8k16, bf16/fp16 operands, f32 accumulators, operands by ldmatrix), the
// softmax online in registers. Tiles are copied into shared memory with cp.async, the next
// under the current one's math.
// - forward: a block of queries of a (batch, head) walks the key tiles (a causal block
//   stops at its diagonal) and writes out and the rows' log-sum-exp;
// - backward, deterministic (no atomics): one kernel per block of keys walks the query tiles for
//   dK and dV, another per block of queries walks the key tiles for dQ; both recompute the
//   probabilities from lse, and read D = rowsum(dout * out) from a small kernel before them.
// Only the tiles that cross the diagonal, reach past T or have a key mask or documents
// (--reset-attention-mask) test each element; tiles wholly in other documents are skipped.
// T5's position bias (H, T, T), when given, is added to each tile's scores before the mask.
// q, k and v are read in place from qkv (B, T, H, 3, D), or q (B, Tq, H, D) and kv (B, Tk, H,
// 2, D) for cross-attention; out written as (B, Tq, H, D) and the gradients added into dqkv
// (dq and dkv): no permutes. Dropout draws each element's Philox bits as
// the explicit attention does, so the masks are the CPU's.
#include "core/ops/cuda/flash_attention.cuh"
#include "core/ops/flash_attention.h"

namespace megabatch::ops::MB_CUDA_BACKEND {

static_assert(takes_only<accepts::flash_attention_forward_key_mask.cuda.bits, uint8_t>() &&
              takes_only<accepts::flash_attention_backward_key_mask.cuda.bits, uint8_t>() &&
              takes_only<accepts::flash_attention_forward_lse.cuda.bits, float>() &&
              takes_only<accepts::flash_attention_backward_lse.cuda.bits, float>() &&
              takes_only<accepts::flash_cross_attention_forward_key_mask.cuda.bits, uint8_t>() &&
              takes_only<accepts::flash_cross_attention_backward_key_mask.cuda.bits, uint8_t>() &&
              takes_only<accepts::flash_cross_attention_forward_lse.cuda.bits, float>() &&
              takes_only<accepts::flash_cross_attention_backward_lse.cuda.bits, float>() &&
              takes_only<accepts::flash_attention_forward_documents.cuda.bits, int32_t>() &&
              takes_only<accepts::flash_attention_backward_documents.cuda.bits, int32_t>());

namespace {
using namespace flash;

// ---- forward ----------------------------------------------------------------------------
// Key and value tiles are double-buffered: the next tile's copy runs under this one's math.
// A warp computes kM tiles of 16 query rows (flash_forward_rows: 1 or 2); each key and
// value fragment it loads from shared memory serves all of them. A warp holds its query rows'
// fragments in registers, except at head size 128 with 32 rows (kForwardQShared): beside
// the output's 128 accumulators a thread has no room for them, so the block's queries wait
// in shared memory and each fragment is loaded where it multiplies (2 loads of 16 x 16
// serve 16 products with the tile's keys).
// kDrop: attention dropout (a kernel of its own, so that the others carry none of its code).
template <int D, int kM>
constexpr int kForwardBlockRows = kM == 1 ? kForwardRows<D> : 128;
template <int D, int kM>
constexpr int kForwardThreads = 32 * kForwardBlockRows<D, kM> / (16 * kM);
template <int D, int kM>
constexpr bool kForwardQShared = D == 128 && kM == 2;
// bytes of dynamic shared memory: key and value tiles, double-buffered, and the queries
template <typename T, int D, int kM>
constexpr size_t kForwardSmem = (4 * kTile + (kForwardQShared<D, kM> ? kForwardBlockRows<D, kM> : 0)) * (D + 8) *
                                sizeof(T);

template <typename T, int D, int kM, bool kDrop>
__global__ void __launch_bounds__(kForwardThreads<D, kM>) flash_forward_kernel(Args a) {
  constexpr int kBlockRows = kForwardBlockRows<D, kM>, kBlockThreads = kForwardThreads<D, kM>;
  constexpr int kWarpRows = 16 * kM;
  constexpr bool kQShared = kForwardQShared<D, kM>;
  MB_DYNAMIC_SMEM(smem);
  constexpr int RS = D + 8;
  T* Kb = reinterpret_cast<T*>(smem);  // [2][64][RS]
  T* Vb = Kb + 2 * kTile * RS;         // [2][64][RS]
  T* Qs = Vb + 2 * kTile * RS;         // [kBlockRows][RS], kQShared only
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.y / a.H, h = blockIdx.y % a.H;
  // causal: the last query blocks, which walk the most key tiles, are taken first, so that
  // the grid's tail is the short ones
  const int q_block = static_cast<int>(a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * kBlockRows;
  const int q0 = q_block + warp * kWarpRows;  // row tile mi: q0 + 16 mi ..
  const T* Q = static_cast<const T*>(a.q);
  const T* K = static_cast<const T*>(a.k);
  const T* V = static_cast<const T*>(a.v);
  auto k_at = [&](int tok) { return kv_at(a, b, tok, h); };
  const int q_last = min(q_block + kBlockRows, a.Tq) - 1;  // causal: Tq = Tk
  const TileRange tiles = key_tiles(a, b, q_block, q_last);
  if constexpr (kQShared)  // (rows past Tq as zeros; landed with the first tiles)
    load_tile_async<T, D, kBlockThreads, kBlockRows>(Qs, Q, q_block, a.Tq, [&](int tok) { return q_at(a, b, tok, h); });
  load_tile_async<T, D, kBlockThreads>(Kb, K, tiles.first * kTile, a.Tk, k_at);
  load_tile_async<T, D, kBlockThreads>(Vb, V, tiles.first * kTile, a.Tk, k_at);
  cp_commit();
  // this warp's query rows as A fragments (rows past Tq read as zeros)
  uint32_t qf[kM][D / 16][4];
  if constexpr (!kQShared) {
#pragma unroll
    for (int mi = 0; mi < kM; ++mi) {
      const int r[2] = {q0 + 16 * mi + g, q0 + 16 * mi + g + 8};
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int row = r[k & 1];
          qf[mi][ks][k] = row < a.Tq ? ld32(Q + q_at(a, b, row, h) + ks * 16 + (k >> 1) * 8 + 2 * t) : 0u;
        }
    }
  }
  float o[kM][D / 8][4];
  float m[kM][2], l[kM][2];
#pragma unroll
  for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.0f;
    m[mi][0] = m[mi][1] = -INFINITY;
    l[mi][0] = l[mi][1] = 0.0f;
  }
  for (int kt = tiles.first; kt < tiles.end; ++kt) {
    const int k0 = kt * kTile, buf = (kt - tiles.first) & 1;
    if (kt + 1 < tiles.end) {
      load_tile_async<T, D, kBlockThreads>(Kb + (buf ^ 1) * kTile * RS, K, k0 + kTile, a.Tk, k_at);
      load_tile_async<T, D, kBlockThreads>(Vb + (buf ^ 1) * kTile * RS, V, k0 + kTile, a.Tk, k_at);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const T* Ks = Kb + buf * kTile * RS;
    const T* Vs = Vb + buf * kTile * RS;
    if (!(a.causal && k0 > q0 + kWarpRows - 1)) {  // else every key of the tile is after this warp's rows
      // S = Q K^T; each score sums over ks = 0, 1, ... in order whichever way the loops nest
      float s[kM][8][4];
      if constexpr (kQShared) {
#pragma unroll
        for (int mi = 0; mi < kM; ++mi)
#pragma unroll
          for (int n = 0; n < 8; ++n) s[mi][n][0] = s[mi][n][1] = s[mi][n][2] = s[mi][n][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          uint32_t qa[kM][4];
#pragma unroll
          for (int mi = 0; mi < kM; ++mi) load_a(qa[mi], Qs, RS, warp * kWarpRows + 16 * mi, ks * 16, lane);
#pragma unroll
          for (int n = 0; n < 8; n += 2) {
            uint32_t kb[4];
            load_b(kb, Ks, RS, n * 8, ks * 16, lane);
#pragma unroll
            for (int mi = 0; mi < kM; ++mi) {
              mma<T>(s[mi][n], qa[mi], kb[0], kb[1]);
              mma<T>(s[mi][n + 1], qa[mi], kb[2], kb[3]);
            }
          }
        }
      } else {
#pragma unroll
        for (int n = 0; n < 8; n += 2) {
#pragma unroll
          for (int mi = 0; mi < kM; ++mi)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mi][n][e] = s[mi][n + 1][e] = 0.0f;
#pragma unroll
          for (int ks = 0; ks < D / 16; ++ks) {
            uint32_t kb[4];
            load_b(kb, Ks, RS, n * 8, ks * 16, lane);
#pragma unroll
            for (int mi = 0; mi < kM; ++mi) {
              mma<T>(s[mi][n], qf[mi][ks], kb[0], kb[1]);
              mma<T>(s[mi][n + 1], qf[mi][ks], kb[2], kb[3]);
            }
          }
        }
      }
#pragma unroll
      for (int mi = 0; mi < kM; ++mi) {
        const int r0 = q0 + 16 * mi;
        if (a.bias) add_bias<T, false>(a, h, s[mi], r0, k0, g, t);
        // Only a tile that reaches past Tk, crosses the diagonal or has a key mask is masked:
        // the others (most of them) skip the per-element test.
        if (masks_every_tile(a) || k0 + kTile > a.Tk || (a.causal && k0 + kTile - 1 > r0))
          mask_tile<false>(a, b, s[mi], r0, k0, g, t);
        // row maxima (scores unscaled: the scale is positive), then the running max in log2 units
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          mx[0] = fmaxf(mx[0], fmaxf(s[mi][n][0], s[mi][n][1]));
          mx[1] = fmaxf(mx[1], fmaxf(s[mi][n][2], s[mi][n][3]));
        }
        float alpha[2], m_use[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          const float m_new = fmaxf(m[mi][r], mx[r] * a.scale_log2);
          m_use[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row masked so far: every p is 0
          alpha[r] = fast_exp2(m[mi][r] - m_use[r]);
          m[mi][r] = m_new;
          l[mi][r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          o[mi][n][0] *= alpha[0], o[mi][n][1] *= alpha[0];
          o[mi][n][2] *= alpha[1], o[mi][n][3] *= alpha[1];
        }
        // probabilities (unnormalized) and their sums before dropout
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            s[mi][n][e] = fast_exp2(fmaf(s[mi][n][e], a.scale_log2, -m_use[r]));
            l[mi][r] += s[mi][n][e];
          }
        if constexpr (kDrop) {  // the dropped ones for the product
#pragma unroll
          for (int n = 0; n < 8; ++n) {
            const uint32_t keep = keep_nibble_rows(a, b, h, r0, k0 + n * 8, g, t);
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mi][n][e] *= keep_factor(a, keep, 0, e);
          }
        }
      }
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        uint32_t pa[kM][4];
#pragma unroll
        for (int mi = 0; mi < kM; ++mi) a_from_acc<T>(pa[mi], s[mi][2 * kk], s[mi][2 * kk + 1]);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t lo[2], hi[2];
          load_b_trans(lo, hi, Vs, RS, kk * 16, n * 8, lane);
#pragma unroll
          for (int mi = 0; mi < kM; ++mi) {
            mma<T>(o[mi][n], pa[mi], lo[0], lo[1]);
            mma<T>(o[mi][n + 1], pa[mi], hi[0], hi[1]);
          }
        }
      }
    }
    __syncthreads();  // the next iteration's copy overwrites this buffer
  }
  T* out = static_cast<T*>(a.dst);
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l[mi][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int i = q0 + 16 * mi + g + 8 * r;
      if (i >= a.Tq) continue;
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // every key masked: output 0
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *reinterpret_cast<uint32_t*>(out + out_at(a, b, i, h) + n * 8 + 2 * t) =
            pack<T>(o[mi][n][2 * r] * inv, o[mi][n][2 * r + 1] * inv);
      if (t == 0) a.lse[lse_at(a, b, h, i)] = sum > 0.0f ? (m[mi][r] + log2f(sum)) / kLog2e : INFINITY;
    }
}

template <typename T, int D, int kM>
void forward(const Args& a, cudaStream_t st) {
  constexpr int rows = kForwardBlockRows<D, kM>, threads = kForwardThreads<D, kM>;
  const dim3 grid((a.Tq + rows - 1) / rows, a.B * a.H);
  constexpr size_t smem = kForwardSmem<T, D, kM>;
  if (a.drop)
    launch(flash_forward_kernel<T, D, kM, true>, grid, threads, smem, st, "flash_forward_kernel", a);
  else
    launch(flash_forward_kernel<T, D, kM, false>, grid, threads, smem, st, "flash_forward_kernel", a);
}

template <uint32_t kTypes>
void run_forward(Args a, const Tensor& out, DType t, const char* op) {
  a.dst = out.raw();
  const cudaStream_t st = stream_of(out);
  with_type<kTypes>(t, op, [&](auto zero) {
    using T = decltype(zero);
    const bool rows32 = flash_forward_rows() == FlashForwardRows::k32;
    if (a.D == 64)
      rows32 ? forward<T, 64, 2>(a, st) : forward<T, 64, 1>(a, st);
    else if (rows32 && dynamic_smem_fits(kForwardSmem<T, 128, 2>))  // (not a T4's 64 KiB, nor sm_86's 99)
      forward<T, 128, 2>(a, st);
    else
      forward<T, 128, 1>(a, st);
  });
}

}  // namespace

#ifndef MB_WARP_EMULATOR
int flash_code_arch(int device) {
  int current = 0;
  MB_CUDA_CHECK(cudaGetDevice(&current));
  MB_CUDA_CHECK(cudaSetDevice(device));
  cudaFuncAttributes f{};
  MB_CUDA_CHECK(cudaFuncGetAttributes(&f, flash_forward_kernel<f16, 64, 1, false>));
  MB_CUDA_CHECK(cudaSetDevice(current));
  return f.ptxVersion;
}
#endif

void flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& key_mask,
                             const AttentionShape& s, const DropoutKey* dropout, const Tensor& bias,
                             const Tensor& documents) {
  if (s.B * s.H * s.T == 0) return;
  run_forward<accepts::flash_attention_forward_qkv.cuda.bits>(
      self_args(s, dropout, qkv, key_mask, lse, bias, documents), out, qkv.dtype(), "flash_attention_forward");
}

void flash_cross_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& kv,
                                   const Tensor& key_mask, const CrossAttentionShape& s, const DropoutKey* dropout) {
  if (s.B * s.H * s.Tq == 0) return;  // (no keys: no tiles, every row out 0 and lse +inf)
  run_forward<accepts::flash_cross_attention_forward_q.cuda.bits>(cross_args(s, dropout, q, kv, key_mask, lse), out,
                                                                  q.dtype(), "flash_cross_attention_forward");
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
