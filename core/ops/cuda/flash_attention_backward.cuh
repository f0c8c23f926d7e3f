// The flash backward's walk of a block of keys over the query tiles, shared by its two
// ways to dQ (flash_attention_backward.cu: dQ from a kernel of its own;
// flash_attention_backward_ordered.cu: dQ in order inside this walk): the block's shared
// memory, one tile's dK/dV step, writing a block's rows, and the ordered launch.
#pragma once

#include "core/ops/cuda/flash_attention.cuh"

namespace megabatch::ops::MB_CUDA_BACKEND::flash {

// Adds (a.add) or writes the 16 x D accumulator of rows row0.. (per thread: rows g, g + 8)
// into dst at the rows' offsets at(token), for tokens below `tokens`.
template <typename T, int D, typename At>
__device__ __forceinline__ void add_rows(const Args& a, void* dst_, int tokens, At at, int row0, float (*acc)[4],
                                         float factor, int g, int t) {
  T* dst = static_cast<T*>(dst_);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int tok = row0 + g + 8 * r;
    if (tok >= tokens) continue;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      uint32_t* p = reinterpret_cast<uint32_t*>(dst + at(tok) + n * 8 + 2 * t);
      const float2 old = a.add ? unpack<T>(*p) : float2{0.0f, 0.0f};
      *p = pack<T>(old.x + acc[n][2 * r] * factor, old.y + acc[n][2 * r + 1] * factor);
    }
  }
}

// The shared memory of a block of kRows keys walking the query tiles: its keys and values,
// and two buffers of query tiles (q, dout, lse in log2 units, D).
template <typename T, int D>
struct KeyBlockSmem {
  static constexpr int kRows = kBackwardRows<D>, RS = D + 8;
  T *Kown, *Vown, *Qb, *dOb;  // [kRows][RS], [kRows][RS], [2][64][RS], [2][64][RS]
  float *lse2, *rd;           // [2][64], [2][64]
  static constexpr size_t bytes = (2 * kRows + 4 * kTile) * RS * sizeof(T) + 4 * kTile * sizeof(float);
  __device__ explicit KeyBlockSmem(unsigned char* smem) {
    Kown = reinterpret_cast<T*>(smem);
    Vown = Kown + kRows * RS;
    Qb = Vown + kRows * RS;
    dOb = Qb + 2 * kTile * RS;
    lse2 = reinterpret_cast<float*>(dOb + 2 * kTile * RS);
    rd = lse2 + 2 * kTile;
  }
  // starts copying query tile qt of (b, h) into buffer buf: q and dout by cp.async, lse and
  // D by the threads
  template <int kThreads>
  __device__ __forceinline__ void stage(const Args& a, int b, int h, int qt, int buf) const {
    const int i0 = qt * kTile;
    load_tile_async<T, D, kThreads>(Qb + buf * kTile * RS, static_cast<const T*>(a.q), i0, a.Tq,
                                    [&](int tok) { return q_at(a, b, tok, h); });
    load_tile_async<T, D, kThreads>(dOb + buf * kTile * RS, static_cast<const T*>(a.dout), i0, a.Tq,
                                    [&](int tok) { return out_at(a, b, tok, h); });
    for (int r = threadIdx.x; r < kTile; r += kThreads) {
      const int i = i0 + r;
      lse2[buf * kTile + r] = i < a.Tq ? a.lse[lse_at(a, b, h, i)] * kLog2e : INFINITY;
      rd[buf * kTile + r] = i < a.Tq ? a.rowdot[lse_at(a, b, h, i)] : 0.0f;
    }
  }
  // starts copying the block's keys and values (from key k_block) and its first query tile
  // into buffer 0
  template <int kThreads>
  __device__ __forceinline__ void start(const Args& a, int b, int h, int k_block, int first_tile) const {
    auto kv_of = [&](int tok) { return kv_at(a, b, tok, h); };
    load_tile_async<T, D, kThreads, kRows>(Kown, static_cast<const T*>(a.k), k_block, a.Tk, kv_of);
    load_tile_async<T, D, kThreads, kRows>(Vown, static_cast<const T*>(a.v), k_block, a.Tk, kv_of);
    stage<kThreads>(a, b, h, first_tile, 0);
    cp_commit();
  }
  // at a step of the walk: starts copying the next tile (when there is one, < 0: none) into
  // buffer buf ^ 1 and waits for this step's (buffer buf), then for every thread
  template <int kThreads>
  __device__ __forceinline__ void advance(const Args& a, int b, int h, int next_tile, int buf) const {
    if (next_tile >= 0) {
      stage<kThreads>(a, b, h, next_tile, buf ^ 1);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
  }
};

template <int D>
__device__ __forceinline__ void zero_rows(float (*dk)[4], float (*dv)[4]) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;
}

