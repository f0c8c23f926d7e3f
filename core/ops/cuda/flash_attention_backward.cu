// Flash attention's backward on a GPU (the scheme: flash_attention.cu), deterministic (no
// atomics whose order varies): D = rowsum(dout * out) first (rowdot_kernel); then one kernel
// per block of keys (kBackwardRows) walks the query tiles for dK and dV, and another per block
// of queries walks the key tiles for dQ; both recompute the probabilities from the forward's
// log-sum-exp. With FlashDq::kOrdered the dK/dV walk also adds each key block's share of dQ
// into an f32 sum, the blocks taking turns per query tile (flash_attention_backward_ordered.cu),
// and the dQ kernel does not run. With T5's position bias a third kernel sums the bias's gradient over
// the batch (flash_dbias_kernel).
#include "core/ops/cuda/flash_attention_backward.cuh"

namespace megabatch::ops::MB_CUDA_BACKEND {

namespace {
using namespace flash;

// ---- backward ---------------------------------------------------------------------------
// D_i = dout_i . out_i (f32), a warp per row
template <typename T>
__global__ void rowdot_kernel(float* rowdot, Args a) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // (b, h, i)
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<int64_t>(a.B) * a.H * a.Tq) return;
  const int i = static_cast<int>(row % a.Tq), h = static_cast<int>((row / a.Tq) % a.H),
            b = static_cast<int>(row / (static_cast<int64_t>(a.Tq) * a.H));
  const T* o = static_cast<const T*>(a.out) + out_at(a, b, i, h);
  const T* d = static_cast<const T*>(a.dout) + out_at(a, b, i, h);
  float acc = 0;
  for (int k = lane; k < a.D; k += 32) acc += to_f32(o[k]) * to_f32(d[k]);
  acc = warp_sum(acc);
  if (lane == 0) rowdot[row] = acc;
}

// dK and dV of kRows keys: each warp 16 keys, over the query tiles (double-buffered), of
// each query head that reads them in turn (grouped-query attention: the group's, in head
// order, summed in registers; else the one head). kDrop: attention dropout, as in the forward.
template <typename T, int D, bool kDrop>
__global__ void __launch_bounds__(2 * kBackwardRows<D>) flash_dkdv_kernel(Args a) {
  constexpr int kRows = kBackwardRows<D>, kThreads = 2 * kRows;  // a warp per 16 rows
  MB_DYNAMIC_SMEM(smem);
  const KeyBlockSmem<T, D> sm(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int groups = a.H / a.per, b = blockIdx.y / groups, h0 = blockIdx.y % groups * a.per;
  const int k_block = blockIdx.x * kRows, kw = warp * 16, j0 = k_block + kw;
  auto kv_of = [&](int tok) { return kv_at(a, b, tok, h0); };
  const TileRange tiles = query_tiles(a, b, k_block, min(k_block + kRows, a.Tk) - 1);  // causal: Tq = Tk
  const int first = tiles.first, walk = tiles.end - first;
  const int steps = walk * a.per;  // step s: head h0 + s / walk, tile first + s % walk
  sm.template start<kThreads>(a, b, h0, k_block, first);
  float dk[D / 8][4], dv[D / 8][4];
  zero_rows<D>(dk, dv);
  uint32_t kf[kKeepKV<D, kDrop> ? D / 16 : 1][4], vf[kKeepKV<D, kDrop> ? D / 16 : 1][4];
  for (int step = 0; step < steps; ++step) {
    const int h = h0 + step / walk, qt = first + step % walk, i0 = qt * kTile, buf = step & 1;
    const int next = step + 1;
    sm.template advance<kThreads>(a, b, next < steps ? h0 + next / walk : h, next < steps ? first + next % walk : -1,
                                  buf);
    if constexpr (kKeepKV<D, kDrop>) {
      if (step == 0) keep_kv(sm, kw, lane, kf, vf);  // Kown and Vown arrived with the first tile
    }
    if (!(a.causal && i0 + kTile - 1 < j0)) {  // else every query of the tile is before this warp's keys
      float dpt[8][4];
      dkdv_tile<T, D, kDrop>(a, b, h, i0, j0, kw, g, t, lane, sm, kf, vf, sm.Qb + buf * kTile * (D + 8),
                             sm.dOb + buf * kTile * (D + 8), sm.lse2 + buf * kTile, sm.rd + buf * kTile, dk, dv, dpt);
    }
    __syncthreads();  // the next iteration's copy overwrites this buffer
  }
  add_rows<T, D>(a, a.dk, a.Tk, kv_of, j0, dk, a.scale, g, t);
  add_rows<T, D>(a, a.dv, a.Tk, kv_of, j0, dv, 1.0f, g, t);
}

// A warp's 16 query rows of batch row b (per thread: rows g, g + 8) as A fragments of q and
// dout (rows past Tq read as zeros), with their lse (log2 units; +inf past Tq) and D.
template <typename T, int D>
__device__ __forceinline__ void load_query_rows(const Args& a, int b, int h, int q0, int g, int t, uint32_t (*qf)[4],
                                                uint32_t (*df)[4], float* lse2, float* rd) {
  const T* Q = static_cast<const T*>(a.q);
  const T* dout = static_cast<const T*>(a.dout);
  const int r[2] = {q0 + g, q0 + g + 8};
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int row = r[k & 1], col = ks * 16 + (k >> 1) * 8 + 2 * t;
      qf[ks][k] = row < a.Tq ? ld32(Q + q_at(a, b, row, h) + col) : 0u;
      df[ks][k] = row < a.Tq ? ld32(dout + out_at(a, b, row, h) + col) : 0u;
    }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    lse2[k] = r[k] < a.Tq ? a.lse[lse_at(a, b, h, r[k])] * kLog2e : INFINITY;
    rd[k] = r[k] < a.Tq ? a.rowdot[lse_at(a, b, h, r[k])] : 0.0f;
  }
}

