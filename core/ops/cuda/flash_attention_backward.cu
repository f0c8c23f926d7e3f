// Flash attention's backward on a GPU (the scheme: flash_attention.cu), deterministic (no
// atomics whose order varies): D = rowsum(dout * out) first (rowdot_kernel); then one kernel
// per block of keys (kBackwardRows) walks the query tiles for dK and dV, and another per block
// of queries walks the key tiles for dQ; both recompute the probabilities from the forward's
// log-sum-exp. With FlashDq::kOrdered the dK/dV walk also adds each key block's share of dQ
// into an f32 sum, the blocks taking turns per query tile (flash_ordered_kernel), and the dQ
// kernel does not run. With T5's position bias a third kernel sums the bias's gradient over
// the batch (flash_dbias_kernel).
#include <algorithm>
#include <climits>

#include "core/ops/cuda/flash_attention.cuh"
#include "core/ops/flash_attention.h"

namespace megabatch::ops::cuda {

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
  // starts copying the block's keys and values (from key k_block)
  template <int kThreads>
  __device__ __forceinline__ void load_keys(const Args& a, int b, int h, int k_block) const {
    auto kv_of = [&](int tok) { return kv_at(a, b, tok, h); };
    load_tile_async<T, D, kThreads, kRows>(Kown, static_cast<const T*>(a.k), k_block, a.Tk, kv_of);
    load_tile_async<T, D, kThreads, kRows>(Vown, static_cast<const T*>(a.v), k_block, a.Tk, kv_of);
  }
};

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
  if (a.mask || (a.causal && i0 < j0 + 15)) mask_tile<true>(a, b, st, j0, i0, g, t);
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
        const int il = n * 8 + 2 * t + (e & 1);
        const float p = st[n][e], z = p != 0.0f ? keep_factor(a, b, h, i0 + il, j0 + g + (e >= 2 ? 8 : 0)) : 0.0f;
        st[n][e] = p * z;
        dpt[n][e] = p * (z * dpt[n][e] - R[il]);
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

