// The flash attention kernels' shared parts (flash_attention.cu: the forward,
// flash_attention_backward.cu: the backward): the tile sizes, the kernels' arguments, the
// tensor-core product and its fragment loads, the asynchronous tile copies. See
// flash_attention.cu for the scheme.
#pragma once

#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"
#include "core/util/philox.h"

namespace megabatch::ops::MB_CUDA_BACKEND::flash {

// A block's rows are shared by its warps, 16 each; the tiles it walks are read from L2 once
// for all of them. At head size 128 the blocks hold 128 rows (eight warps): at 64 rows their
// registers kept the same eight warps an SM, as two blocks reading every tile twice, and 128
// measured 1-8% faster from seq 1024 up. At head size 64 they hold 64 rows: the forward's
// fewer registers let three blocks of four warps share an SM, and the backward measured up to
// 9% slower at 128 rows (H200, docs/gpu-performance.md).
template <int D>
constexpr int kForwardRows = D == 64 ? 64 : 128;  // queries of a forward block
template <int D>
constexpr int kBackwardRows = D == 64 ? 64 : 128;  // keys (dK dV) or queries (dQ) of a backward block
constexpr int kTile = 64;   // keys (forward, dQ) or queries (dK dV) of a tile
constexpr float kLog2e = 1.4426950408889634f;

// One attention problem: queries (B, Tq) and keys/values (B, Tk), each read in place where
// the projection wrote it. Self-attention: G groups of [H/G queries, a key, a value] in qkv
// (B, T, G, H/G + 2, D) (G = H: per-head attention); cross-attention: q (B, Tq, H, D) and k,
// v side by side in kv (B, Tk, H, 2, D).
struct Args {
  const void* q;        // element d of query (b, t, h): q + q_at(b, t, h) + d
  const void* k;        // of key (b, t, h): k + kv_at(b, t, h) + d; v likewise
  const void* v;
  const void* out;      // (B, Tq, H, D)
  const void* dout;
  void* dst;            // forward: out
  void* dq;             // backward: the gradients, in q's layout ...
  void* dk;             // ... and in k's and v's
  void* dv;
  bool add;             // backward: the gradients += (else =)
  float* lse;           // (B, H, Tq), natural log
  const float* rowdot;  // backward: dout . out per row (B, H, Tq)
  const uint8_t* mask;  // (B, Tk)
  const int32_t* doc;   // self-attention: (B, T) the document of each token, or null
  const void* bias;     // self-attention: (H, Tq, Tk) added to the scaled scores (T5), or null
  float* dbias;         // backward: (H, Tq, Tk) f32 += the bias's gradient, or null
  // element strides between tokens, between groups of `per` heads (grouped-query attention:
  // the query heads a key/value head serves; else 1) and between the queries of a group
  int64_t q_tok, q_head, kv_tok, kv_head, q_in;
  int per;
  int B, H, Tq, Tk, D;
  bool causal;
  float scale_log2;  // softmax scale x log2(e)
  float scale;       // softmax scale
  float inv_scale;   // 1 / scale: the bias in units of the unscaled scores
  // dropout
  bool drop;
  uint64_t key, stream;
  uint32_t threshold;
  float keep_scale;
  int64_t head_offset, total_heads;
};

__device__ __forceinline__ int64_t q_at(const Args& a, int b, int t, int h) {
  return (static_cast<int64_t>(b) * a.Tq + t) * a.q_tok + static_cast<int64_t>(h / a.per) * a.q_head +
         static_cast<int64_t>(h % a.per) * a.q_in;
}
__device__ __forceinline__ int64_t kv_at(const Args& a, int b, int t, int h) {
  return (static_cast<int64_t>(b) * a.Tk + t) * a.kv_tok + static_cast<int64_t>(h / a.per) * a.kv_head;
}
__device__ __forceinline__ int64_t out_at(const Args& a, int b, int t, int h) {
  return ((static_cast<int64_t>(b) * a.Tq + t) * a.H + h) * a.D;
}
__device__ __forceinline__ int64_t lse_at(const Args& a, int b, int h, int i) {
  return (static_cast<int64_t>(b) * a.H + h) * a.Tq + i;
}

__device__ __forceinline__ bool valid(const Args& a, int b, int i, int j) {
  if (j >= a.Tk || i >= a.Tq) return false;
  if (a.causal && j > i) return false;
  if (a.doc && a.doc[static_cast<int64_t>(b) * a.Tq + i] != a.doc[static_cast<int64_t>(b) * a.Tk + j]) return false;
  return !a.mask || a.mask[static_cast<int64_t>(b) * a.Tk + j] != 0;
}

// Whether every tile tests each element (a key mask or documents), not only those on the
// diagonal or past the end.
__device__ __forceinline__ bool masks_every_tile(const Args& a) { return a.mask || a.doc; }

// Documents (a.doc) are runs of positions, their ids nondecreasing along a row (attention.h).
// The first position of the document that holds position i of row b, and one past its last:
// binary searches over the row (self-attention: Tq = Tk).
__device__ __forceinline__ int document_start(const Args& a, int b, int i) {
  const int32_t* d = a.doc + static_cast<int64_t>(b) * a.Tk;
  const int32_t id = d[i];
  int lo = 0, hi = i;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (d[mid] < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}
__device__ __forceinline__ int document_end(const Args& a, int b, int i) {
  const int32_t* d = a.doc + static_cast<int64_t>(b) * a.Tk;
  const int32_t id = d[i];
  int lo = i + 1, hi = a.Tk;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (d[mid] <= id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Tiles [first, end) of one side that the positions lo..hi of the other side of row b reach at
// all: the key tiles of queries lo..hi (causal: up to hi's), or the query tiles of keys lo..hi
// (causal: from lo's). With documents, only those of lo's document to hi's: tiles wholly in
// other documents are skipped, as the causal mask's are.
struct TileRange {
  int first, end;
};
__device__ __forceinline__ TileRange key_tiles(const Args& a, int b, int lo, int hi) {
  TileRange r{0, a.causal ? hi / kTile + 1 : (a.Tk + kTile - 1) / kTile};
  if (a.doc) {
    r.first = document_start(a, b, lo) / kTile;
    r.end = min(r.end, (document_end(a, b, hi) + kTile - 1) / kTile);
  }
  return r;
}
__device__ __forceinline__ TileRange query_tiles(const Args& a, int b, int lo, int hi) {
  TileRange r{a.causal ? lo / kTile : 0, (a.Tq + kTile - 1) / kTile};
  if (a.doc) {
    const int start = document_start(a, b, lo) / kTile;
    if (start > r.first) r.first = start;
    r.end = min(r.end, (document_end(a, b, hi) + kTile - 1) / kTile);
  }
  return r;
}

// Attention dropout draws element (b, h, i, j)'s 32 bits as the explicit attention does: word
// e % 4 of the Philox block e / 4, e its index in the (B, total heads, Tq, Tk) scores. Kept
// where the bits reach the threshold, then scaled by 1 / (1 - p). (The kernels' dropout
// instances only.)
__device__ __forceinline__ uint64_t drop_element(const Args& a, int b, int h, int i, int j) {
  return static_cast<uint64_t>(
      ((static_cast<int64_t>(b) * a.total_heads + a.head_offset + h) * a.Tq + i) * static_cast<int64_t>(a.Tk) + j);
}
__device__ __forceinline__ Philox4x32::Block drop_block(const Args& a, uint64_t e) {
#ifdef MB_WARP_EMULATOR
  emu::count_philox_block();
#endif
  return Philox4x32::generate(a.key, a.stream, e / 4);
}
__device__ __forceinline__ uint32_t kept(const Args& a, uint32_t bits) { return bits >= a.threshold ? 1u : 0u; }
// element (b, h, i, j)'s keep bit from a block of its own (where its block's keys are not shared)
__device__ __forceinline__ uint32_t keep_bit(const Args& a, int b, int h, int i, int j) {
  const uint64_t e = drop_element(a, b, h, i, j);
  return kept(a, drop_block(a, e)[e % 4]);
}
// word k of w, k a value the compiler does not know (selects, not an indexed local array)
__device__ __forceinline__ uint32_t word_at(const Philox4x32::Block& w, int k) {
  return k == 0 ? w[0] : k == 1 ? w[1] : k == 2 ? w[2] : w[3];
}

// The keep bits of a thread's four scores in an 8-key column group of a warp's 16 x 64 tile,
// queries in rows (forward, dQ): bit e of row i0 + g + 8 (e >> 1), key j0 + 2t + (e & 1), j0 a
// multiple of 8. Where Tk is a multiple of 4 the four keys j0 + 4 (t >> 1) .. + 3 of a row are
// one Philox block, held by lanes t and t ^ 1: each draws one of their two rows' blocks (t
// even: row g's) and gives the other the two words it needs, a block a row instead of one per
// element. Every lane of the warp calls it.
__device__ __forceinline__ uint32_t keep_nibble_rows(const Args& a, int b, int h, int i0, int j0, int g, int t) {
  if (a.Tk % 4 == 0) {
    const int odd = t & 1;  // draws row g + 8's block, and holds words 2 and 3 of each row
    const Philox4x32::Block w = drop_block(a, drop_element(a, b, h, i0 + g + 8 * odd, j0 + 4 * (t >> 1)));
    const uint32_t mine0 = odd ? w[2] : w[0], mine1 = odd ? w[3] : w[1];
    const uint32_t got0 = __shfl_xor_sync(0xffffffffu, odd ? w[0] : w[2], 1);
    const uint32_t got1 = __shfl_xor_sync(0xffffffffu, odd ? w[1] : w[3], 1);
    return kept(a, odd ? got0 : mine0) | kept(a, odd ? got1 : mine1) << 1 | kept(a, odd ? mine0 : got0) << 2 |
           kept(a, odd ? mine1 : got1) << 3;
  }
  uint32_t m = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) m |= keep_bit(a, b, h, i0 + g + 8 * (e >> 1), j0 + 2 * t + (e & 1)) << e;
  return m;
}

// The same with keys in rows (dK dV): bit e of key j0 + g + 8 (e >> 1) and query i0 + 2t +
// (e & 1), j0 a multiple of 16. Where Tk is a multiple of 4 the keys of lanes with the same t
// and g >> 2 (lane bits 2 and 3 apart) make up Philox blocks: the four lanes hold words k =
// g & 3 of the blocks of two queries x two groups of four keys, each draws one of the four
// (the one of its e = k) and three shuffles give every lane its word of the other three.
__device__ __forceinline__ uint32_t keep_nibble_keys(const Args& a, int b, int h, int i0, int j0, int g, int t) {
  uint32_t m = 0;
  if (a.Tk % 4 == 0) {
    const int k = g & 3;
    const Philox4x32::Block w =
        drop_block(a, drop_element(a, b, h, i0 + 2 * t + (k & 1), j0 + 8 * (k >> 1) + (g & ~3)));
    Philox4x32::Block got;  // got[r]: word k of the block of e = k ^ r
    got[0] = word_at(w, k);
#pragma unroll
    for (int r = 1; r < 4; ++r) got[r] = __shfl_xor_sync(0xffffffffu, word_at(w, k ^ r), 4 * r);
#pragma unroll
    for (int e = 0; e < 4; ++e) m |= kept(a, word_at(got, e ^ k)) << e;
    return m;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) m |= keep_bit(a, b, h, i0 + 2 * t + (e & 1), j0 + g + 8 * (e >> 1)) << e;
  return m;
}

// A thread's 32 keep bits of a warp's 16 x 64 tile, bit 4 n + e for its score s[n][e]:
// queries in rows (row i0 + g + 8 (e >> 1), key k0 + 8 n + 2t + (e & 1)) or keys in rows (key
// j0 + g + 8 (e >> 1), query i0 + 8 n + 2t + (e & 1)). The backward kernels draw them before
// the tile's products: then one register waits through the products, where the Philox rounds
// ran beside the scores', dP's and the gradients' accumulators (at head size 128, sm_90: 72 bytes
// of spill stores in dK/dV instead of 24). The forward draws each nibble where it applies it
// (drawn early, its 32-row kernel spilled more).
__device__ __forceinline__ uint32_t keep_bits_rows(const Args& a, int b, int h, int i0, int k0, int g, int t) {
  uint32_t m = 0;
#pragma unroll
  for (int n = 0; n < 8; ++n) m |= keep_nibble_rows(a, b, h, i0, k0 + 8 * n, g, t) << (4 * n);
  return m;
}
__device__ __forceinline__ uint32_t keep_bits_keys(const Args& a, int b, int h, int i0, int j0, int g, int t) {
  uint32_t m = 0;
#pragma unroll
  for (int n = 0; n < 8; ++n) m |= keep_nibble_keys(a, b, h, i0 + 8 * n, j0, g, t) << (4 * n);
  return m;
}
// the dropout factor of score s[n][e] (0 or 1 / (1 - p)) from keep_bits_*'s bits (n = 0: from
// one keep_nibble_*)
__device__ __forceinline__ float keep_factor(const Args& a, uint32_t bits, int n, int e) {
  return bits >> (4 * n + e) & 1u ? a.keep_scale : 0.0f;
}

// 2^x by the special-function unit (ex2.approx.ftz: 2 ulp, -inf gives 0); what exp2f
// compiles to, without its handling of results below the normal range, which the softmax's
// probabilities, rounded to bf16/fp16 next, do not need.
__device__ __forceinline__ float fast_exp2(float x) {
#ifdef MB_WARP_EMULATOR
  return emu::ex2(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

// Sets to -inf the scores of a warp's 16 x 64 tile (a thread's s[n][e]: row base_row + g +
// 8 (e >> 1), column base_col + 8 n + 2 t + (e & 1)) whose (query, key) pair is masked.
// Rows are queries and columns keys, or the other way round (kKeyRows: dK dV).
template <bool kKeyRows>
__device__ __forceinline__ void mask_tile(const Args& a, int b, float (*s)[4], int base_row, int base_col, int g, int t) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = base_row + g + (e >= 2 ? 8 : 0), col = base_col + n * 8 + 2 * t + (e & 1);
      if (!(kKeyRows ? valid(a, b, col, row) : valid(a, b, row, col))) s[n][e] = -INFINITY;
    }
}

// Adds the position bias to a warp's 16 x 64 tile of unscaled scores (laid out as
// mask_tile's), as bias / scale, so that the scale applied next gives scores x scale + bias.
// Elements outside Tq x Tk are left to the mask.
template <typename T, bool kKeyRows>
__device__ __forceinline__ void add_bias(const Args& a, int h, float (*s)[4], int base_row, int base_col, int g, int t) {
  const T* bias = static_cast<const T*>(a.bias) + static_cast<int64_t>(h) * a.Tq * a.Tk;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = base_row + g + (e >= 2 ? 8 : 0), col = base_col + n * 8 + 2 * t + (e & 1);
      const int i = kKeyRows ? col : row, j = kKeyRows ? row : col;
      if (i < a.Tq && j < a.Tk) s[n][e] += to_f32(bias[static_cast<int64_t>(i) * a.Tk + j]) * a.inv_scale;
    }
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

// c (16x8 f32) += a (16x16) b (16x8). sm_75 (T4) has no k16 product and no bf16: fp16 as two
// m16n8k8 products, the first over k 0..7 (a0, a1 and b0), the second over k 8..15.
template <typename T>
__device__ __forceinline__ void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
#if defined(MB_WARP_EMULATOR)
  emu::mma_m16n8k16(c, a, b0, b1, std::is_same_v<T, bf16>);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800 && __CUDA_ARCH__ >= 750
  if constexpr (std::is_same_v<T, f16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[2]), "r"(a[3]), "r"(b1));
  } else {
    __trap();  // flash_attention_supported keeps bf16 off sm_75
  }
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
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
  __trap();  // flash_attention_supported keeps GPUs before sm_75 on the explicit attention
#endif
}

