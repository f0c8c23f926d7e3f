// Flash attention on the CPU: the reference for the CUDA kernels, each query row in f64.
// The forward gives what the kernels must (out and the row's log-sum-exp); the backward
// recomputes the probabilities from lse as the kernels do. Not a fast path: the layers take
// the explicit attention on the CPU.
#include <cmath>
#include <limits>
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

struct Rows {
  const AttentionShape& s;
  std::vector<double> qkv;
  std::vector<uint8_t> mask;
  int64_t total_heads() const { return s.total_heads ? s.total_heads : s.H; }
  // element (b, t, h, which, d) of qkv
  size_t at(int64_t b, int64_t t, int64_t h, int64_t which, int64_t d) const {
    return static_cast<size_t>((((b * s.T + t) * s.H + h) * 3 + which) * s.D + d);
  }
  bool valid(int64_t b, int64_t i, int64_t j) const {
    if (s.causal && j > i) return false;
    return mask.empty() || mask[static_cast<size_t>(b * s.T + j)] != 0;
  }
  // the scaled score of query i and key j in (b, h)
  double score(int64_t b, int64_t h, int64_t i, int64_t j) const {
    double acc = 0;
    for (int64_t d = 0; d < s.D; ++d) acc += qkv[at(b, i, h, 0, d)] * qkv[at(b, j, h, 1, d)];
    return acc / std::sqrt(static_cast<double>(s.D));
  }
  // the dropout factors of the (T, T) block of (b, h): 0 or 1 / (1 - p)
  std::vector<double> dropout(int64_t b, int64_t h, const DropoutKey* k) const {
    std::vector<double> z(static_cast<size_t>(s.T * s.T), 1.0);
    if (!k || k->p <= 0) return z;
    std::vector<uint8_t> keep(z.size());
    dropout_mask(keep.data(), s.T * s.T, static_cast<uint64_t>((b * total_heads() + s.head_offset + h) * s.T * s.T), *k);
    for (size_t e = 0; e < z.size(); ++e) z[e] = keep[e] ? 1.0 / (1.0 - k->p) : 0.0;
    return z;
  }
};

Rows rows_of(const AttentionShape& s, const Tensor& qkv, const Tensor& key_mask) {
  Rows r{s, to_host_f64(qkv), {}};
  if (key_mask.defined()) r.mask.assign(key_mask.data<uint8_t>(), key_mask.data<uint8_t>() + key_mask.numel());
  return r;
}

}  // namespace

void flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& key_mask,
                             const AttentionShape& s, const DropoutKey* dropout) {
  const Rows r = rows_of(s, qkv, key_mask);
  std::vector<double> o(static_cast<size_t>(s.B * s.T * s.H * s.D), 0.0), l(static_cast<size_t>(s.B * s.H * s.T));
  std::vector<double> p(static_cast<size_t>(s.T));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const std::vector<double> z = r.dropout(b, h, dropout);
      for (int64_t i = 0; i < s.T; ++i) {
        double mx = -kInf;
        for (int64_t j = 0; j < s.T; ++j) {
          p[j] = r.valid(b, i, j) ? r.score(b, h, i, j) : -kInf;
          mx = std::max(mx, p[j]);
        }
        double& row_lse = l[static_cast<size_t>((b * s.H + h) * s.T + i)];
        if (mx == -kInf) {  // every key masked: output 0
          row_lse = kInf;
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < s.T; ++j) sum += p[j] == -kInf ? 0.0 : std::exp(p[j] - mx);
        row_lse = mx + std::log(sum);
        for (int64_t j = 0; j < s.T; ++j) {
          const double w = p[j] == -kInf ? 0.0 : std::exp(p[j] - row_lse) * z[static_cast<size_t>(i * s.T + j)];
          if (w == 0.0) continue;
          for (int64_t d = 0; d < s.D; ++d) o[static_cast<size_t>(((b * s.T + i) * s.H + h) * s.D + d)] += w * r.qkv[r.at(b, j, h, 2, d)];
        }
      }
    }
  store(out, o);
  store(lse, l);
}

void flash_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, const Tensor& key_mask, const AttentionShape& s,
                              const DropoutKey* dropout, Write w) {
  const Rows r = rows_of(s, qkv, key_mask);
  const std::vector<double> dO = to_host_f64(dout), O = to_host_f64(out), L = to_host_f64(lse);
  std::vector<double> g = w == Write::kAdd ? to_host_f64(dqkv) : std::vector<double>(dqkv.numel(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  auto o_at = [&](int64_t b, int64_t t, int64_t h, int64_t d) { return static_cast<size_t>(((b * s.T + t) * s.H + h) * s.D + d); };
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const std::vector<double> z = r.dropout(b, h, dropout);
      for (int64_t i = 0; i < s.T; ++i) {
        const double row_lse = L[static_cast<size_t>((b * s.H + h) * s.T + i)];
        if (row_lse == kInf) continue;  // every key masked: no gradient
        double Di = 0;  // dout . out of the row
        for (int64_t d = 0; d < s.D; ++d) Di += dO[o_at(b, i, h, d)] * O[o_at(b, i, h, d)];
        for (int64_t j = 0; j < s.T; ++j) {
          if (!r.valid(b, i, j)) continue;
          const double P = std::exp(r.score(b, h, i, j) - row_lse), Z = z[static_cast<size_t>(i * s.T + j)];
          double dP = 0;  // dout_i . v_j
          for (int64_t d = 0; d < s.D; ++d) dP += dO[o_at(b, i, h, d)] * r.qkv[r.at(b, j, h, 2, d)];
          const double dS = P * (Z * dP - Di) * scale;
          for (int64_t d = 0; d < s.D; ++d) {
            g[r.at(b, j, h, 2, d)] += P * Z * dO[o_at(b, i, h, d)];  // dv
            g[r.at(b, i, h, 0, d)] += dS * r.qkv[r.at(b, j, h, 1, d)];  // dq
            g[r.at(b, j, h, 1, d)] += dS * r.qkv[r.at(b, i, h, 0, d)];  // dk
          }
        }
      }
    }
  store(dqkv, g);
}

}  // namespace megabatch::ops::cpu
