#include "core/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/ops/cpu/vecmath.h"
#include "core/ops/matmul.h"

namespace megabatch::ops {
namespace {

// One (batch, head) block of attention: queries q (Tq rows, stride ldq), keys k and values
// v (Tk rows, stride ldkv), output out (stride ldo), probabilities P (Tq, Tk).
template <typename T>
struct Block {
  const T *q, *k, *v;
  int64_t ldq, ldkv;
  T* out;
  int64_t ldo;
};

struct Geometry {
  int64_t B, Tq, Tk, H, D;
  bool causal;
  int64_t head_offset, total_heads;
  const uint8_t* key_mask;  // (B, Tk)
  bool valid(int64_t b, int64_t i, int64_t j) const {
    if (causal && j > i) return false;
    return !key_mask || key_mask[b * Tk + j] != 0;
  }
};

// Dropout mask of the (Tq, Tk) probability block of (b, local head h).
void block_mask(std::vector<uint8_t>& keep, const Geometry& g, int64_t b, int64_t h, const DropoutKey& d) {
  const int64_t total = g.total_heads ? g.total_heads : g.H;
  const uint64_t offset = static_cast<uint64_t>((b * total + g.head_offset + h) * g.Tq * g.Tk);
  keep.resize(static_cast<size_t>(g.Tq * g.Tk));
  dropout_mask(keep.data(), g.Tq * g.Tk, offset, d);
}

template <typename T, typename BlockOf>
void forward_all(T* probs, const Geometry& g, const DropoutKey* dropout, BlockOf block_of, const T* bias = nullptr) {
  const int64_t Tq = g.Tq, Tk = g.Tk, D = g.D;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  const bool drop = dropout && dropout->p > 0;
#pragma omp parallel
  {
    std::vector<T> dropped(drop ? static_cast<size_t>(Tq * Tk) : 0);
    std::vector<uint8_t> keep;
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < g.B; ++b) {
      for (int64_t h = 0; h < g.H; ++h) {
        const Block<T> blk = block_of(b, h);
        T* P = probs + (b * g.H + h) * Tq * Tk;
        gemm<T>(Trans::N, Trans::T, Tq, Tk, D, scale, blk.q, blk.ldq, blk.k, blk.ldkv, T(0), P, Tk);  // (Tq, Tk)
        if (bias)
          for (int64_t e = 0; e < Tq * Tk; ++e) P[e] += bias[h * Tq * Tk + e];
        for (int64_t i = 0; i < Tq; ++i) {
          T* row = P + i * Tk;
          T mx = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < Tk; ++j)
            if (g.valid(b, i, j) && row[j] > mx) mx = row[j];
          if (mx == -std::numeric_limits<T>::infinity()) {  // every key masked
            for (int64_t j = 0; j < Tk; ++j) row[j] = 0;
            continue;
          }
          T sum = 0;
          for (int64_t j = 0; j < Tk; ++j) {
            row[j] = g.valid(b, i, j) ? cpu::vexp(row[j] - mx) : T(0);
            sum += row[j];
          }
          const T inv = T(1) / sum;
          for (int64_t j = 0; j < Tk; ++j) row[j] *= inv;
        }
        const T* Pv = P;
        if (drop) {
          block_mask(keep, g, b, h, *dropout);
          const T ks = static_cast<T>(1.0 / (1.0 - dropout->p));
          for (int64_t e = 0; e < Tq * Tk; ++e) dropped[e] = keep[e] ? P[e] * ks : T(0);
          Pv = dropped.data();
        }
        gemm<T>(Trans::N, Trans::N, Tq, D, Tk, T(1), Pv, Tk, blk.v, blk.ldkv, T(0), blk.out, blk.ldo);
      }
    }
  }
}

// Gradient blocks: dq, dk, dv with the strides of q, k, v; dout with the stride of out.
template <typename T>
struct GradBlock {
  T *dq, *dk, *dv;
  const T* dout;
};