__device__ __forceinline__ uint32_t ld32(const void* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The A fragment (16 rows x 16 columns) of rows r0.. and columns c0.. of a row-major
// shared-memory source (`stride` elements per row): register k holds two neighbours of
// one row. One ldmatrix.x4: lanes 8m..8m+7 give the rows of 8x8 matrix m (rows +8 for odd m,
// columns +8 for m >= 2).
template <typename T>
__device__ __forceinline__ void load_a(uint32_t* a, const T* src, int stride, int r0, int c0, int lane) {
  const int m = lane / 8, r = lane % 8;
  const T* p = src + (r0 + (m & 1) * 8 + r) * stride + c0 + (m >> 1) * 8;
#if defined(MB_WARP_EMULATOR)
  emu::ldmatrix_x4(a, p, false);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750  // ldmatrix: sm_75 and later
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
#else
  __trap();
#endif
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
// B fragments (16 k x 8 n) of two n-tiles, n0.. (b[0], b[1]) and n0 + 8.. (b[2], b[3]), over
// k0..k0 + 15, where the shared-memory source holds row n, column k contiguous (stride per
// n): one ldmatrix.x4 (matrix m: rows n0 + 8 (m >> 1), columns k0 + 8 (m & 1)).
template <typename T>
__device__ __forceinline__ void load_b(uint32_t* b, const T* src, int stride, int n0, int k0, int lane) {
  const int m = lane / 8, r = lane % 8;
  const T* p = src + (n0 + (m >> 1) * 8 + r) * stride + k0 + (m & 1) * 8;
#if defined(MB_WARP_EMULATOR)
  emu::ldmatrix_x4(b, p, false);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750  // ldmatrix: sm_75 and later
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
#else
  __trap();
#endif
}

// B fragments of two n-tiles (n0.., n0 + 8..) over k rows k0..k0 + 15 of a row-major [k][n]
// source: ldmatrix's transposing load gives each thread its two neighbours along k.
template <typename T>
__device__ __forceinline__ void load_b_trans(uint32_t* lo, uint32_t* hi, const T* src, int stride, int k0, int n0, int lane) {
  const int m = lane / 8, r = lane % 8;
  const T* p = src + (k0 + (m & 1) * 8 + r) * stride + n0 + (m >> 1) * 8;
#if defined(MB_WARP_EMULATOR)
  uint32_t x[4];
  emu::ldmatrix_x4(x, p, true);
  lo[0] = x[0], lo[1] = x[1], hi[0] = x[2], hi[1] = x[3];
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750  // ldmatrix: sm_75 and later
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(lo[0]), "=r"(lo[1]), "=r"(hi[0]), "=r"(hi[1])
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
#else
  __trap();
#endif
}

// Starts copying rows [row0, row0 + Rows) of a q/k/v/dout-like tensor into shared memory
// (`rows`, stride D + 8) without waiting (cp.async; rows past T_ become zeros). `at(t)` is
// the element offset of token t's head vector.
// Threads: the block's (each copies every Threads-th piece).
// sm_75 has no cp.async: there the copy is an ordinary 16-byte load and store, done when the
// function returns (the kernels' double buffers stay correct: a buffer is written only after
// the __syncthreads that ends its last reads).
template <typename T, int D, int Threads, int Rows = kTile, typename At>
__device__ __forceinline__ void load_tile_async(T* rows, const T* src, int row0, int T_, At at) {
#if defined(MB_WARP_EMULATOR)
  constexpr int chunks = D / 8;
  for (int c = threadIdx.x; c < Rows * chunks; c += Threads) {
    const int r = c / chunks, d0 = (c % chunks) * 8, t = row0 + r;
    emu::cp_async16(rows + r * (D + 8) + d0, t < T_ ? src + at(t) + d0 : src, t < T_ ? 16 : 0);
  }
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int chunks = D / 8;  // 16-byte pieces of a row
  for (int c = threadIdx.x; c < Rows * chunks; c += Threads) {
    const int r = c / chunks, d0 = (c % chunks) * 8, t = row0 + r;
    const T* from = t < T_ ? src + at(t) + d0 : src;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(rows + r * (D + 8) + d0))), "l"(from),
                 "r"(t < T_ ? 16 : 0));
  }
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  constexpr int chunks = D / 8;
  for (int c = threadIdx.x; c < Rows * chunks; c += Threads) {
    const int r = c / chunks, d0 = (c % chunks) * 8, t = row0 + r;
    *reinterpret_cast<uint4*>(rows + r * (D + 8) + d0) =
        t < T_ ? *reinterpret_cast<const uint4*>(src + at(t) + d0) : make_uint4(0u, 0u, 0u, 0u);
  }
