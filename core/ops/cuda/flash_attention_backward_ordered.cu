// Flash attention's backward with dQ in order inside the dK/dV walk (ops::FlashDq::kOrdered;
// the scheme below), deterministic: five tile products instead of the separate dQ kernel's
// seven.
#include <algorithm>
#include <climits>
#include <map>
#include <mutex>

#include "core/ops/cuda/flash_attention_backward.cuh"
#include "core/ops/flash_attention.h"

namespace megabatch::ops::MB_CUDA_BACKEND::flash {

namespace {
// Each (batch row, key/value head, key block) is an item; blocks of a persistent grid take
// items in order from a counter. An item walks the query tiles as flash_dkdv_kernel does, for
// each query head that reads its keys in turn (one, or a group's with grouped-query
// attention), but a non-causal one starts at its own tile (key block j at tile j kR, kR = key
// block / tile) and wraps around, so that at any moment the items of one (b, group) are at
// different tiles. At each tile it also forms its share of dQ, dS K over its keys, and adds
// it into acc, an f32 sum per (head, query tile): the items that reach a tile take turns in
// the order of their step count there within the head's walk (the fewest steps first), each
// waiting until turn[head, tile] says the ones before it are done. The last one writes dq.
// Causal: a tile's turns go from the last key block that reaches it down to the first, and a
// (b, group)'s items are taken in that order too, so an item waits only on items already
// running: free of deadlock on any number of blocks (and a simulation of the walk found it
// waits less than taking the longest first). Otherwise an item also waits on items taken after
// it; taking items in order keeps that free of deadlock where the key blocks of one (b, group)
// fit on the GPU at once (the launch checks): an item waits only for items of its own
// (b, group), which have all been taken, or will be once the earlier (b, group)'s, which wait
// on nothing later, finish; and every item walks the group's heads in the same order, each
// wait being on a point of the same head's walk that the waited-on item reaches first.
// With documents (--reset-attention-mask) an item walks only the tiles of its keys'
// documents, and a tile's turns are those of the key blocks that reach it, in the same order:
// each walk is the one above with tiles left out, so the argument holds as it stands.
// The kernel's dynamic shared memory: a key block's walk, this tile's dS, the item taken.
template <typename T, int D>
constexpr size_t ordered_smem() {
  return KeyBlockSmem<T, D>::bytes + kTile * (kBackwardRows<D> + 8) * sizeof(T) + sizeof(int);
}

struct Ordered {
  float* acc;   // (B, H, tiles x 64, D)
  int* turn;    // (B, H, tiles): how many items have added into each query tile
  int* next;    // the next item to take
  int blocks;   // key blocks of a (b, h)
  int tiles;    // query tiles
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // (the kernel below is sm_80 code)
__device__ __forceinline__ void wait_turn(const int* turn, int expected) {
  for (int64_t polls = 0;; ++polls) {
#ifdef MB_WARP_EMULATOR
    const int v = *turn;
#else
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(turn) : "memory");
#endif
    if (v == expected) return;
    if (polls > (int64_t{1} << 26)) __trap();  // seconds without a turn: a bug, not a slow item
    __nanosleep(64);
  }
}
__device__ __forceinline__ void give_turn(int* turn, int value) {
#ifdef MB_WARP_EMULATOR
  *turn = value;
#else
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(turn), "r"(value) : "memory");
#endif
}
#endif

// (Code for sm_80 and later only: on a T4 the block's 64 KiB of shared memory fall a few
// bytes short, so sm_75 keeps the separate kernels and its build skips this one.)
template <typename T, int D, bool kDrop>
__global__ void __launch_bounds__(2 * kBackwardRows<D>) flash_ordered_kernel(Args a, Ordered o) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // backward_ordered never launches it from sm_75 code
#else
  constexpr int kRows = kBackwardRows<D>, kThreads = 2 * kRows, RS = D + 8, kR = kRows / kTile;
  constexpr int SS = kRows + 8;                        // dS row stride
  constexpr int kParts = kRows / 64, kCols = D / kParts;  // dQ: a warp takes 16 queries x kCols
  MB_DYNAMIC_SMEM(smem);
  const KeyBlockSmem<T, D> sm(smem);
  T* dS = reinterpret_cast<T*>(smem + KeyBlockSmem<T, D>::bytes);  // [64 queries][SS]: this tile's dS
  int& taken = *reinterpret_cast<int*>(smem + ordered_smem<T, D>() - sizeof(int));  // the item the block took
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kw = warp * 16, qg = warp % 4, part = warp / 4;
  const int groups = a.H / a.per, items = a.B * groups * o.blocks;
  for (;;) {
    __syncthreads();  // the item before is done with shared memory
    if (threadIdx.x == 0) taken = atomicAdd(o.next, 1);
    __syncthreads();
    const int item = taken;
    if (item >= items) return;
    const int bg = item / o.blocks, b = bg / groups, h0 = bg % groups * a.per;
    const int j = a.causal ? o.blocks - 1 - item % o.blocks : item % o.blocks;  // (causal: the last first)
    const int k_block = j * kRows, j0 = k_block + kw;
    // the query tiles the block's keys reach (causal: from its own; with documents, those of
    // its documents), from its own tile on, wrapping around (each head of the group walks them)
    const TileRange reach = query_tiles(a, b, k_block, min(k_block + kRows, a.Tk) - 1);
    const int walk = reach.end - reach.first, steps = walk * a.per, own = j * kR - reach.first;
    auto tile = [&](int step) { return reach.first + (own + step % walk) % walk; };
    auto head = [&](int step) { return h0 + step / walk; };
    sm.template start<kThreads>(a, b, h0, k_block, tile(0));
    float dk[D / 8][4], dv[D / 8][4];
    zero_rows<D>(dk, dv);
    uint32_t kf[kKeepKV<D, kDrop> ? D / 16 : 1][4], vf[kKeepKV<D, kDrop> ? D / 16 : 1][4];
    for (int step = 0; step < steps; ++step) {
      const int qt = tile(step), h = head(step), bh = b * a.H + h, i0 = qt * kTile, buf = step & 1;
      sm.template advance<kThreads>(a, b, step + 1 < steps ? head(step + 1) : h, step + 1 < steps ? tile(step + 1) : -1,
                                    buf);
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
      // this item's turn at the tile, among the key blocks lo..hi that reach it: the items
      // that reach it in fewer steps come first (causal: those of later key blocks, p = qt / kR
      // down to lo; otherwise p down to lo, then hi down to p + 1)
      const int p = qt / kR;
      int lo = 0, hi = a.causal ? p : o.blocks - 1;
      if (a.doc) {  // (block p always reaches it: its queries see their own keys)
        lo = document_start(a, b, i0) / kRows;
        if (!a.causal) hi = (document_end(a, b, min(i0 + kTile, a.Tq) - 1) - 1) / kRows;
      }
      const int before = j <= p ? p - j : p - lo + 1 + (hi - j);
      const int count = hi - lo + 1;
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
    auto kv_of = [&](int tok) { return kv_at(a, b, tok, h0); };
    add_rows<T, D>(a, a.dk, a.Tk, kv_of, j0, dk, a.scale, g, t);
    add_rows<T, D>(a, a.dv, a.Tk, kv_of, j0, dv, 1.0f, g, t);
  }
#endif
}

// Blocks of the kernel resident on GPU `dev` at once (0: it does not run there), found once
// per GPU and instance: every backward of every layer asks. On the warp emulator: as many as
// it runs at once.
template <typename T, int D, bool kDrop>
int64_t resident_blocks(Device dev) {
#ifdef MB_WARP_EMULATOR
  (void)dev;
  return emu::options().resident;
#else
  constexpr int kThreads = 2 * kBackwardRows<D>;
  constexpr size_t smem = ordered_smem<T, D>();
  auto* kernel = flash_ordered_kernel<T, D, kDrop>;
  static std::mutex mu;
  static std::map<int, int64_t> resident_on;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = resident_on.find(dev.index);
  if (it != resident_on.end()) return it->second;
  int per_sm = 0, sms = 0;
  cudaFuncAttributes f{};
  MB_CUDA_CHECK(cudaFuncGetAttributes(&f, kernel));
  int64_t resident = 0;
  // sm_75 code (a T4, or a build for sm_75 alone on a newer GPU) has no kernel body; a T4 has
  // 64 KiB a block, a few bytes short (dev is the current GPU: the launch runs there)
  if (f.ptxVersion >= 80 && dynamic_smem_fits(smem + f.sharedSizeBytes)) {
    allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);  // (before the occupancy is asked)
    MB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    MB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev.index));
    resident = static_cast<int64_t>(per_sm) * sms;
  }
  resident_on[dev.index] = resident;
  return resident;
