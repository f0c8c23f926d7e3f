#include "core/ops/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/ops/cpu/vecmath.h"
#include "core/ops/matmul.h"

namespace megabatch::ops {
namespace {

bool key_valid(const AttentionShape& s, const uint8_t* key_mask, int64_t b, int64_t i, int64_t j) {
  if (s.causal && j > i) return false;
  return !key_mask || key_mask[b * s.T + j] != 0;
}

// Dropout mask of the (T, T) probability block of (b, local head h).
void block_mask(std::vector<uint8_t>& keep, const AttentionShape& s, int64_t b, int64_t h, const DropoutKey& d) {
  const int64_t total = s.total_heads ? s.total_heads : s.H;
  const uint64_t offset = static_cast<uint64_t>((b * total + s.head_offset + h) * s.T * s.T);
  keep.resize(s.T * s.T);
  dropout_mask(keep.data(), s.T * s.T, offset, d);
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* probs, const T* qkv, const uint8_t* key_mask, const AttentionShape& s,
                       const DropoutKey* dropout) {
  const int64_t B = s.B, Tn = s.T, H = s.H, D = s.D, ld = 3 * H * D;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  const bool drop = dropout && dropout->p > 0;
#pragma omp parallel
  {
    std::vector<T> dropped(drop ? Tn * Tn : 0);
    std::vector<uint8_t> keep;
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        const T* q = qkv + b * Tn * ld + h * 3 * D;
        const T* k = q + D;
        const T* v = q + 2 * D;
        T* P = probs + (b * H + h) * Tn * Tn;
        gemm<T>(Trans::N, Trans::T, Tn, Tn, D, scale, q, ld, k, ld, T(0), P, Tn);  // (T, T)
        for (int64_t i = 0; i < Tn; ++i) {
          T* row = P + i * Tn;
          T mx = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < Tn; ++j)
            if (key_valid(s, key_mask, b, i, j) && row[j] > mx) mx = row[j];
          if (mx == -std::numeric_limits<T>::infinity()) {  // every key masked
            for (int64_t j = 0; j < Tn; ++j) row[j] = 0;
            continue;
          }
          T sum = 0;
          for (int64_t j = 0; j < Tn; ++j) {
            row[j] = key_valid(s, key_mask, b, i, j) ? cpu::vexp(row[j] - mx) : T(0);
            sum += row[j];
          }
          const T inv = T(1) / sum;
          for (int64_t j = 0; j < Tn; ++j) row[j] *= inv;
        }
        const T* Pv = P;
        if (drop) {
          block_mask(keep, s, b, h, *dropout);
          const T ks = static_cast<T>(1.0 / (1.0 - dropout->p));
          for (int64_t e = 0; e < Tn * Tn; ++e) dropped[e] = keep[e] ? P[e] * ks : T(0);
          Pv = dropped.data();
        }
        gemm<T>(Trans::N, Trans::N, Tn, D, Tn, T(1), Pv, Tn, v, ld, T(0), out + b * Tn * H * D + h * D, H * D);
      }
    }
  }
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* probs, const uint8_t* key_mask,
                        const AttentionShape& s, const DropoutKey* dropout) {
  const int64_t B = s.B, Tn = s.T, H = s.H, D = s.D, ld = 3 * H * D;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  const bool drop = dropout && dropout->p > 0;
  (void)key_mask;  // masked entries have probability 0, so their gradient vanishes by itself
#pragma omp parallel
  {
    std::vector<T> dP(Tn * Tn), dropped(drop ? Tn * Tn : 0);
    std::vector<uint8_t> keep;
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = b * Tn * ld + h * 3 * D;
        const T *q = qkv + base, *k = q + D, *v = q + 2 * D;
        T *dq = dqkv + base, *dk = dq + D, *dv = dq + 2 * D;
        const T* dO = dout + b * Tn * H * D + h * D;
        const T* P = probs + (b * H + h) * Tn * Tn;
        const T* Pv = P;
        T ks = 1;
        if (drop) {
          block_mask(keep, s, b, h, *dropout);
          ks = static_cast<T>(1.0 / (1.0 - dropout->p));
          for (int64_t e = 0; e < Tn * Tn; ++e) dropped[e] = keep[e] ? P[e] * ks : T(0);
          Pv = dropped.data();
        }
        gemm<T>(Trans::T, Trans::N, Tn, D, Tn, T(1), Pv, Tn, dO, H * D, T(1), dv, ld);      // dV += P'^T dO
        gemm<T>(Trans::N, Trans::T, Tn, Tn, D, T(1), dO, H * D, v, ld, T(0), dP.data(), Tn);  // dP' = dO V^T
        if (drop)
          for (int64_t e = 0; e < Tn * Tn; ++e) dP[e] = keep[e] ? dP[e] * ks : T(0);
        for (int64_t i = 0; i < Tn; ++i) {  // softmax backward: dS = P (dP - rowsum(P dP))
          const T* p = P + i * Tn;
          T* g = dP.data() + i * Tn;
          T dot = 0;
          for (int64_t j = 0; j < Tn; ++j) dot += p[j] * g[j];
          for (int64_t j = 0; j < Tn; ++j) g[j] = p[j] * (g[j] - dot);
        }
        gemm<T>(Trans::N, Trans::N, Tn, D, Tn, scale, dP.data(), Tn, k, ld, T(1), dq, ld);  // dQ += s dS K
        gemm<T>(Trans::T, Trans::N, Tn, D, Tn, scale, dP.data(), Tn, q, ld, T(1), dk, ld);  // dK += s dS^T Q
      }
    }
  }
}

#define MB_INSTANTIATE(T)                                                                                        \
  template void attention_forward<T>(T*, T*, const T*, const uint8_t*, const AttentionShape&, const DropoutKey*); \
  template void attention_backward<T>(T*, const T*, const T*, const T*, const uint8_t*, const AttentionShape&,   \
                                      const DropoutKey*);
MB_INSTANTIATE(float)
MB_INSTANTIATE(double)
#undef MB_INSTANTIATE

}  // namespace megabatch::ops
