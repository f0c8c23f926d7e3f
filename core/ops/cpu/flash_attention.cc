// Flash attention on the CPU: the reference for the CUDA kernels, each query row in f64.
// The forward gives what the kernels must (out and the row's log-sum-exp); the backward
// recomputes the probabilities from lse as the kernels do. Not a fast path: the layers take
// the explicit attention on the CPU. Self- and cross-attention are one problem: queries and
// keys/values at their own places (strides) in their tensors.
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "core/ops/backends.h"

namespace megabatch::ops::cpu {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The tensors as f64 values (any dtype), and back with the tensor's rounding.
void store(const Tensor& t, const std::vector<double>& v) {
  if (t.dtype() == DType::kF64)
    copy(t, from_host(v, t.shape()));
  else
    copy(t, from_host(std::vector<float>(v.begin(), v.end()), t.shape(), t.dtype()));
}

// Where element d of head h of token t sits: (b * T + t) * tok + (h / per) * head +
// (h % per) * inner + off + d: heads in groups of `per` (grouped-query attention: a group's
// queries side by side, inner = D; its one key or value, inner = 0; otherwise per = 1).
struct Place {
  int64_t T, tok, head, off, per = 1, inner = 0;
  size_t at(int64_t b, int64_t t, int64_t h, int64_t d) const {
    return static_cast<size_t>((b * T + t) * tok + h / per * head + h % per * inner + off + d);
  }
};

struct Problem {
  int64_t B, Tq, Tk, H, D;
  bool causal;
  int64_t head_offset, total_heads;
  Place q, k, v;                       // q in qs; k and v in kvs
  const std::vector<double>* qs;
  const std::vector<double>* kvs;      // the same vector as qs for self-attention
  std::vector<uint8_t> mask;           // (B, Tk) or empty
  std::vector<double> bias;            // (H, Tq, Tk) or empty: added to the scaled scores
  std::vector<int32_t> documents = {};  // self-attention: (B, T) or empty
  size_t out_at(int64_t b, int64_t i, int64_t h, int64_t d) const {
    return static_cast<size_t>(((b * Tq + i) * H + h) * D + d);
  }
  size_t lse_at(int64_t b, int64_t h, int64_t i) const { return static_cast<size_t>((b * H + h) * Tq + i); }
  bool valid(int64_t b, int64_t i, int64_t j) const {
    if (causal && j > i) return false;
    if (!documents.empty() && documents[static_cast<size_t>(b * Tq + i)] != documents[static_cast<size_t>(b * Tk + j)])
      return false;
    return mask.empty() || mask[static_cast<size_t>(b * Tk + j)] != 0;
  }
  // the scaled score of query i and key j in (b, h)
  double score(int64_t b, int64_t h, int64_t i, int64_t j) const {
    double acc = 0;
    for (int64_t d = 0; d < D; ++d) acc += (*qs)[q.at(b, i, h, d)] * (*kvs)[k.at(b, j, h, d)];
    return acc / std::sqrt(static_cast<double>(D)) + (bias.empty() ? 0.0 : bias[static_cast<size_t>((h * Tq + i) * Tk + j)]);
  }
  // the dropout factors of the (Tq, Tk) block of (b, h): 0 or 1 / (1 - p), drawn as the
  // explicit attention draws element (b, global head, i, j) of (B, total heads, Tq, Tk)
  std::vector<double> dropout(int64_t b, int64_t h, const DropoutKey* key) const {
    std::vector<double> z(static_cast<size_t>(Tq * Tk), 1.0);
    if (!key || key->p <= 0) return z;
    std::vector<uint8_t> keep(z.size());
    dropout_mask(keep.data(), Tq * Tk, static_cast<uint64_t>((b * total_heads + head_offset + h) * Tq * Tk), *key);
    for (size_t e = 0; e < z.size(); ++e) z[e] = keep[e] ? 1.0 / (1.0 - key->p) : 0.0;
    return z;
  }
};

std::vector<uint8_t> mask_of(const Tensor& key_mask) {
  if (!key_mask.defined()) return {};
  return std::vector<uint8_t>(key_mask.data<uint8_t>(), key_mask.data<uint8_t>() + key_mask.numel());
}

// self-attention: G groups of [H/G queries, a key, a value] in qkv (B, T, G, H/G + 2, D), the
// bias (H, T, T) if any
Problem self_problem(const AttentionShape& s, const std::vector<double>& qkv, const Tensor& key_mask, const Tensor& bias) {
  const int64_t r = heads_per_group(s);
  const Place q{s.T, qkv_width(s), (r + 2) * s.D, 0, r, s.D};
  Place k = q, v = q;
  k.inner = v.inner = 0;
  k.off = r * s.D;
  v.off = (r + 1) * s.D;
  std::vector<double> b = bias.defined() ? cpu_values_f64(bias) : std::vector<double>{};
  return {s.B, s.T, s.T, s.H, s.D, s.causal, s.head_offset, s.total_heads ? s.total_heads : s.H, q, k, v,
          &qkv, &qkv, mask_of(key_mask), std::move(b)};
}

// ... and its documents (B, T), when defined
Problem with_documents(Problem p, const Tensor& documents) {
  if (documents.defined()) p.documents.assign(documents.data<int32_t>(), documents.data<int32_t>() + documents.numel());
  return p;
}

// cross-attention: q (B, Tq, H, D), k and v side by side in kv (B, Tk, H, 2, D)
Problem cross_problem(const CrossAttentionShape& s, const std::vector<double>& q, const std::vector<double>& kv,
                      const Tensor& key_mask) {
  const Place qp{s.Tq, s.H * s.D, s.D, 0}, k{s.Tk, s.H * 2 * s.D, 2 * s.D, 0}, v{s.Tk, s.H * 2 * s.D, 2 * s.D, s.D};
  return {s.B, s.Tq, s.Tk, s.H, s.D, false, s.head_offset, s.total_heads ? s.total_heads : s.H, qp, k, v,
          &q, &kv, mask_of(key_mask), {}};
}

void forward(const Problem& p, const Tensor& out, const Tensor& lse, const DropoutKey* dropout) {
  std::vector<double> o(static_cast<size_t>(p.B * p.Tq * p.H * p.D), 0.0), l(static_cast<size_t>(p.B * p.H * p.Tq));
  std::vector<double> sc(static_cast<size_t>(p.Tk));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h) {
      const std::vector<double> z = p.dropout(b, h, dropout);
      for (int64_t i = 0; i < p.Tq; ++i) {
        double mx = -kInf;
        for (int64_t j = 0; j < p.Tk; ++j) {
          sc[j] = p.valid(b, i, j) ? p.score(b, h, i, j) : -kInf;
          mx = std::max(mx, sc[j]);
        }
        double& row_lse = l[p.lse_at(b, h, i)];
        if (mx == -kInf) {  // every key masked: output 0
          row_lse = kInf;
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < p.Tk; ++j) sum += sc[j] == -kInf ? 0.0 : std::exp(sc[j] - mx);
        row_lse = mx + std::log(sum);
        for (int64_t j = 0; j < p.Tk; ++j) {
          const double w = sc[j] == -kInf ? 0.0 : std::exp(sc[j] - row_lse) * z[static_cast<size_t>(i * p.Tk + j)];
          if (w == 0.0) continue;
          for (int64_t d = 0; d < p.D; ++d) o[p.out_at(b, i, h, d)] += w * (*p.kvs)[p.v.at(b, j, h, d)];
        }
      }
    }
  store(out, o);
  store(lse, l);
}

