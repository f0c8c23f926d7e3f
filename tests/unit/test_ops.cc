// Every CPU op: backward against central finite differences in fp64 (the ops are
// templates; the fp64 instantiation is the same code as fp32), fp32 against fp64 with a
// tolerance derived from the fp32 epsilon and the reduction length, and the masks and
// shapes that break kernels: sizes 1, primes, lengths that are not multiples of the
// vector width, attention rows whose keys are all masked.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <functional>
#include <random>
#include <sstream>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/cpu/vecmath.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/dropout.h"
#include "core/ops/embedding.h"
#include "core/ops/gelu.h"
#include "core/ops/layernorm.h"
#include "core/ops/matmul.h"
#include "core/ops/residual.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
namespace ops = megabatch::ops;
using Vec = std::vector<double>;

namespace {

Vec randn(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 g(seed);
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks analytic[i] == d loss / d x[i] by central differences (h = 1e-6; the error is
// O(h^2) + O(eps / h), about 1e-10, so 1e-6 relative is a strict bound).
void expect_fd(const std::function<double(const Vec&)>& loss, Vec x, const Vec& analytic, const char* what) {
  ASSERT_EQ(x.size(), analytic.size());
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss(x);
    x[i] = keep - h;
    const double down = loss(x);
    x[i] = keep;
    const double fd = (up - down) / (2 * h);
    EXPECT_NEAR(analytic[i], fd, 1e-6 * std::max(1.0, std::abs(fd))) << what << " element " << i;
  }
}

std::vector<float> to_f(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }

// fp32 result against the fp64 one: |f - d| <= 4 K eps32 max(1, |d|) for reductions of length K.
void expect_fp32_close(const std::vector<float>& f, const Vec& d, double K, const char* what) {
  ASSERT_EQ(f.size(), d.size());
  for (size_t i = 0; i < d.size(); ++i)
    EXPECT_NEAR(f[i], d[i], 4.0 * K * FLT_EPSILON * std::max(1.0, std::abs(d[i]))) << what << " element " << i;
}

}  // namespace

TEST(VecMath, ExpWithinTwoUlpOverTheWholeRange) {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 0.00731) {
    const double ref = std::exp(static_cast<double>(static_cast<float>(x)));
    const double got = ops::cpu::vexp(static_cast<float>(x));
    worst = std::max(worst, std::abs(got - ref) / ref);
  }
  EXPECT_LT(worst, 2.0 * FLT_EPSILON) << "relative error of vexp";
  EXPECT_NEAR(ops::cpu::vtanh(0.3f), std::tanh(0.3), 4 * FLT_EPSILON);
  EXPECT_EQ(ops::cpu::vtanh(30.0f), 1.0f);
  EXPECT_EQ(ops::cpu::vtanh(-30.0f), -1.0f);
}

class LinearShapes : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(LinearShapes, BackwardMatchesFiniteDifferences) {
  const auto [n, I, O] = GetParam();
  const Vec x = randn(n * I, 1), w = randn(O * I, 2), b = randn(O, 3), r = randn(n * O, 4);
  auto loss = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
    Vec out(n * O);
    ops::linear_forward(out.data(), xx.data(), ww.data(), bb.data(), n, I, O);
    return dot(out, r);
  };
  Vec dx(n * I, 0.5), dw(O * I, 0.25), db(O, -1.0);  // backward accumulates onto what is there
  ops::linear_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), n, I, O);
  for (auto& v : dx) v -= 0.5;
  for (auto& v : dw) v -= 0.25;
  for (auto& v : db) v += 1.0;
  expect_fd([&](const Vec& v) { return loss(v, w, b); }, x, dx, "dx");
  expect_fd([&](const Vec& v) { return loss(x, v, b); }, w, dw, "dw");
  expect_fd([&](const Vec& v) { return loss(x, w, v); }, b, db, "db");
  // fp32 instantiation against fp64
  std::vector<float> xf = to_f(x), wf = to_f(w), bf = to_f(b), of(n * O);
  ops::linear_forward(of.data(), xf.data(), wf.data(), bf.data(), n, I, O);
  Vec od32(n * O);  // fp64 on the fp32-rounded inputs
  ops::linear_forward(od32.data(), Vec(xf.begin(), xf.end()).data(), Vec(wf.begin(), wf.end()).data(),
                      Vec(bf.begin(), bf.end()).data(), n, I, O);
  expect_fp32_close(of, od32, I + 1, "linear fp32");
}