// dS (the gradient of the scaled scores) of a warp's 16 queries q0.. against the key tile
// k0.. in shared memory (Ks, Vs): S = q K^T and dP = dout V^T on tensor cores, the bias and
// the mask, then P from lse and dS = P (Z dP - D), left in s.
template <typename T, int D, bool kDrop>
__device__ __forceinline__ void score_gradients(const Args& a, int b, int h, int q0, int k0, int g, int t, int lane,
                                                const uint32_t (*qf)[4], const uint32_t (*df)[4], const float* lse2,
                                                const float* rd, const T* Ks, const T* Vs, float (*s)[4]) {
  constexpr int RS = D + 8;
  const uint32_t keep = kDrop ? keep_bits_rows(a, b, h, q0, k0, g, t) : 0u;
  float dp[8][4];
#pragma unroll
  for (int n = 0; n < 8; n += 2) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = s[n + 1][e] = dp[n + 1][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t kb[4], vb[4];
      load_b(kb, Ks, RS, n * 8, ks * 16, lane);
      mma<T>(s[n], qf[ks], kb[0], kb[1]);
      mma<T>(s[n + 1], qf[ks], kb[2], kb[3]);
      load_b(vb, Vs, RS, n * 8, ks * 16, lane);
      mma<T>(dp[n], df[ks], vb[0], vb[1]);
      mma<T>(dp[n + 1], df[ks], vb[2], vb[3]);
    }
  }
  if (a.bias) add_bias<T, false>(a, h, s, q0, k0, g, t);
  // keys past Tk (zero rows, not -inf scores) are masked like the diagonal and a key mask;
  // rows past Tq have lse = inf (p = 0)
  if (masks_every_tile(a) || k0 + kTile > a.Tk || (a.causal && k0 + kTile - 1 > q0))
    mask_tile<false>(a, b, s, q0, k0, g, t);
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      const float p = fast_exp2(fmaf(s[n][e], a.scale_log2, -lse2[r]));
      s[n][e] = p * ((kDrop ? keep_factor(a, keep, n, e) : 1.0f) * dp[n][e] - rd[r]);
    }
}