#else
  __trap();
#endif
}
__device__ __forceinline__ void cp_commit() {
#if defined(MB_WARP_EMULATOR)
  emu::cp_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// waits until at most N of this thread's copy groups are still in flight
template <int N>
__device__ __forceinline__ void cp_wait() {
#if defined(MB_WARP_EMULATOR)
  emu::cp_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// What both problems share: sizes, scale, dropout, the head offset.
inline Args common_args(int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D, bool causal, int64_t head_offset,
                        int64_t total_heads, const DropoutKey* dropout, const Tensor& key_mask, const Tensor& lse) {
  Args a{};
  a.lse = ptr<float>(lse);
  a.mask = ptr<uint8_t>(key_mask);
  a.B = static_cast<int>(B), a.H = static_cast<int>(H), a.Tq = static_cast<int>(Tq), a.Tk = static_cast<int>(Tk);
  a.D = static_cast<int>(D);
  a.causal = causal;
  a.scale = 1.0f / sqrtf(static_cast<float>(D));
  a.inv_scale = sqrtf(static_cast<float>(D));
  a.scale_log2 = a.scale * kLog2e;
  a.drop = dropout && dropout->p > 0;
  if (a.drop) {
    a.key = dropout->key;
    a.stream = dropout->stream;
    a.threshold = static_cast<uint32_t>(static_cast<uint64_t>(dropout->p * 4294967296.0));
    a.keep_scale = static_cast<float>(1.0 / (1.0 - dropout->p));
  }
  a.head_offset = head_offset;
  a.total_heads = total_heads ? total_heads : H;
  a.per = 1;
  return a;
}

// element `e` of a tensor's data
inline const void* element(const Tensor& t, int64_t e) {
  return static_cast<const char*>(t.raw()) + e * static_cast<int64_t>(dtype_size(t.dtype()));
}
inline void* element(void* base, DType t, int64_t e) {
  return static_cast<char*>(base) + e * static_cast<int64_t>(dtype_size(t));
}

// Self-attention: q, k, v (and their gradients in dqkv, when given) in qkv's groups; the
// position bias and its gradient when given.
inline Args self_args(const AttentionShape& s, const DropoutKey* dropout, const Tensor& qkv, const Tensor& key_mask,
                      const Tensor& lse, const Tensor& bias, const Tensor& documents, const Tensor& dqkv = {},
                      const Tensor& dbias = {}) {
  Args a = common_args(s.B, s.T, s.T, s.H, s.D, s.causal, s.head_offset, s.total_heads, dropout, key_mask, lse);
  a.doc = ptr<int32_t>(documents);
  a.bias = bias.defined() ? bias.raw() : nullptr;
  a.dbias = ptr<float>(dbias);
  const int64_t per = heads_per_group(s);
  a.per = static_cast<int>(per);
  a.q = qkv.raw();
  a.k = element(qkv, per * s.D);
  a.v = element(qkv, (per + 1) * s.D);
  a.q_tok = a.kv_tok = qkv_width(s);
  a.q_head = a.kv_head = (per + 2) * s.D;
  a.q_in = s.D;
  if (dqkv.defined()) {
    a.dq = dqkv.raw();
    a.dk = element(dqkv.raw(), dqkv.dtype(), per * s.D);
    a.dv = element(dqkv.raw(), dqkv.dtype(), (per + 1) * s.D);
  }
  return a;
}

// Cross-attention: q (and dq) on their own, k and v (and dk, dv) side by side in kv (dkv).
inline Args cross_args(const CrossAttentionShape& s, const DropoutKey* dropout, const Tensor& q, const Tensor& kv,
                       const Tensor& key_mask, const Tensor& lse, const Tensor& dq = {}, const Tensor& dkv = {}) {
  Args a = common_args(s.B, s.Tq, s.Tk, s.H, s.D, false, s.head_offset, s.total_heads, dropout, key_mask, lse);
  a.q = q.raw();
  a.k = kv.raw();
  a.v = element(kv, s.D);
  a.q_tok = s.H * s.D;
  a.q_head = s.D;
  a.kv_tok = s.H * 2 * s.D;
  a.kv_head = 2 * s.D;
  if (dq.defined()) a.dq = dq.raw();
  if (dkv.defined()) {
    a.dk = dkv.raw();
    a.dv = element(dkv.raw(), dkv.dtype(), s.D);
  }
  return a;
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND::flash