// dK and dV of kRows keys: each warp 16 keys, over the query tiles (double-buffered). kDrop:
// attention dropout, as in the forward.
template <typename T, int D, bool kDrop>
__global__ void __launch_bounds__(2 * kBackwardRows<D>) flash_dkdv_kernel(Args a) {
  constexpr int kRows = kBackwardRows<D>, kThreads = 2 * kRows;  // a warp per 16 rows
  extern __shared__ __align__(16) unsigned char smem[];
  const KeyBlockSmem<T, D> sm(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.y / a.H, h = blockIdx.y % a.H;
  const int k_block = blockIdx.x * kRows, kw = warp * 16, j0 = k_block + kw;
  auto kv_of = [&](int tok) { return kv_at(a, b, tok, h); };
  const int first = a.causal ? k_block / kTile : 0, tiles = (a.Tq + kTile - 1) / kTile;  // causal: Tq = Tk
  sm.template load_keys<kThreads>(a, b, h, k_block);
  sm.template stage<kThreads>(a, b, h, first, 0);
  cp_commit();
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;
  uint32_t kf[kKeepKV<D, kDrop> ? D / 16 : 1][4], vf[kKeepKV<D, kDrop> ? D / 16 : 1][4];
  for (int qt = first; qt < tiles; ++qt) {
    const int i0 = qt * kTile, buf = (qt - first) & 1;
    if (qt + 1 < tiles) {
      sm.template stage<kThreads>(a, b, h, qt + 1, buf ^ 1);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    if constexpr (kKeepKV<D, kDrop>) {
      if (qt == first) keep_kv(sm, kw, lane, kf, vf);  // Kown and Vown arrived with the first tile
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

// ---- dQ in the dK/dV kernel, in order (FlashDq::kOrdered) -------------------------------
// Each (batch row, head, key block) is an item; blocks of a persistent grid take items in
// order from a counter. An item walks the query tiles as flash_dkdv_kernel does, but a
// non-causal one starts at its own tile (key block j at tile j kR, kR = key block / tile)
// and wraps around, so that at any moment the items of one (b, h) are at different tiles.
// At each tile it also forms its share of dQ, dS K over its keys, and adds it into acc, an
// f32 sum per query tile: the items that reach a tile take turns in the order of their step
// count there (the fewest steps first), each waiting until turn[tile] says the ones before
// it are done. The last one writes dq. Taking items in order keeps this free of deadlock
// where the key blocks of one (b, h) fit on the GPU at once (the launch checks): an item
// waits only for items of its own (b, h), which have all been taken, or will be once the
// earlier (b, h)'s, which wait on nothing later, finish.
struct Ordered {
  float* acc;   // (B, H, tiles x 64, D)
  int* turn;    // (B, H, tiles): how many items have added into each query tile
  int* next;    // the next item to take
  int blocks;   // key blocks of a (b, h)
  int tiles;    // query tiles
};

__device__ __forceinline__ void wait_turn(const int* turn, int expected) {
  int v = 0;
  for (int64_t polls = 0;; ++polls) {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(turn) : "memory");
    if (v == expected) return;
    if (polls > (int64_t{1} << 26)) __trap();  // seconds without a turn: a bug, not a slow item
    __nanosleep(64);
  }
}
__device__ __forceinline__ void give_turn(int* turn, int value) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(turn), "r"(value) : "memory");
}

template <typename T, int D, bool kDrop>
__global__ void __launch_bounds__(2 * kBackwardRows<D>) flash_ordered_kernel(Args a, Ordered o) {
  constexpr int kRows = kBackwardRows<D>, kThreads = 2 * kRows, RS = D + 8, kR = kRows / kTile;
  constexpr int SS = kRows + 8;                        // dS row stride
  constexpr int kParts = kRows / 64, kCols = D / kParts;  // dQ: a warp takes 16 queries x kCols
  extern __shared__ __align__(16) unsigned char smem[];
  const KeyBlockSmem<T, D> sm(smem);
  T* dS = reinterpret_cast<T*>(smem + KeyBlockSmem<T, D>::bytes);  // [64 queries][SS]: this tile's dS
  __shared__ int taken;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kw = warp * 16, qg = warp % 4, part = warp / 4;
  const int items = a.B * a.H * o.blocks;
  for (;;) {
    __syncthreads();  // the item before is done with shared memory
    if (threadIdx.x == 0) taken = atomicAdd(o.next, 1);
    __syncthreads();
    const int item = taken;
    if (item >= items) return;
    const int j = item % o.blocks, bh = item / o.blocks, b = bh / a.H, h = bh % a.H;
    const int k_block = j * kRows, j0 = k_block + kw;
    const int steps = a.causal ? o.tiles - j * kR : o.tiles;
    auto tile = [&](int step) { return a.causal ? j * kR + step : (j * kR + step) % o.tiles; };
    sm.template load_keys<kThreads>(a, b, h, k_block);
    sm.template stage<kThreads>(a, b, h, tile(0), 0);
    cp_commit();
    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;
    uint32_t kf[kKeepKV<D, kDrop> ? D / 16 : 1][4], vf[kKeepKV<D, kDrop> ? D / 16 : 1][4];
    for (int step = 0; step < steps; ++step) {
      const int qt = tile(step), i0 = qt * kTile, buf = step & 1;
      if (step + 1 < steps) {
        sm.template stage<kThreads>(a, b, h, tile(step + 1), buf ^ 1);
        cp_commit();
        cp_wait<1>();
      } else {
        cp_wait<0>();
      }
      __syncthreads();
      if constexpr (kKeepKV<D, kDrop>) {
        if (step == 0) keep_kv(sm, kw, lane, kf, vf);
      }
      float dpt[8][4];  // dS^T of this warp's keys
      if (!(a.causal && i0 + kTile - 1 < j0)) {
        dkdv_tile<T, D, kDrop>(a, b, h, i0, j0, kw, g, t, lane, sm, kf, vf, sm.Qb + buf * kTile * RS,
                               sm.dOb + buf * kTile * RS, sm.lse2 + buf * kTile, sm.rd + buf * kTile, dk, dv, dpt);
      } else {
#pragma unroll
        for (int n = 0; n < 8; ++n) dpt[n][0] = dpt[n][1] = dpt[n][2] = dpt[n][3] = 0.0f;
      }
      // dS (queries x the block's keys) into shared memory, then dQ share = dS K
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dS[(n * 8 + 2 * t + (e & 1)) * SS + kw + g + 8 * (e >> 1)] = from_f32<T>(dpt[n][e]);
      __syncthreads();
      float dq[kCols / 8][4];
#pragma unroll
      for (int n = 0; n < kCols / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kRows / 16; ++kk) {
        uint32_t sa[4];
        load_a(sa, dS, SS, 16 * qg, kk * 16, lane);
#pragma unroll
        for (int n = 0; n < kCols / 8; n += 2) {
          uint32_t lo[2], hi[2];
          load_b_trans(lo, hi, sm.Kown, RS, kk * 16, part * kCols + n * 8, lane);
          mma<T>(dq[n], sa, lo[0], lo[1]);
          mma<T>(dq[n + 1], sa, hi[0], hi[1]);
        }
      }
      // this item's turn at the tile: the items that reach it in fewer steps come first
      // (causal: those of later key blocks, p = qt / kR down to j; otherwise p down to 0,
      // then the last key block down to p + 1)
      const int p = qt / kR;
      const int before = j <= p ? p - j : p + 1 + (o.blocks - 1 - j);
      const int count = a.causal ? p + 1 : o.blocks;
      int* turn = o.turn + static_cast<int64_t>(bh) * o.tiles + qt;
      if (threadIdx.x == 0) wait_turn(turn, before);
      __syncthreads();
      float* acc = o.acc + (static_cast<int64_t>(bh) * o.tiles * kTile + i0) * D;
      T* dq_out = static_cast<T*>(a.dq);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = 16 * qg + g + 8 * r, i = i0 + row;
#pragma unroll
        for (int n = 0; n < kCols / 8; ++n) {
          const int col = part * kCols + n * 8 + 2 * t;
          float2* sum = reinterpret_cast<float2*>(acc + static_cast<int64_t>(row) * D + col);
          float2 v = make_float2(dq[n][2 * r], dq[n][2 * r + 1]);
          if (before > 0) {
            const float2 old = __ldcg(sum);
            v = make_float2(old.x + v.x, old.y + v.y);
          }
          if (before < count - 1) {
            __stcg(sum, v);
          } else if (i < a.Tq) {  // the last: dq (+)= the whole sum x scale
            uint32_t* d = reinterpret_cast<uint32_t*>(dq_out + q_at(a, b, i, h) + col);
            const float2 prev = a.add ? unpack<T>(*d) : make_float2(0.0f, 0.0f);
            *d = pack<T>(prev.x + v.x * a.scale, prev.y + v.y * a.scale);
          }
        }
      }
      __syncthreads();  // every warp's part is written (and dS read)
      if (threadIdx.x == 0) give_turn(turn, before + 1);
      __syncthreads();  // the next iteration's copy overwrites this buffer
    }
    auto kv_of = [&](int tok) { return kv_at(a, b, tok, h); };
    add_rows<T, D>(a, a.dk, a.Tk, kv_of, j0, dk, a.scale, g, t);
    add_rows<T, D>(a, a.dv, a.Tk, kv_of, j0, dv, 1.0f, g, t);
  }
}

// Launches the ordered backward where it applies (FlashDq::kOrdered, Tq = Tk, no bias, the
// key blocks of a (b, h) resident at once); false: the caller runs the separate kernels.
template <typename T, int D, bool kDrop>
bool backward_ordered(const Args& a, cudaStream_t st, Device dev) {
  constexpr int kRows = kBackwardRows<D>, kThreads = 2 * kRows;
  if (flash_dq() != FlashDq::kOrdered || a.bias || a.dbias || a.Tq != a.Tk || a.Tk == 0) return false;
  const size_t smem = KeyBlockSmem<T, D>::bytes + kTile * (kRows + 8) * sizeof(T);
  auto* kernel = flash_ordered_kernel<T, D, kDrop>;
  int most = 0, per_sm = 0, sms = 0;
  cudaFuncAttributes f{};
  MB_CUDA_CHECK(cudaFuncGetAttributes(&f, kernel));
  MB_CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev.index));
  if (smem + f.sharedSizeBytes > static_cast<size_t>(most)) return false;  // (a T4: 64 KiB a block, a few bytes short)
  MB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  MB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
  MB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev.index));
  const int blocks = (a.Tk + kRows - 1) / kRows, tiles = (a.Tq + kTile - 1) / kTile;
  const int64_t resident = static_cast<int64_t>(per_sm) * sms, items = static_cast<int64_t>(a.B) * a.H * blocks;
  if (blocks > resident || items > INT32_MAX) return false;
  Tensor acc({static_cast<int64_t>(a.B) * a.H * tiles * kTile * D}, DType::kF32, dev);
  Tensor turns({static_cast<int64_t>(a.B) * a.H * tiles + 1}, DType::kF32, dev);  // ints, zeroed
  turns.zero();
  int* turn = static_cast<int*>(turns.raw());
  const Ordered o{ptr<float>(acc), turn, turn + static_cast<int64_t>(a.B) * a.H * tiles, blocks, tiles};
  kernel<<<static_cast<unsigned>(std::min(items, resident)), kThreads, smem, st>>>(a, o);
  MB_CUDA_LAUNCHED("flash_ordered_kernel");
  count_flash_dq_ordered_call();
  return true;
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
  if (a.mask || k0 + kTile > a.Tk || (a.causal && k0 + kTile - 1 > q0)) mask_tile<false>(a, b, s, q0, k0, g, t);
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      const float p = fast_exp2(fmaf(s[n][e], a.scale_log2, -lse2[r]));
      const float z = kDrop && p != 0.0f ? keep_factor(a, b, h, q0 + g + 8 * r, k0 + n * 8 + 2 * t + (e & 1)) : 1.0f;
      s[n][e] = p * (z * dp[n][e] - rd[r]);
    }
}