// gq (q's layout) and gkv (k's and v's) += the gradients; the same vector for self-attention;
// gbias (H, Tq, Tk), when not null, += the bias's (batch rows in order)
void backward(const Problem& p, std::vector<double>& gq, std::vector<double>& gkv, std::vector<double>* gbias,
              const Tensor& dout, const Tensor& out, const Tensor& lse, const DropoutKey* dropout) {
  const std::vector<double> dO = cpu_values_f64(dout), O = cpu_values_f64(out), L = cpu_values_f64(lse);
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.D));
  const std::vector<double>& qs = *p.qs;
  const std::vector<double>& kvs = *p.kvs;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h) {
      const std::vector<double> z = p.dropout(b, h, dropout);
      for (int64_t i = 0; i < p.Tq; ++i) {
        const double row_lse = L[p.lse_at(b, h, i)];
        if (row_lse == kInf) continue;  // every key masked: no gradient
        double Di = 0;  // dout . out of the row
        for (int64_t d = 0; d < p.D; ++d) Di += dO[p.out_at(b, i, h, d)] * O[p.out_at(b, i, h, d)];
        for (int64_t j = 0; j < p.Tk; ++j) {
          if (!p.valid(b, i, j)) continue;
          const double P = std::exp(p.score(b, h, i, j) - row_lse), Z = z[static_cast<size_t>(i * p.Tk + j)];
          double dP = 0;  // dout_i . v_j
          for (int64_t d = 0; d < p.D; ++d) dP += dO[p.out_at(b, i, h, d)] * kvs[p.v.at(b, j, h, d)];
          const double dS = P * (Z * dP - Di) * scale;  // with respect to q . k
          if (gbias) (*gbias)[static_cast<size_t>((h * p.Tq + i) * p.Tk + j)] += P * (Z * dP - Di);
          for (int64_t d = 0; d < p.D; ++d) {
            gkv[p.v.at(b, j, h, d)] += P * Z * dO[p.out_at(b, i, h, d)];  // dv
            gq[p.q.at(b, i, h, d)] += dS * kvs[p.k.at(b, j, h, d)];       // dq
            gkv[p.k.at(b, j, h, d)] += dS * qs[p.q.at(b, i, h, d)];       // dk
          }
        }
      }
    }
}

