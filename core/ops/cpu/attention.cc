// Attention on the CPU: per (batch, head) block, score GEMM, masked softmax, dropout, value
// GEMM; OpenMP over the blocks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/ops/backends.h"
#include "core/ops/cpu/blas.h"
#include "core/ops/cpu/f32.h"
#include "core/ops/cpu/vecmath.h"

namespace megabatch::ops::cpu {
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
  int64_t per_group;        // query heads a key/value head serves (grouped-query attention; else 1)
  const int32_t* documents = nullptr;  // self-attention: (B, T), or null
  bool valid(int64_t b, int64_t i, int64_t j) const {
    if (causal && j > i) return false;
    if (documents && documents[b * Tq + i] != documents[b * Tk + j]) return false;
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
        blas_gemm(Trans::N, Trans::T, Tq, Tk, D, scale, blk.q, blk.ldq, blk.k, blk.ldkv, T(0), P, Tk);  // (Tq, Tk)
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
            row[j] = g.valid(b, i, j) ? vexp(row[j] - mx) : T(0);
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
        blas_gemm(Trans::N, Trans::N, Tq, D, Tk, T(1), Pv, Tk, blk.v, blk.ldkv, T(0), blk.out, blk.ldo);
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
  // With a bias gradient, one thread owns each head and adds the batch rows in order (the
  // bias is shared by the batch), so dbias does not depend on the thread count. Otherwise a
  // thread owns each (batch row, key/value head) and adds its query heads in order (grouped-
  // query attention: they share its dK and dV).
  const int64_t r = g.per_group, outer = dbias ? g.H : g.B * (g.H / r);
#pragma omp parallel
  {
    std::vector<T> dP(static_cast<size_t>(Tq * Tk)), dropped(drop ? static_cast<size_t>(Tq * Tk) : 0);
    std::vector<uint8_t> keep;
#pragma omp for schedule(static)
    for (int64_t task = 0; task < outer; ++task) {
      for (int64_t inner = 0; inner < (dbias ? g.B : r); ++inner) {
        const int64_t b = dbias ? inner : task / (g.H / r), h = dbias ? task : task % (g.H / r) * r + inner;
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
        blas_gemm(Trans::T, Trans::N, Tk, D, Tq, T(1), Pv, Tk, gb.dout, blk.ldo, T(1), gb.dv, blk.ldkv);      // dV += P'^T dO
        blas_gemm(Trans::N, Trans::T, Tq, Tk, D, T(1), gb.dout, blk.ldo, blk.v, blk.ldkv, T(0), dP.data(), Tk);  // dP' = dO V^T
        if (drop)
          for (int64_t e = 0; e < Tq * Tk; ++e) dP[e] = keep[e] ? dP[e] * ks : T(0);
        for (int64_t i = 0; i < Tq; ++i) {  // softmax backward: dS = P (dP - rowsum(P dP))
          const T* p = P + i * Tk;
          T* gr = dP.data() + i * Tk;
          T dot = 0;
          for (int64_t j = 0; j < Tk; ++j) dot += p[j] * gr[j];
          for (int64_t j = 0; j < Tk; ++j) gr[j] = p[j] * (gr[j] - dot);
        }
        if (dbias)
          for (int64_t e = 0; e < Tq * Tk; ++e) dbias[h * Tq * Tk + e] += dP[e];
        blas_gemm(Trans::N, Trans::N, Tq, D, Tk, scale, dP.data(), Tk, blk.k, blk.ldkv, T(1), gb.dq, blk.ldq);  // dQ += s dS K
        blas_gemm(Trans::T, Trans::N, Tk, D, Tq, scale, dP.data(), Tk, blk.q, blk.ldq, T(1), gb.dk, blk.ldkv);  // dK += s dS^T Q
      }
    }
  }
}

Geometry self_geometry(const AttentionShape& s, const uint8_t* key_mask, const Tensor& documents = {}) {
  Geometry g{s.B, s.T, s.T, s.H, s.D, s.causal, s.head_offset, s.total_heads, key_mask, heads_per_group(s)};
  if (documents.defined()) g.documents = documents.data<int32_t>();
  return g;
}
Geometry cross_geometry(const CrossAttentionShape& s, const uint8_t* key_mask) {
  return {s.B, s.Tq, s.Tk, s.H, s.D, false, s.head_offset, s.total_heads, key_mask, 1};
}

// Where head h's query, key and value start in token 0 of batch row b of a self-attention
// qkv (attention.h: G groups of [H/G queries, a key, a value]).
struct SelfPlaces {
  int64_t ld, group, r, D;  // elements a token, a group; heads a group; head size
  explicit SelfPlaces(const AttentionShape& s)
      : ld(qkv_width(s)), group((heads_per_group(s) + 2) * s.D), r(heads_per_group(s)), D(s.D) {}
  int64_t q(int64_t b, int64_t T, int64_t h) const { return b * T * ld + h / r * group + h % r * D; }
  int64_t k(int64_t b, int64_t T, int64_t h) const { return b * T * ld + h / r * group + r * D; }
};

}  // namespace