INSTANTIATE_TEST_SUITE_P(Ops, LinearShapes,
                         ::testing::Values(std::make_tuple(1, 1, 1), std::make_tuple(1, 13, 5),
                                           std::make_tuple(7, 1, 17), std::make_tuple(3, 17, 11),
                                           std::make_tuple(5, 8, 16)));

class LayerNormShapes : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(LayerNormShapes, BackwardMatchesFiniteDifferences) {
  const auto [n, C] = GetParam();
  const Vec x = randn(n * C, 5, 2.0), w = randn(C, 6), b = randn(C, 7), r = randn(n * C, 8);
  auto loss = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
    Vec out(n * C), mean(n), rstd(n);
    ops::layernorm_forward(out.data(), mean.data(), rstd.data(), xx.data(), ww.data(), bb.data(), n, C, 1e-5);
    return dot(out, r);
  };
  Vec out(n * C), mean(n), rstd(n), dx(n * C), dw(C), db(C);
  ops::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, C, 1e-5);
  ops::layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(), rstd.data(), n,
                          C);
  expect_fd([&](const Vec& v) { return loss(v, w, b); }, x, dx, "dx");
  expect_fd([&](const Vec& v) { return loss(x, v, b); }, w, dw, "dweight");
  expect_fd([&](const Vec& v) { return loss(x, w, v); }, b, db, "dbias");
  // normalized rows: mean 0 and variance 1 before the affine part
  Vec ones(C, 1.0), zeros(C, 0.0), y(n * C);
  ops::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), ones.data(), zeros.data(), n, C, 0.0);
  if (C > 1) {
    for (int i = 0; i < n; ++i) {
      double m = 0, v = 0;
      for (int c = 0; c < C; ++c) m += y[i * C + c] / C;
      for (int c = 0; c < C; ++c) v += (y[i * C + c] - m) * (y[i * C + c] - m) / C;
      EXPECT_NEAR(m, 0.0, 1e-12);
      EXPECT_NEAR(v, 1.0, 1e-9);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, LayerNormShapes,
                         ::testing::Values(std::make_tuple(1, 1), std::make_tuple(1, 3), std::make_tuple(5, 17),
                                           std::make_tuple(40, 7)));  // 40 rows: two row blocks

TEST(Gelu, MatchesTheTanhFormulaAndFiniteDifferences) {
  const Vec x = randn(37, 9, 3.0), r = randn(37, 10);
  Vec y(37), dx(37);
  ops::gelu_forward(y.data(), x.data(), 37);
  for (int i = 0; i < 37; ++i) {
    const double v = x[i];
    EXPECT_NEAR(y[i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-15);
  }
  ops::gelu_backward(dx.data(), r.data(), x.data(), 37);
  expect_fd(
      [&](const Vec& v) {
        Vec o(37);
        ops::gelu_forward(o.data(), v.data(), 37);
        return dot(o, r);
      },
      x, dx, "gelu");
  std::vector<float> yf(37);
  ops::gelu_forward(yf.data(), to_f(x).data(), 37);
  Vec yd(37);
  const auto xf = to_f(x);
  ops::gelu_forward(yd.data(), Vec(xf.begin(), xf.end()).data(), 37);
  expect_fp32_close(yf, yd, 8, "gelu fp32");
}

TEST(Residual, BackwardPassesTheGradientToBothInputs) {
  const Vec a = randn(13, 11), b = randn(13, 12), d = randn(13, 13);
  Vec out(13), da(13, 1.0), db(13, 2.0);
  ops::residual_forward(out.data(), a.data(), b.data(), 13);
  ops::residual_backward(da.data(), db.data(), d.data(), 13);
  for (int i = 0; i < 13; ++i) {
    EXPECT_EQ(out[i], a[i] + b[i]);
    EXPECT_EQ(da[i], 1.0 + d[i]);
    EXPECT_EQ(db[i], 2.0 + d[i]);
  }
}

TEST(Dropout, MaskIsAFunctionOfKeyStreamAndElementOnly) {
  const ops::DropoutKey k{0.3, 42, 7};
  const int64_t n = 100003;
  std::vector<uint8_t> whole(n), part(n);
  ops::dropout_mask(whole.data(), n, 0, k);
  // the same elements generated in uneven pieces at their offsets
  const int64_t cuts[] = {0, 1, 6, 4099, 65537, n};
  for (int c = 0; c + 1 < 6; ++c) ops::dropout_mask(part.data() + cuts[c], cuts[c + 1] - cuts[c], cuts[c], k);
  EXPECT_EQ(whole, part);
  double kept = 0;
  for (auto m : whole) kept += m;
  // binomial: mean 0.7 n, std sqrt(n 0.21) = 145; 6 sigma
  EXPECT_NEAR(kept, 0.7 * n, 6 * std::sqrt(n * 0.21));
  std::vector<uint8_t> other(n);
  ops::dropout_mask(other.data(), n, 0, ops::DropoutKey{0.3, 43, 7});
  EXPECT_NE(whole, other);
  ops::dropout_mask(other.data(), n, 0, ops::DropoutKey{0.3, 42, 8});
  EXPECT_NE(whole, other);
}

TEST(Dropout, ForwardScalesKeptElementsAndBackwardMatchesFiniteDifferences) {
  const ops::DropoutKey k{0.25, 9, 1};
  const Vec x = randn(29, 14), r = randn(29, 15);
  Vec y(29), dx(29);
  ops::dropout_forward(y.data(), x.data(), 29, 5, k);
  std::vector<uint8_t> keep(29);
  ops::dropout_mask(keep.data(), 29, 5, k);
  for (int i = 0; i < 29; ++i) EXPECT_DOUBLE_EQ(y[i], keep[i] ? x[i] / 0.75 : 0.0);
  ops::dropout_backward(dx.data(), r.data(), 29, 5, k);
  expect_fd(
      [&](const Vec& v) {
        Vec o(29);
        ops::dropout_forward(o.data(), v.data(), 29, 5, k);
        return dot(o, r);
      },
      x, dx, "dropout");
}

struct AttnCase {
  int B, T, H, D;
  bool causal;
  int mask;  // 0 none, 1 pad the tail of batch 0, 2 every key of batch 0 masked, 3 pad the first key
  double p;  // attention dropout
};

class AttentionCases : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionCases, BackwardMatchesFiniteDifferences) {
  const AttnCase c = GetParam();
  ops::AttentionShape s{c.B, c.T, c.H, c.D, c.causal, 0, 0};
  std::vector<uint8_t> mask;
  if (c.mask) {
    mask.assign(c.B * c.T, 1);
    for (int t = 0; t < c.T; ++t) {
      if (c.mask == 1 && t >= c.T / 2 + 1) mask[t] = 0;
      if (c.mask == 2) mask[t] = 0;
      if (c.mask == 3 && t == 0) mask[t] = 0;
    }
  }
  const uint8_t* m = mask.empty() ? nullptr : mask.data();
  const ops::DropoutKey dk{c.p, 77, 3};
  const size_t nq = c.B * c.T * c.H * 3 * c.D, no = c.B * c.T * c.H * c.D;
  const Vec qkv = randn(nq, 16), r = randn(no, 17);
  auto loss = [&](const Vec& x) {
    Vec out(no), probs(c.B * c.H * c.T * c.T);
    ops::attention_forward(out.data(), probs.data(), x.data(), m, s, &dk);
    return dot(out, r);
  };
  Vec out(no), probs(c.B * c.H * c.T * c.T), dqkv(nq);
  ops::attention_forward(out.data(), probs.data(), qkv.data(), m, s, &dk);
  ops::attention_backward(dqkv.data(), r.data(), qkv.data(), probs.data(), m, s, &dk);
  expect_fd(loss, qkv, dqkv, "dqkv");
  // probabilities: rows sum to 1 over allowed keys, 0 on masked keys and fully masked rows
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.H; ++h)
      for (int i = 0; i < c.T; ++i) {
        double sum = 0;
        bool any = false;
        for (int j = 0; j < c.T; ++j) {
          const bool ok = (!c.causal || j <= i) && (!m || m[b * c.T + j]);
          const double pij = probs[((b * c.H + h) * c.T + i) * c.T + j];
          if (!ok) {
            EXPECT_EQ(pij, 0.0);
          }
          any |= ok;
          sum += pij;
        }
        EXPECT_NEAR(sum, any ? 1.0 : 0.0, 1e-12);
        if (!any) {
          for (int d = 0; d < c.D; ++d) EXPECT_EQ(out[((b * c.T + i) * c.H + h) * c.D + d], 0.0);
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Ops, AttentionCases,
                         ::testing::Values(AttnCase{1, 1, 1, 1, true, 0, 0.0}, AttnCase{2, 5, 3, 4, true, 0, 0.0},
                                           AttnCase{2, 7, 2, 3, false, 1, 0.0}, AttnCase{2, 5, 1, 4, false, 2, 0.0},
                                           AttnCase{1, 6, 2, 2, true, 3, 0.0}, AttnCase{2, 5, 2, 3, true, 0, 0.3}));

TEST(Attention, AdditiveBiasGradientMatchesFiniteDifferences) {
  ops::AttentionShape s{2, 5, 2, 3, true, 0, 0};
  const size_t nq = 2 * 5 * 2 * 3 * 3, no = 2 * 5 * 2 * 3, nb = 2 * 5 * 5, np = 2 * 2 * 5 * 5;
  const std::vector<uint8_t> mask = {1, 1, 1, 1, 0, 1, 1, 1, 1, 1};
  const ops::DropoutKey dk{0.2, 79, 5};
  const Vec qkv = randn(nq, 44), bias = randn(nb, 45), r = randn(no, 46);
  Vec out(no), probs(np), dqkv(nq), dbias(nb);
  ops::attention_forward(out.data(), probs.data(), qkv.data(), mask.data(), s, &dk, bias.data());
  ops::attention_backward(dqkv.data(), r.data(), qkv.data(), probs.data(), mask.data(), s, &dk, dbias.data());
  auto loss = [&](const Vec& x, const Vec& b) {
    Vec o(no), pr(np);
    ops::attention_forward(o.data(), pr.data(), x.data(), mask.data(), s, &dk, b.data());
    return dot(o, r);
  };
  expect_fd([&](const Vec& x) { return loss(x, bias); }, qkv, dqkv, "dqkv with bias");
  expect_fd([&](const Vec& b) { return loss(qkv, b); }, bias, dbias, "dbias");
}

TEST(Attention, RelativePositionBucketsMatchAnIndependentImplementation) {
  // The reference: T5's bucketing written in Python (math.log on floats, as the original).
  const auto r = mb::testing::run_command("/usr/bin/python3 -c \"import math\n"
      "def b(rel, bidi, nb=32, md=128):\n"
      "  out, n = 0, -rel\n"
      "  if bidi:\n"
      "    nb //= 2; out += nb if n < 0 else 0; n = abs(n)\n"
      "  else:\n"
      "    n = max(n, 0)\n"
      "  ex = nb // 2\n"
      "  if n < ex: return out + n\n"
      "  return out + min(ex + int(math.log(n / ex) / math.log(md / ex) * (nb - ex)), nb - 1)\n"
      "print(' '.join(str(b(j - i, bd)) for bd in (True, False) for i in (0, 7, 300) for j in range(0, 400, 3)))\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream in(r.output);
  for (bool bidi : {true, false})
    for (int i : {0, 7, 300})
      for (int j = 0; j < 400; j += 3) {
        int expected = -1;
        in >> expected;
        EXPECT_EQ(ops::relative_position_bucket(i, j, bidi, 32, 128), expected) << i << " " << j << " " << bidi;
      }
}

struct CrossCase {
  int B, Tq, Tk, H, D;
  bool pad;  // pad the tail of batch 0's encoder positions
  double p;  // attention dropout
};

class CrossAttentionCases : public ::testing::TestWithParam<CrossCase> {};

TEST_P(CrossAttentionCases, BackwardMatchesFiniteDifferencesForQueriesKeysAndValues) {
  const CrossCase c = GetParam();
  ops::CrossAttentionShape s{c.B, c.Tq, c.Tk, c.H, c.D, 0, 0};
  std::vector<uint8_t> mask;
  if (c.pad) {
    mask.assign(c.B * c.Tk, 1);
    for (int t = c.Tk / 2 + 1; t < c.Tk; ++t) mask[t] = 0;
  }
  const uint8_t* m = mask.empty() ? nullptr : mask.data();
  const ops::DropoutKey dk{c.p, 78, 4};
  const size_t nq = c.B * c.Tq * c.H * c.D, nkv = c.B * c.Tk * c.H * 2 * c.D, np = c.B * c.H * c.Tq * c.Tk;
  const Vec q = randn(nq, 41), kv = randn(nkv, 42), r = randn(nq, 43);
  Vec out(nq), probs(np), dq(nq), dkv(nkv);
  ops::cross_attention_forward(out.data(), probs.data(), q.data(), kv.data(), m, s, &dk);
  ops::cross_attention_backward(dq.data(), dkv.data(), r.data(), q.data(), kv.data(), probs.data(), m, s, &dk);
  expect_fd(
      [&](const Vec& x) {
        Vec o(nq), pr(np);
        ops::cross_attention_forward(o.data(), pr.data(), x.data(), kv.data(), m, s, &dk);
        return dot(o, r);
      },
      q, dq, "dq");
  expect_fd(
      [&](const Vec& x) {
        Vec o(nq), pr(np);
        ops::cross_attention_forward(o.data(), pr.data(), q.data(), x.data(), m, s, &dk);
        return dot(o, r);
      },
      kv, dkv, "dkv");
  // backward accumulates: a second call doubles both gradients
  Vec dq2 = dq, dkv2 = dkv;
  ops::cross_attention_backward(dq2.data(), dkv2.data(), r.data(), q.data(), kv.data(), probs.data(), m, s, &dk);
  for (size_t i = 0; i < nq; ++i) EXPECT_NEAR(dq2[i], 2 * dq[i], 1e-12) << "dq " << i;
  for (size_t i = 0; i < nkv; ++i) EXPECT_NEAR(dkv2[i], 2 * dkv[i], 1e-12) << "dkv " << i;
  // every query attends to every unpadded encoder position: rows sum to 1, padded keys get 0
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.H; ++h)
      for (int i = 0; i < c.Tq; ++i) {
        double sum = 0;
        for (int j = 0; j < c.Tk; ++j) {
          const double pij = probs[((b * c.H + h) * c.Tq + i) * c.Tk + j];
          if (m && !m[b * c.Tk + j]) {
            EXPECT_EQ(pij, 0.0);
          }
          sum += pij;
        }
        EXPECT_NEAR(sum, 1.0, 1e-12);
      }
}

// Queries shorter and longer than the keys, a prime width, masks, dropout.
INSTANTIATE_TEST_SUITE_P(Ops, CrossAttentionCases,
                         ::testing::Values(CrossCase{1, 1, 1, 1, 1, false, 0.0}, CrossCase{2, 3, 7, 2, 3, true, 0.0},
                                           CrossCase{2, 6, 4, 1, 5, false, 0.0}, CrossCase{2, 4, 5, 2, 2, true, 0.3}));

TEST(Attention, Fp32MatchesFp64) {
  ops::AttentionShape s{2, 13, 3, 5, true, 0, 0};
  const size_t nq = 2 * 13 * 3 * 3 * 5, no = 2 * 13 * 3 * 5;
  const auto qf = to_f(randn(nq, 18));
  const Vec qd(qf.begin(), qf.end());
  std::vector<float> of(no), pf(2 * 3 * 13 * 13);
  Vec od(no), pd(2 * 3 * 13 * 13);
  ops::attention_forward(of.data(), pf.data(), qf.data(), nullptr, s, nullptr);
  ops::attention_forward(od.data(), pd.data(), qd.data(), nullptr, s, nullptr);
  expect_fp32_close(of, od, 13 * 5, "attention fp32");
}

TEST(Embedding, LooksUpItsShardAndScatterAddsRepeatedIds) {
  const int C = 3, rows = 4, begin = 5;  // this shard holds rows 5..8 of the full table
  const Vec table = randn(rows * C, 19);
  const int32_t ids[] = {5, 9, 8, 5, 0, 6};
  Vec out(6 * C);
  ops::embedding_forward(out.data(), ids, table.data(), 6, C, begin, rows);
  for (int i = 0; i < 6; ++i)
    for (int c = 0; c < C; ++c) {
      const int r = ids[i] - begin;
      EXPECT_EQ(out[i * C + c], (r >= 0 && r < rows) ? table[r * C + c] : 0.0) << i;
    }
  const Vec d = randn(6 * C, 20);
  Vec dt(rows * C);
  ops::embedding_backward(dt.data(), d.data(), ids, 6, C, begin, rows);
  expect_fd(
      [&](const Vec& t) {
        Vec o(6 * C);
        ops::embedding_forward(o.data(), ids, t.data(), 6, C, begin, rows);
        return dot(o, d);
      },
      table, dt, "dtable");
}

class CrossEntropyShapes : public ::testing::TestWithParam<int> {};

TEST_P(CrossEntropyShapes, LossIsLogSoftmaxAndBackwardMatchesFiniteDifferences) {
  const int V = GetParam(), n = 5;
  const Vec logits = randn(n * V, 21, 3.0);
  std::vector<int32_t> t = {0, V - 1, -1, V / 2, 0};  // one ignored row
  Vec losses(n);
  ops::cross_entropy_forward(losses.data(), logits.data(), t.data(), n, V, -1);
  for (int i = 0; i < n; ++i) {
    if (t[i] == -1) {
      EXPECT_EQ(losses[i], 0.0);
      continue;
    }
    double z = 0;
    for (int j = 0; j < V; ++j) z += std::exp(logits[i * V + j]);
    EXPECT_NEAR(losses[i], std::log(z) - logits[i * V + t[i]], 1e-12);
  }
  const Vec w = randn(n, 22);  // dloss per row
  Vec d(n * V);
  ops::cross_entropy_backward(d.data(), logits.data(), t.data(), w.data(), n, V, -1);
  for (int j = 0; j < V; ++j) EXPECT_EQ(d[2 * V + j], 0.0) << "ignored row has no gradient";
  expect_fd(
      [&](const Vec& l) {
        Vec ls(n);
        ops::cross_entropy_forward(ls.data(), l.data(), t.data(), n, V, -1);
        return dot(ls, w);
      },
      logits, d, "dlogits");
  // the same loss from two vocabulary shards combined as VocabParallelCrossEntropy does
  if (V >= 2) {
    const int V0 = V / 2, V1 = V - V0;
    Vec l0(n * V0), l1(n * V1);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < V; ++j) (j < V0 ? l0[i * V0 + j] : l1[i * V1 + j - V0]) = logits[i * V + j];
    Vec m0(n), m1(n), s0(n), s1(n), t0(n), t1(n), m(n), s(n), tl(n), ls(n);
    ops::ce_row_max(m0.data(), l0.data(), n, V0);
    ops::ce_row_max(m1.data(), l1.data(), n, V1);
    for (int i = 0; i < n; ++i) m[i] = std::max(m0[i], m1[i]);
    ops::ce_sum_exp(s0.data(), l0.data(), m.data(), n, V0);
    ops::ce_sum_exp(s1.data(), l1.data(), m.data(), n, V1);
    ops::ce_target_logit(t0.data(), l0.data(), t.data(), n, V0, 0);
    ops::ce_target_logit(t1.data(), l1.data(), t.data(), n, V1, V0);
    for (int i = 0; i < n; ++i) s[i] = s0[i] + s1[i], tl[i] = t0[i] + t1[i];
    ops::ce_loss(ls.data(), m.data(), s.data(), tl.data(), t.data(), n, -1);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(ls[i], losses[i], 1e-12);
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, CrossEntropyShapes, ::testing::Values(1, 7, 33));