// At head size 64 without dropout a warp keeps its key and value rows' A fragments in
// registers for the whole walk (32 more, within the two blocks an SM holds), which saves 8 of
// the 72 shared-memory matrix loads a tile; elsewhere they would spill, and are loaded again
// for each tile.
template <int D, bool kDrop>
constexpr bool kKeepKV = D == 64 && !kDrop;

// A warp's 16 keys (j0..; kw: their row in Kown) against the query tile i0.. in shared memory
// (Qs, dOs, lse L, D R): S^T = K Q^T and dP^T = V dout^T on tensor cores, the bias and the
// mask, P^T from lse, then dV += (P Z)^T dout and dK += dS^T q; dS^T is left in dst.
template <typename T, int D, bool kDrop>
__device__ __forceinline__ void dkdv_tile(const Args& a, int b, int h, int i0, int j0, int kw, int g, int t, int lane,
                                          const KeyBlockSmem<T, D>& sm, const uint32_t (*kf)[4],
                                          const uint32_t (*vf)[4], const T* Qs, const T* dOs, const float* L,
                                          const float* R, float (*dk)[4], float (*dv)[4], float (*dpt)[4]) {
  constexpr int RS = D + 8;
  const uint32_t keep = kDrop ? keep_bits_keys(a, b, h, i0, j0, g, t) : 0u;
  float st[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t ka[4], va[4];
    if constexpr (kKeepKV<D, kDrop>) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ka[e] = kf[ks][e], va[e] = vf[ks][e];
    } else {
      load_a(ka, sm.Kown, RS, kw, ks * 16, lane);
      load_a(va, sm.Vown, RS, kw, ks * 16, lane);
    }
#pragma unroll
    for (int n = 0; n < 8; n += 2) {
      uint32_t qb[4], ob[4];
      load_b(qb, Qs, RS, n * 8, ks * 16, lane);
      mma<T>(st[n], ka, qb[0], qb[1]);
      mma<T>(st[n + 1], ka, qb[2], qb[3]);
      load_b(ob, dOs, RS, n * 8, ks * 16, lane);
      mma<T>(dpt[n], va, ob[0], ob[1]);
      mma<T>(dpt[n + 1], va, ob[2], ob[3]);
    }
  }
  if (a.bias) add_bias<T, true>(a, h, st, j0, i0, g, t);
  // Queries past Tq have lse = inf (p = 0) and keys past Tk are not written: only a key
  // mask or the diagonal needs the per-element test.
  if (masks_every_tile(a) || (a.causal && i0 < j0 + 15)) mask_tile<true>(a, b, st, j0, i0, g, t);
    // P^T, then st <- (P Z)^T for dV and dpt <- dS^T for dK
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) st[n][e] = fast_exp2(fmaf(st[n][e], a.scale_log2, -L[n * 8 + 2 * t + (e & 1)]));
  if constexpr (kDrop) {
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = st[n][e], z = keep_factor(a, keep, n, e);
        st[n][e] = p * z;
        dpt[n][e] = p * (z * dpt[n][e] - R[n * 8 + 2 * t + (e & 1)]);
      }
  } else {
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dpt[n][e] = st[n][e] * (dpt[n][e] - R[n * 8 + 2 * t + (e & 1)]);
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

// The warp's key and value fragments for kKeepKV (Kown and Vown have arrived).
template <typename T, int D>
__device__ __forceinline__ void keep_kv(const KeyBlockSmem<T, D>& sm, int kw, int lane, uint32_t (*kf)[4],
                                        uint32_t (*vf)[4]) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    load_a(kf[ks], sm.Kown, D + 8, kw, ks * 16, lane);
    load_a(vf[ks], sm.Vown, D + 8, kw, ks * 16, lane);
  }
}

// Runs the whole backward with dQ in order (ops::FlashDq::kOrdered) where that applies: Tq =
// Tk, no bias, enough shared memory, and the key blocks of a (batch row, head) resident on the
// GPU at once. false: it did nothing, and the caller runs the separate kernels.
template <typename T, int D, bool kDrop>
bool backward_ordered(const Args& a, cudaStream_t st, Device dev);

}  // namespace megabatch::ops::MB_CUDA_BACKEND::flash