#endif
}

}  // namespace

template <typename T, int D, bool kDrop>
bool backward_ordered(const Args& a, cudaStream_t st, Device dev) {
  constexpr int kRows = kBackwardRows<D>, kThreads = 2 * kRows;
  if (flash_dq() != FlashDq::kOrdered || a.bias || a.dbias || a.Tq != a.Tk || a.Tk == 0) return false;
  const int64_t resident = resident_blocks<T, D, kDrop>(dev);
  if (resident == 0) return false;
  const int blocks = (a.Tk + kRows - 1) / kRows, tiles = (a.Tq + kTile - 1) / kTile;
  const int64_t items = static_cast<int64_t>(a.B) * (a.H / a.per) * blocks;
  if ((!a.causal && blocks > resident) || items > INT32_MAX) return false;  // (causal: see the kernel)
  Tensor acc({static_cast<int64_t>(a.B) * a.H * tiles * kTile * D}, DType::kF32, dev);
  Tensor turns({static_cast<int64_t>(a.B) * a.H * tiles + 1}, DType::kF32, dev);  // ints, zeroed
  turns.zero();
  int* turn = static_cast<int*>(turns.raw());
  const Ordered o{ptr<float>(acc), turn, turn + static_cast<int64_t>(a.B) * a.H * tiles, blocks, tiles};
  launch(flash_ordered_kernel<T, D, kDrop>, dim3(static_cast<unsigned>(std::min(items, resident))), kThreads,
         ordered_smem<T, D>(), st, "flash_ordered_kernel", a, o);
  count_flash_dq_ordered_call();
  return true;
}

#define MB_FLASH_ORDERED(T, D)                                                    \
  template bool backward_ordered<T, D, false>(const Args&, cudaStream_t, Device); \
  template bool backward_ordered<T, D, true>(const Args&, cudaStream_t, Device);
MB_FLASH_ORDERED(bf16, 64)
MB_FLASH_ORDERED(bf16, 128)
MB_FLASH_ORDERED(f16, 64)
MB_FLASH_ORDERED(f16, 128)
#undef MB_FLASH_ORDERED

}  // namespace megabatch::ops::MB_CUDA_BACKEND::flash