template <typename T, typename BlockOf, typename GradOf>
void backward_all(const T* probs, const Geometry& g, const DropoutKey* dropout, BlockOf block_of, GradOf grad_of,
                  T* dbias = nullptr) {
  const int64_t Tq = g.Tq, Tk = g.Tk, D = g.D;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  const bool drop = dropout && dropout->p > 0;
  // (masked entries have probability 0, so their gradient vanishes by itself)
#pragma omp parallel
  {
    std::vector<T> dP(static_cast<size_t>(Tq * Tk)), dropped(drop ? static_cast<size_t>(Tq * Tk) : 0);
    std::vector<uint8_t> keep;
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < g.B; ++b) {
      for (int64_t h = 0; h < g.H; ++h) {
        const Block<T> blk = block_of(b, h);
        const GradBlock<T> gb = grad_of(b, h);
        const T* P = probs + (b * g.H + h) * Tq * Tk;
        const T* Pv = P;
        T ks = 1;
        if (drop) {
          block_mask(keep, g, b, h, *dropout);
          ks = static_cast<T>(1.0 / (1.0 - dropout->p));
          for (int64_t e = 0; e < Tq * Tk; ++e) dropped[e] = keep[e] ? P[e] * ks : T(0);
          Pv = dropped.data();
        }
        gemm<T>(Trans::T, Trans::N, Tk, D, Tq, T(1), Pv, Tk, gb.dout, blk.ldo, T(1), gb.dv, blk.ldkv);      // dV += P'^T dO
        gemm<T>(Trans::N, Trans::T, Tq, Tk, D, T(1), gb.dout, blk.ldo, blk.v, blk.ldkv, T(0), dP.data(), Tk);  // dP' = dO V^T
        if (drop)
          for (int64_t e = 0; e < Tq * Tk; ++e) dP[e] = keep[e] ? dP[e] * ks : T(0);
        for (int64_t i = 0; i < Tq; ++i) {  // softmax backward: dS = P (dP - rowsum(P dP))
          const T* p = P + i * Tk;
          T* gr = dP.data() + i * Tk;
          T dot = 0;
          for (int64_t j = 0; j < Tk; ++j) dot += p[j] * gr[j];
          for (int64_t j = 0; j < Tk; ++j) gr[j] = p[j] * (gr[j] - dot);
        }
        if (dbias) {  // heads of different batch rows share the bias: add under a lock
#pragma omp critical(megabatch_attention_dbias)
          for (int64_t e = 0; e < Tq * Tk; ++e) dbias[h * Tq * Tk + e] += dP[e];
        }
        gemm<T>(Trans::N, Trans::N, Tq, D, Tk, scale, dP.data(), Tk, blk.k, blk.ldkv, T(1), gb.dq, blk.ldq);  // dQ += s dS K
        gemm<T>(Trans::T, Trans::N, Tk, D, Tq, scale, dP.data(), Tk, blk.q, blk.ldq, T(1), gb.dk, blk.ldkv);  // dK += s dS^T Q
      }
    }
  }
}

Geometry self_geometry(const AttentionShape& s, const uint8_t* key_mask) {
  return {s.B, s.T, s.T, s.H, s.D, s.causal, s.head_offset, s.total_heads, key_mask};
}
Geometry cross_geometry(const CrossAttentionShape& s, const uint8_t* key_mask) {
  return {s.B, s.Tq, s.Tk, s.H, s.D, false, s.head_offset, s.total_heads, key_mask};
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* probs, const T* qkv, const uint8_t* key_mask, const AttentionShape& s,
                       const DropoutKey* dropout, const T* bias) {
  const int64_t ld = 3 * s.H * s.D;
  forward_all<T>(
      probs, self_geometry(s, key_mask), dropout,
      [&](int64_t b, int64_t h) {
        const T* q = qkv + b * s.T * ld + h * 3 * s.D;
        return Block<T>{q, q + s.D, q + 2 * s.D, ld, ld, out + b * s.T * s.H * s.D + h * s.D, s.H * s.D};
      },
      bias);
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* probs, const uint8_t* key_mask,
                        const AttentionShape& s, const DropoutKey* dropout, T* dbias) {
  const int64_t ld = 3 * s.H * s.D;
  backward_all<T>(
      probs, self_geometry(s, key_mask), dropout,
      [&](int64_t b, int64_t h) {
        const T* q = qkv + b * s.T * ld + h * 3 * s.D;
        return Block<T>{q, q + s.D, q + 2 * s.D, ld, ld, nullptr, s.H * s.D};
      },
      [&](int64_t b, int64_t h) {
        T* dq = dqkv + b * s.T * ld + h * 3 * s.D;
        return GradBlock<T>{dq, dq + s.D, dq + 2 * s.D, dout + b * s.T * s.H * s.D + h * s.D};
      },
      dbias);
}