std::vector<double> start(const Tensor& grad, Write w) {
  return w == Write::kAdd ? cpu_values_f64(grad) : std::vector<double>(grad.numel(), 0.0);
}

}  // namespace

void flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& key_mask,
                             const AttentionShape& s, const DropoutKey* dropout, const Tensor& bias,
                             const Tensor& documents) {
  const std::vector<double> x = cpu_values_f64(qkv);
  forward(with_documents(self_problem(s, x, key_mask, bias), documents), out, lse, dropout);
}

void flash_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, const Tensor& key_mask, const AttentionShape& s,
                              const DropoutKey* dropout, Write w, const Tensor& bias, const Tensor& dbias,
                              const Tensor& documents) {
  const std::vector<double> x = cpu_values_f64(qkv);
  std::vector<double> g = start(dqkv, w);
  std::vector<double> gb = dbias.defined() ? cpu_values_f64(dbias) : std::vector<double>{};
  backward(with_documents(self_problem(s, x, key_mask, bias), documents), g, g, dbias.defined() ? &gb : nullptr, dout,
           out, lse, dropout);
  store(dqkv, g);
  if (dbias.defined()) store(dbias, gb);
}

void flash_cross_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& kv,
                                   const Tensor& key_mask, const CrossAttentionShape& s, const DropoutKey* dropout) {
  const std::vector<double> xq = cpu_values_f64(q), xkv = cpu_values_f64(kv);
  forward(cross_problem(s, xq, xkv, key_mask), out, lse, dropout);
}

void flash_cross_attention_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& q,
                                    const Tensor& kv, const Tensor& out, const Tensor& lse, const Tensor& key_mask,
                                    const CrossAttentionShape& s, const DropoutKey* dropout, Write w) {
  const std::vector<double> xq = cpu_values_f64(q), xkv = cpu_values_f64(kv);
  std::vector<double> gq = start(dq, w), gkv = start(dkv, w);
  backward(cross_problem(s, xq, xkv, key_mask), gq, gkv, nullptr, dout, out, lse, dropout);
  store(dq, gq);
  store(dkv, gkv);
}

}  // namespace megabatch::ops::cpu