// dQ of kRows queries: each warp 16 queries, over the key tiles (double-buffered).
template <typename T, int D, bool kDrop>
__global__ void __launch_bounds__(2 * kBackwardRows<D>) flash_dq_kernel(Args a) {
  constexpr int kRows = kBackwardRows<D>, kThreads = 2 * kRows;  // a warp per 16 rows
  MB_DYNAMIC_SMEM(smem);
  constexpr int RS = D + 8;
  T* Kb = reinterpret_cast<T*>(smem);  // [2][64][RS]
  T* Vb = Kb + 2 * kTile * RS;         // [2][64][RS]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.y / a.H, h = blockIdx.y % a.H;
  // (causal: the longest walks first, as in the forward)
  const int q_block = static_cast<int>(a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * kRows;
  const int q0 = q_block + warp * 16;
  const T* K = static_cast<const T*>(a.k);
  const T* V = static_cast<const T*>(a.v);
  auto kv_of = [&](int tok) { return kv_at(a, b, tok, h); };
  const int q_last = min(q_block + kRows, a.Tq) - 1;  // causal: Tq = Tk
  const TileRange tiles = key_tiles(a, b, q_block, q_last);
  load_tile_async<T, D, kThreads>(Kb, K, tiles.first * kTile, a.Tk, kv_of);
  load_tile_async<T, D, kThreads>(Vb, V, tiles.first * kTile, a.Tk, kv_of);
  cp_commit();
  uint32_t qf[D / 16][4], df[D / 16][4];
  float lse2[2], rd[2];
  load_query_rows<T, D>(a, b, h, q0, g, t, qf, df, lse2, rd);
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  for (int kt = tiles.first; kt < tiles.end; ++kt) {
    const int k0 = kt * kTile, buf = (kt - tiles.first) & 1;
    if (kt + 1 < tiles.end) {
      load_tile_async<T, D, kThreads>(Kb + (buf ^ 1) * kTile * RS, K, k0 + kTile, a.Tk, kv_of);
      load_tile_async<T, D, kThreads>(Vb + (buf ^ 1) * kTile * RS, V, k0 + kTile, a.Tk, kv_of);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const T* Ks = Kb + buf * kTile * RS;
    const T* Vs = Vb + buf * kTile * RS;
    if (!(a.causal && k0 > q0 + 15)) {  // else every key of the tile is after this warp's rows
      float s[8][4];  // dS
      score_gradients<T, D, kDrop>(a, b, h, q0, k0, g, t, lane, qf, df, lse2, rd, Ks, Vs, s);
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
  add_rows<T, D>(a, a.dq, a.Tq, [&](int tok) { return q_at(a, b, tok, h); }, q0, dq, a.scale, g, t);
}

// dBias (H, Tq, Tk) += the sum over the batch of dS, the gradient of the scaled scores (the
// position bias is the same for every batch row). A block per (block of queries, head) walks
// the key tiles; for each it adds up the batch rows' dS in order in registers, recomputing S
// and dP as the dQ kernel does, then adds the sum into dbias, every element by one thread:
// deterministic. The key and value tiles are not double-buffered (one per batch row and
// tile; T5's self-attention only).
template <typename T, int D, bool kDrop>
__global__ void __launch_bounds__(2 * kBackwardRows<D>) flash_dbias_kernel(Args a) {
  constexpr int kRows = kBackwardRows<D>, kThreads = 2 * kRows;  // a warp per 16 rows
  MB_DYNAMIC_SMEM(smem);
  constexpr int RS = D + 8;
  T* Ks = reinterpret_cast<T*>(smem);  // [64][RS]
  T* Vs = Ks + kTile * RS;             // [64][RS]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int h = blockIdx.y;
  const int q_block = blockIdx.x * kRows, q0 = q_block + warp * 16;
  const int r[2] = {q0 + g, q0 + g + 8};
  const T* K = static_cast<const T*>(a.k);
  const T* V = static_cast<const T*>(a.v);
  const int q_last = min(q_block + kRows, a.Tq) - 1;  // causal: Tq = Tk
  const int tiles = a.causal ? q_last / kTile + 1 : (a.Tk + kTile - 1) / kTile;
  for (int kt = 0; kt < tiles; ++kt) {
    const int k0 = kt * kTile;
    const bool after = a.causal && k0 > q0 + 15;  // every key of the tile is after this warp's rows
    float acc[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    for (int b = 0; b < a.B; ++b) {
      __syncthreads();  // every warp is done with the tiles before
      auto kv_of = [&](int tok) { return kv_at(a, b, tok, h); };
      load_tile_async<T, D, kThreads>(Ks, K, k0, a.Tk, kv_of);
      load_tile_async<T, D, kThreads>(Vs, V, k0, a.Tk, kv_of);
      cp_commit();
      cp_wait<0>();
      __syncthreads();
      if (after) continue;
      uint32_t qf[D / 16][4], df[D / 16][4];
      float lse2[2], rd[2], ds[8][4];
      load_query_rows<T, D>(a, b, h, q0, g, t, qf, df, lse2, rd);
      score_gradients<T, D, kDrop>(a, b, h, q0, k0, g, t, lane, qf, df, lse2, rd, Ks, Vs, ds);
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] += ds[n][e];
    }
    if (after) continue;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = r[e >> 1], j = k0 + n * 8 + 2 * t + (e & 1);
        if (i < a.Tq && j < a.Tk) a.dbias[(static_cast<int64_t>(h) * a.Tq + i) * a.Tk + j] += acc[n][e];
      }
  }
}

template <typename T, int D, bool kDrop>
void backward(const Args& a, cudaStream_t st, Device dev) {
  constexpr int kRows = kBackwardRows<D>, kThreads = 2 * kRows;
  constexpr size_t RS = D + 8;
  if (!backward_ordered<T, D, kDrop>(a, st, dev)) {
    if (a.Tk > 0)  // (no keys: no dK, dV)
      launch(flash_dkdv_kernel<T, D, kDrop>, dim3((a.Tk + kRows - 1) / kRows, a.B * (a.H / a.per)), kThreads,
             KeyBlockSmem<T, D>::bytes, st, "flash_dkdv_kernel", a);
    launch(flash_dq_kernel<T, D, kDrop>, dim3((a.Tq + kRows - 1) / kRows, a.B * a.H), kThreads,
           4 * kTile * RS * sizeof(T), st, "flash_dq_kernel", a);
  }
  if (a.dbias)
    launch(flash_dbias_kernel<T, D, kDrop>, dim3((a.Tq + kRows - 1) / kRows, a.H), kThreads, 2 * kTile * RS * sizeof(T),
           st, "flash_dbias_kernel", a);
}
template <typename T, int D>
void backward(const Args& a, cudaStream_t st, Device dev) {
  if (a.drop)
    backward<T, D, true>(a, st, dev);
  else
    backward<T, D, false>(a, st, dev);
}

template <uint32_t kTypes>
void run_backward(Args a, const Tensor& dout, const Tensor& out, Write w, DType t, const char* op) {
  a.out = out.raw();
  a.dout = dout.raw();
  a.add = w == Write::kAdd;
  const cudaStream_t st = stream_of(out);
  const int64_t rows = static_cast<int64_t>(a.B) * a.H * a.Tq;
  Tensor rowdot({rows}, DType::kF32, out.device());
  a.rowdot = ptr<float>(rowdot);
  with_type<kTypes>(t, op, [&](auto zero) {
    using T = decltype(zero);
    launch(rowdot_kernel<T>, dim3(blocks_for(rows * 32, 256, rows * 32)), 256, 0, st, "rowdot_kernel",
           ptr<float>(rowdot), a);
    if (a.D == 64)
      backward<T, 64>(a, st, out.device());
    else
      backward<T, 128>(a, st, out.device());
  });
}

}  // namespace

void flash_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, const Tensor& key_mask, const AttentionShape& s,
                              const DropoutKey* dropout, Write w, const Tensor& bias, const Tensor& dbias,
                              const Tensor& documents) {
  if (s.B * s.H * s.T == 0) return;
  run_backward<accepts::flash_attention_backward_qkv.cuda.bits>(
      self_args(s, dropout, qkv, key_mask, lse, bias, documents, dqkv, dbias), dout, out, w, qkv.dtype(),
      "flash_attention_backward");
}

void flash_cross_attention_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& q,
                                    const Tensor& kv, const Tensor& out, const Tensor& lse, const Tensor& key_mask,
                                    const CrossAttentionShape& s, const DropoutKey* dropout, Write w) {
  if (s.B * s.H * s.Tq == 0) {  // no queries: kSet writes dkv whole (zero), kAdd adds nothing
    if (w == Write::kSet) Tensor(dkv).zero();  // (a handle to the same memory)
    return;
  }
  run_backward<accepts::flash_cross_attention_backward_q.cuda.bits>(cross_args(s, dropout, q, kv, key_mask, lse, dq, dkv),
                                                                    dout, out, w, q.dtype(),
                                                                    "flash_cross_attention_backward");
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