template <typename T>
void cross_attention_forward(T* out, T* probs, const T* q, const T* kv, const uint8_t* key_mask,
                             const CrossAttentionShape& s, const DropoutKey* dropout) {
  const int64_t ldq = s.H * s.D, ldkv = 2 * s.H * s.D;
  forward_all<T>(probs, cross_geometry(s, key_mask), dropout, [&](int64_t b, int64_t h) {
    const T* k = kv + b * s.Tk * ldkv + h * 2 * s.D;
    return Block<T>{q + b * s.Tq * ldq + h * s.D, k, k + s.D, ldq, ldkv, out + b * s.Tq * ldq + h * s.D, ldq};
  });
}

template <typename T>
void cross_attention_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const T* probs,
                              const uint8_t* key_mask, const CrossAttentionShape& s, const DropoutKey* dropout) {
  const int64_t ldq = s.H * s.D, ldkv = 2 * s.H * s.D;
  backward_all<T>(
      probs, cross_geometry(s, key_mask), dropout,
      [&](int64_t b, int64_t h) {
        const T* k = kv + b * s.Tk * ldkv + h * 2 * s.D;
        return Block<T>{q + b * s.Tq * ldq + h * s.D, k, k + s.D, ldq, ldkv, nullptr, ldq};
      },
      [&](int64_t b, int64_t h) {
        T* dk = dkv + b * s.Tk * ldkv + h * 2 * s.D;
        return GradBlock<T>{dq + b * s.Tq * ldq + h * s.D, dk, dk + s.D, dout + b * s.Tq * ldq + h * s.D};
      });
}

int relative_position_bucket(int64_t i, int64_t j, bool bidirectional, int num_buckets, int max_distance) {
  int64_t n = i - j;  // how far back the key is
  int bucket = 0;
  if (bidirectional) {
    num_buckets /= 2;
    if (n < 0) bucket += num_buckets;  // keys after the query use the upper half
    n = n < 0 ? -n : n;
  } else if (n < 0) {
    n = 0;  // later keys (masked in a causal decoder anyway)
  }
  const int exact = num_buckets / 2;
  if (n < exact) return bucket + static_cast<int>(n);
  const double wide = std::log(static_cast<double>(n) / exact) / std::log(static_cast<double>(max_distance) / exact) *
                      (num_buckets - exact);
  const int large = exact + static_cast<int>(wide);
  return bucket + std::min(large, num_buckets - 1);
}

#define MB_INSTANTIATE(T)                                                                                        \
  template void attention_forward<T>(T*, T*, const T*, const uint8_t*, const AttentionShape&, const DropoutKey*,  \
                                     const T*);                                                                  \
  template void attention_backward<T>(T*, const T*, const T*, const T*, const uint8_t*, const AttentionShape&,   \
                                      const DropoutKey*, T*);                                                     \
  template void cross_attention_forward<T>(T*, T*, const T*, const T*, const uint8_t*, const CrossAttentionShape&, \
                                           const DropoutKey*);                                                    \
  template void cross_attention_backward<T>(T*, T*, const T*, const T*, const T*, const T*, const uint8_t*,      \
                                            const CrossAttentionShape&, const DropoutKey*);
MB_INSTANTIATE(float)
MB_INSTANTIATE(double)
#undef MB_INSTANTIATE

}  // namespace megabatch::ops