// dQ of kRows queries: each warp 16 queries, over the key tiles (double-buffered).
template <typename T, int D, bool kDrop>
__global__ void __launch_bounds__(2 * kBackwardRows<D>) flash_dq_kernel(Args a) {
  constexpr int kRows = kBackwardRows<D>, kThreads = 2 * kRows;  // a warp per 16 rows
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int RS = D + 8;
  T* Kb = reinterpret_cast<T*>(smem);  // [2][64][RS]
  T* Vb = Kb + 2 * kTile * RS;         // [2][64][RS]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.y / a.H, h = blockIdx.y % a.H;
  const int q_block = blockIdx.x * kRows, q0 = q_block + warp * 16;
  const T* K = static_cast<const T*>(a.k);
  const T* V = static_cast<const T*>(a.v);
  auto kv_of = [&](int tok) { return kv_at(a, b, tok, h); };
  const int q_last = min(q_block + kRows, a.Tq) - 1;  // causal: Tq = Tk
  const int tiles = a.causal ? q_last / kTile + 1 : (a.Tk + kTile - 1) / kTile;
  load_tile_async<T, D, kThreads>(Kb, K, 0, a.Tk, kv_of);
  load_tile_async<T, D, kThreads>(Vb, V, 0, a.Tk, kv_of);
  cp_commit();
  uint32_t qf[D / 16][4], df[D / 16][4];
  float lse2[2], rd[2];
  load_query_rows<T, D>(a, b, h, q0, g, t, qf, df, lse2, rd);
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  for (int kt = 0; kt < tiles; ++kt) {
    const int k0 = kt * kTile, buf = kt & 1;
    if (kt + 1 < tiles) {
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
  extern __shared__ __align__(16) unsigned char smem[];
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
      launch(flash_dkdv_kernel<T, D, kDrop>, dim3((a.Tk + kRows - 1) / kRows, a.B * a.H), kThreads,
             KeyBlockSmem<T, D>::bytes, st, a, "flash_dkdv_kernel");
    launch(flash_dq_kernel<T, D, kDrop>, dim3((a.Tq + kRows - 1) / kRows, a.B * a.H), kThreads,
           4 * kTile * RS * sizeof(T), st, a, "flash_dq_kernel");
  }
  if (a.dbias)
    launch(flash_dbias_kernel<T, D, kDrop>, dim3((a.Tq + kRows - 1) / kRows, a.H), kThreads, 2 * kTile * RS * sizeof(T),
           st, a, "flash_dbias_kernel");
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
    rowdot_kernel<T><<<blocks_for(rows * 32, 256, rows * 32), 256, 0, st>>>(ptr<float>(rowdot), a);
    MB_CUDA_LAUNCHED("rowdot_kernel");
    if (a.D == 64)
      backward<T, 64>(a, st, out.device());
    else
      backward<T, 128>(a, st, out.device());
  });
}

}  // namespace

void flash_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, const Tensor& key_mask, const AttentionShape& s,
                              const DropoutKey* dropout, Write w, const Tensor& bias, const Tensor& dbias) {
  if (s.B * s.H * s.T == 0) return;
  run_backward<accepts::flash_attention_backward_qkv.cuda.bits>(
      self_args(s, dropout, qkv, key_mask, lse, bias, dqkv, dbias), dout, out, w, qkv.dtype(), "flash_attention_backward");
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

}  // namespace megabatch::ops::cuda