void attention_forward(const Tensor& out, const Tensor& probs, const Tensor& qkv, const Tensor& key_mask,
                       const AttentionShape& s, const DropoutKey* dropout, const Tensor& bias,
                       const Tensor& documents) {
  const uint8_t* mask = key_mask.defined() ? key_mask.data<uint8_t>() : nullptr;
  with_compute_type(qkv.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> in(qkv), bs(bias);
    Out<T> y(out, false), P(probs, false);
    const SelfPlaces at(s);
    forward_all<T>(
        P, self_geometry(s, mask, documents), dropout,
        [&](int64_t b, int64_t h) {
          const T* k = in.get() + at.k(b, s.T, h);
          return Block<T>{
              in.get() + at.q(b, s.T, h), k, k + s.D, at.ld, at.ld, y.get() + b * s.T * s.H * s.D + h * s.D, s.H * s.D};
        },
        bs.get());
    y.commit();
    P.commit();
  });
}

void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                        const Tensor& key_mask, const AttentionShape& s, const DropoutKey* dropout,
                        const Tensor& dbias) {
  const uint8_t* mask = key_mask.defined() ? key_mask.data<uint8_t>() : nullptr;
  with_compute_type(qkv.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> in(qkv), P(probs), dy(dout);
    Out<T> dx(dqkv, true), db(dbias, true);
    const SelfPlaces at(s);
    backward_all<T>(
        P, self_geometry(s, mask), dropout,
        [&](int64_t b, int64_t h) {
          const T* k = in.get() + at.k(b, s.T, h);
          return Block<T>{in.get() + at.q(b, s.T, h), k, k + s.D, at.ld, at.ld, nullptr, s.H * s.D};
        },
        [&](int64_t b, int64_t h) {
          T* dk = dx.get() + at.k(b, s.T, h);
          return GradBlock<T>{dx.get() + at.q(b, s.T, h), dk, dk + s.D, dy.get() + b * s.T * s.H * s.D + h * s.D};
        },
        db.get());
    dx.commit();
  });
}

void cross_attention_forward(const Tensor& out, const Tensor& probs, const Tensor& q_t, const Tensor& kv_t,
                             const Tensor& key_mask, const CrossAttentionShape& s, const DropoutKey* dropout) {
  const uint8_t* mask = key_mask.defined() ? key_mask.data<uint8_t>() : nullptr;
  with_compute_type(q_t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> q(q_t), kv(kv_t);
    Out<T> y(out, false), P(probs, false);
    const int64_t ldq = s.H * s.D, ldkv = 2 * s.H * s.D;
    forward_all<T>(P, cross_geometry(s, mask), dropout, [&](int64_t b, int64_t h) {
      const T* k = kv.get() + b * s.Tk * ldkv + h * 2 * s.D;
      return Block<T>{q.get() + b * s.Tq * ldq + h * s.D, k, k + s.D, ldq, ldkv, y.get() + b * s.Tq * ldq + h * s.D, ldq};
    });
    y.commit();
    P.commit();
  });
}

void cross_attention_backward(const Tensor& dq_t, const Tensor& dkv_t, const Tensor& dout, const Tensor& q_t,
                              const Tensor& kv_t, const Tensor& probs, const Tensor& key_mask,
                              const CrossAttentionShape& s, const DropoutKey* dropout) {
  const uint8_t* mask = key_mask.defined() ? key_mask.data<uint8_t>() : nullptr;
  with_compute_type(q_t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> q(q_t), kv(kv_t), P(probs), dy(dout);
    Out<T> dq(dq_t, true), dkv(dkv_t, true);
    const int64_t ldq = s.H * s.D, ldkv = 2 * s.H * s.D;
    backward_all<T>(
        P, cross_geometry(s, mask), dropout,
        [&](int64_t b, int64_t h) {
          const T* k = kv.get() + b * s.Tk * ldkv + h * 2 * s.D;
          return Block<T>{q.get() + b * s.Tq * ldq + h * s.D, k, k + s.D, ldq, ldkv, nullptr, ldq};
        },
        [&](int64_t b, int64_t h) {
          T* dk = dkv.get() + b * s.Tk * ldkv + h * 2 * s.D;
          return GradBlock<T>{dq.get() + b * s.Tq * ldq + h * s.D, dk, dk + s.D, dy.get() + b * s.Tq * ldq + h * s.D};
        });
    dq.commit();
    dkv.commit();
  });
}

}  // namespace megabatch::ops::cpu
