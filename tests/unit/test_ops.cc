// Every CPU op through the public op API: backward against central finite differences in
// f64 (the CPU kernels are templates; the f64 instantiation is the same code as f32), f32
// against f64 with a tolerance derived from the f32 unit roundoff and the reduction length,
// and the masks and shapes that break kernels: sizes 1, primes, lengths that are not
// multiples of the vector width, attention rows whose keys are all masked. (Each op on
// every device and dtype against this reference: test_ops_devices.cc and
// test_attention_devices.cc.)
#include <gtest/gtest.h>
#include <omp.h>

#include <cfloat>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

#include "core/ops/activation.h"
#include "core/ops/attention.h"
#include "core/ops/cpu/vecmath.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/dropout.h"
#include "core/ops/embedding.h"
#include "core/ops/layernorm.h"
#include "core/ops/matmul.h"
#include "core/ops/relative_position.h"
#include "core/ops/residual.h"
#include "core/ops/rotary.h"
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

// f64 and f32 CPU tensors holding a vector (copies), and the values of a tensor.
mb::Tensor t64(const Vec& v, std::vector<int64_t> shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  return mb::from_host(v, shape);
}
mb::Tensor t32(const std::vector<float>& v, std::vector<int64_t> shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  return mb::from_host(v, shape);
}
mb::Tensor ids(const std::vector<int32_t>& v) { return mb::from_host(v, {static_cast<int64_t>(v.size())}); }
Vec vec(const mb::Tensor& t) { return mb::to_host_f64(t); }
std::vector<float> vecf(const mb::Tensor& t) { return mb::to_host_f32(t); }

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
    mb::Tensor out({n, O}, mb::DType::kF64);
    ops::linear_forward(out, t64(xx, {n, I}), t64(ww, {O, I}), t64(bb));
    return dot(vec(out), r);
  };
  // backward accumulates onto what is there
  mb::Tensor dx = t64(Vec(n * I, 0.5), {n, I}), dw = t64(Vec(O * I, 0.25), {O, I}), db = t64(Vec(O, -1.0));
  ops::linear_backward(dx, dw, db, t64(r, {n, O}), t64(x, {n, I}), t64(w, {O, I}));
  Vec gx = vec(dx), gw = vec(dw), gb = vec(db);
  for (auto& v : gx) v -= 0.5;
  for (auto& v : gw) v -= 0.25;
  for (auto& v : gb) v += 1.0;
  expect_fd([&](const Vec& v) { return loss(v, w, b); }, x, gx, "dx");
  expect_fd([&](const Vec& v) { return loss(x, v, b); }, w, gw, "dw");
  expect_fd([&](const Vec& v) { return loss(x, w, v); }, b, gb, "db");
  // f32 against f64 on the f32-rounded inputs
  const std::vector<float> xf = to_f(x), wf = to_f(w), bf = to_f(b);
  mb::Tensor of({n, O}), od({n, O}, mb::DType::kF64);
  ops::linear_forward(of, t32(xf, {n, I}), t32(wf, {O, I}), t32(bf));
  ops::linear_forward(od, t64(Vec(xf.begin(), xf.end()), {n, I}), t64(Vec(wf.begin(), wf.end()), {O, I}),
                      t64(Vec(bf.begin(), bf.end())));
  expect_fp32_close(vecf(of), vec(od), I + 1, "linear fp32");
  // gemm with C accumulated (beta 1) and a transposed A: C += A^T B
  mb::Tensor C = t64(Vec(I * O, 1.0), {I, O});
  ops::gemm(C, t64(x, {n, I}), ops::Trans::T, t64(r, {n, O}), ops::Trans::N, 1.0f, 1.0f);
  const Vec cv = vec(C);
  for (int i = 0; i < I; ++i)
    for (int o = 0; o < O; ++o) {
      double e = 1.0;
      for (int k = 0; k < n; ++k) e += x[k * I + i] * r[k * O + o];
      EXPECT_NEAR(cv[i * O + o], e, 1e-12);
    }
}

INSTANTIATE_TEST_SUITE_P(Ops, LinearShapes,
                         ::testing::Values(std::make_tuple(1, 1, 1), std::make_tuple(1, 13, 5),
                                           std::make_tuple(7, 1, 17), std::make_tuple(3, 17, 11),
                                           std::make_tuple(5, 8, 16)));

TEST(Linear, BiasAddAndItsBackwardAreTheColumnSums) {
  const int n = 7, O = 5;
  const Vec x = randn(n * O, 60), b = randn(O, 61);
  mb::Tensor y = t64(x, {n, O});
  ops::bias_add(y, t64(b));
  mb::Tensor db = t64(Vec(O, 2.0));
  ops::bias_backward(db, t64(x, {n, O}));
  const Vec yv = vec(y), dbv = vec(db);
  for (int j = 0; j < O; ++j) {
    double col = 2.0;
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(yv[i * O + j], x[i * O + j] + b[j]);
      col += x[i * O + j];
    }
    EXPECT_NEAR(dbv[j], col, 1e-12);
  }
}

class LayerNormShapes : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(LayerNormShapes, BackwardMatchesFiniteDifferences) {
  const auto [n, C] = GetParam();
  const Vec x = randn(n * C, 5, 2.0), w = randn(C, 6), b = randn(C, 7), r = randn(n * C, 8);
  auto loss = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
    mb::Tensor out({n, C}, mb::DType::kF64), mean({n}, mb::DType::kF64), rstd({n}, mb::DType::kF64);
    ops::layernorm_forward(out, mean, rstd, t64(xx, {n, C}), t64(ww), t64(bb), 1e-5);
    return dot(vec(out), r);
  };
  mb::Tensor out({n, C}, mb::DType::kF64), mean({n}, mb::DType::kF64), rstd({n}, mb::DType::kF64);
  mb::Tensor dx({n, C}, mb::DType::kF64), dw({C}, mb::DType::kF64), db({C}, mb::DType::kF64);
  ops::layernorm_forward(out, mean, rstd, t64(x, {n, C}), t64(w), t64(b), 1e-5);
  ops::layernorm_backward(dx, dw, db, t64(r, {n, C}), t64(x, {n, C}), t64(w), mean, rstd);
  expect_fd([&](const Vec& v) { return loss(v, w, b); }, x, vec(dx), "dx");
  expect_fd([&](const Vec& v) { return loss(x, v, b); }, w, vec(dw), "dweight");
  expect_fd([&](const Vec& v) { return loss(x, w, v); }, b, vec(db), "dbias");
  // normalized rows: mean 0 and variance 1 before the affine part
  mb::Tensor y({n, C}, mb::DType::kF64);
  ops::layernorm_forward(y, mean, rstd, t64(x, {n, C}), t64(Vec(C, 1.0)), t64(Vec(C, 0.0)), 0.0);
  const Vec yv = vec(y);
  if (C > 1) {
    for (int i = 0; i < n; ++i) {
      double m = 0, v = 0;
      for (int c = 0; c < C; ++c) m += yv[i * C + c] / C;
      for (int c = 0; c < C; ++c) v += (yv[i * C + c] - m) * (yv[i * C + c] - m) / C;
      EXPECT_NEAR(m, 0.0, 1e-12);
      EXPECT_NEAR(v, 1.0, 1e-9);
    }
  }
}

TEST_P(LayerNormShapes, RmsNormBackwardMatchesFiniteDifferences) {
  const auto [n, C] = GetParam();
  const Vec x = randn(n * C, 50, 2.0), w = randn(C, 51), r = randn(n * C, 52);
  auto loss = [&](const Vec& xx, const Vec& ww) {
    mb::Tensor out({n, C}, mb::DType::kF64), rstd({n}, mb::DType::kF64);
    ops::rmsnorm_forward(out, rstd, t64(xx, {n, C}), t64(ww), 1e-6);
    return dot(vec(out), r);
  };
  mb::Tensor out({n, C}, mb::DType::kF64), rstd({n}, mb::DType::kF64), dx({n, C}, mb::DType::kF64),
      dw({C}, mb::DType::kF64);
  ops::rmsnorm_forward(out, rstd, t64(x, {n, C}), t64(w), 1e-6);
  ops::rmsnorm_backward(dx, dw, t64(r, {n, C}), t64(x, {n, C}), t64(w), rstd);
  expect_fd([&](const Vec& v) { return loss(v, w); }, x, vec(dx), "dx");
  expect_fd([&](const Vec& v) { return loss(x, v); }, w, vec(dw), "dweight");
  // out = x / rms(x) * w
  const Vec yv = vec(out);
  for (int i = 0; i < n; ++i) {
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += x[i * C + c] * x[i * C + c] / C;
    for (int c = 0; c < C; ++c) EXPECT_NEAR(yv[i * C + c], x[i * C + c] / std::sqrt(ms + 1e-6) * w[c], 1e-12);
  }
}

// The residual add fused with the norm, against sum = a + b and the norms' formulas written
// out here (f64).
TEST_P(LayerNormShapes, ResidualNormsAreTheNormOfTheSumByFormula) {
  const auto [n, C] = GetParam();
  const Vec a = randn(n * C, 31, 2.0), b = randn(n * C, 32), w = randn(C, 33), bias = randn(C, 34);
  const std::vector<int64_t> shape{n, C};
  mb::Tensor sum(shape, mb::DType::kF64), out(shape, mb::DType::kF64), mean({n}, mb::DType::kF64),
      rstd({n}, mb::DType::kF64), rsum(shape, mb::DType::kF64), rout(shape, mb::DType::kF64), rr({n}, mb::DType::kF64);
  ops::layernorm_residual_forward(sum, out, mean, rstd, t64(a, shape), t64(b, shape), t64(w), t64(bias), 1e-5);
  ops::rmsnorm_residual_forward(rsum, rout, rr, t64(a, shape), t64(b, shape), t64(w), 1e-6);
  const Vec s = vec(sum), o = vec(out), m = vec(mean), r = vec(rstd), rs = vec(rsum), ro = vec(rout), rrv = vec(rr);
  for (int i = 0; i < n; ++i) {
    double mu = 0, var = 0, ms = 0;
    for (int c = 0; c < C; ++c) mu += a[i * C + c] + b[i * C + c];
    mu /= C;
    for (int c = 0; c < C; ++c) {
      const double x = a[i * C + c] + b[i * C + c];
      var += (x - mu) * (x - mu);
      ms += x * x;
    }
    const double inv = 1 / std::sqrt(var / C + 1e-5), rinv = 1 / std::sqrt(ms / C + 1e-6);
    EXPECT_NEAR(m[i], mu, 1e-12) << "row " << i;
    EXPECT_NEAR(r[i], inv, 1e-9 * inv) << "row " << i;
    EXPECT_NEAR(rrv[i], rinv, 1e-9 * rinv) << "row " << i;
    for (int c = 0; c < C; ++c) {
      const size_t k = static_cast<size_t>(i * C + c);
      const double x = a[k] + b[k];
      EXPECT_EQ(s[k], x) << "sum " << k;
      EXPECT_EQ(rs[k], x) << "rms sum " << k;
      EXPECT_NEAR(o[k], (x - mu) * inv * w[c] + bias[c], 1e-9) << "layernorm " << k;
      EXPECT_NEAR(ro[k], x * rinv * w[c], 1e-9) << "rmsnorm " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, LayerNormShapes,
                         ::testing::Values(std::make_tuple(1, 1), std::make_tuple(1, 3), std::make_tuple(5, 17),
                                           std::make_tuple(40, 7)));  // 40 rows: two row blocks

TEST(Gelu, MatchesTheTanhFormulaAndFiniteDifferences) {
  const Vec x = randn(37, 9, 3.0), r = randn(37, 10);
  mb::Tensor y({37}, mb::DType::kF64), dx({37}, mb::DType::kF64);
  ops::gelu_forward(y, t64(x));
  const Vec yv = vec(y);
  for (int i = 0; i < 37; ++i) {
    const double v = x[i];
    EXPECT_NEAR(yv[i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-15);
  }
  ops::gelu_backward(dx, t64(r), t64(x));
  expect_fd(
      [&](const Vec& v) {
        mb::Tensor o({37}, mb::DType::kF64);
        ops::gelu_forward(o, t64(v));
        return dot(vec(o), r);
      },
      x, vec(dx), "gelu");
  const auto xf = to_f(x);
  mb::Tensor yf({37}), yd({37}, mb::DType::kF64);
  ops::gelu_forward(yf, t32(xf));
  ops::gelu_forward(yd, t64(Vec(xf.begin(), xf.end())));
  expect_fp32_close(vecf(yf), vec(yd), 8, "gelu fp32");
}

// RoPE over 2 sequences of 5 positions, heads of dim 8, the first 6 channels turned (Megatron's
// --rotary-percent 0.75), base 100: each query and key as Megatron's rotate-half form gives them
// (angles in f64 here, fp32 in the op: 1e-6), values and the unturned channels as they were; the
// backward against central finite differences of r . rope(x) (f64). Per head (2 heads of
// [q, k, v]) and grouped (4 heads in 2 groups of [2 queries, a key, a value]: the 4 queries and 2
// keys turned). A head count the groups do not divide is refused.
TEST(Rope, TurnsQueriesAndKeysAsMegatronsRotateHalfAndItsBackwardIsTheAdjoint) {
  const int rows = 10;
  // rope(x) against the formula for the shape's pairs and positions, and its backward as the adjoint
  auto expect_rope = [&](const ops::RotaryShape& s, const std::string& what) {
    const int G = static_cast<int>(s.groups ? s.groups : s.heads), per = static_cast<int>(s.heads) / G;
    const int width = G * (per + 2) * 8, n = rows * width;
    const Vec x = randn(n, 13), r = randn(n, 14);
    mb::Tensor y = t64(x, {rows, width});
    ops::rope_forward(y, s);
    const Vec yv = vec(y);
    const int half = 3;  // of the 6 channels turned
    for (int row = 0; row < rows; ++row)
      for (int g = 0; g < G; ++g)
        for (int which = 0; which < per + 2; ++which)  // the group's queries, its key, its value
          for (int c = 0; c < 8; ++c) {
            const int at = row * width + (g * (per + 2) + which) * 8 + c;
            double want = x[at];
            if (which <= per && c < 6) {
              // pair i of (c, its partner): (i, i + 3) in halves, (2i, 2i + 1) interleaved; first = x1
              const bool first = s.interleaved ? c % 2 == 0 : c < half;
              const int i = s.interleaved ? c / 2 : c % half;
              const int pair = s.interleaved ? (first ? at + 1 : at - 1) : (first ? at + half : at - half);
              const double angle = (row % 5) * s.position_scale * std::pow(100.0, -2.0 * i / 6);
              want = first ? x[at] * std::cos(angle) - x[pair] * std::sin(angle)
                           : x[at] * std::cos(angle) + x[pair] * std::sin(angle);
            }
            EXPECT_NEAR(yv[at], want, 1e-6)
                << what << ": row " << row << " group " << g << " part " << which << " channel " << c;
          }
    mb::Tensor dx = t64(r, {rows, width});
    ops::rope_backward(dx, s);
    expect_fd(
        [&](const Vec& v) {
          mb::Tensor o = t64(v, {rows, width});
          ops::rope_forward(o, s);
          return dot(vec(o), r);
        },
        x, vec(dx), what.c_str());
  };
  expect_rope(ops::RotaryShape{5, 2, 8, 6, 100.0}, "rotate-half");
  // interleaved pairs (2i, 2i + 1) (--rotary-interleaved), positions scaled by 1/4
  // (--rotary-seq-len-interpolation-factor 4)
  expect_rope(ops::RotaryShape{5, 2, 8, 6, 100.0, true, 0.25}, "interleaved, interpolated");
  expect_rope(ops::RotaryShape{5, 4, 8, 6, 100.0, false, 1.0, 2}, "grouped");
  mb::Tensor y = t64(randn(rows * 2 * 3 * 8, 13), {rows, 2 * 3 * 8});
  try {
    ops::rope_forward(y, ops::RotaryShape{5, 2, 8, 7, 100.0});
    ADD_FAILURE() << "an odd rotary dim taken";
  } catch (const mb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the rotary dim must be even"), std::string::npos) << e.what();
  }
  mb::Tensor z = t64(randn(rows * (3 + 2 * 2) * 8, 13), {rows, (3 + 2 * 2) * 8});
  try {
    ops::rope_forward(z, ops::RotaryShape{5, 3, 8, 6, 100.0, false, 1.0, 2});
    ADD_FAILURE() << "2 groups of 3 heads taken";
  } catch (const mb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 key/value groups do not divide 3 heads"), std::string::npos) << e.what();
  }
}

// Squared ReLU over 41 values (a few exact zeros among them, where the one-sided derivative is
// 0): the formula max(x, 0)^2 exactly in f64, and the backward (set, over garbage) against
// central finite differences away from 0, where the function is smooth.
TEST(SquaredRelu, MatchesTheFormulaAndFiniteDifferences) {
  Vec x = randn(41, 17, 2.0);
  x[3] = x[20] = 0.0;
  const Vec r = randn(41, 18);
  mb::Tensor y({41}, mb::DType::kF64);
  ops::squared_relu_forward(y, t64(x));
  const Vec yv = vec(y);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(yv[i], x[i] > 0 ? x[i] * x[i] : 0.0) << i;
  mb::Tensor dx = t64(Vec(41, 7.0));
  ops::squared_relu_backward(dx, t64(r), t64(x));
  EXPECT_EQ(vec(dx)[3], 0.0);
  Vec smooth = x, analytic = vec(dx);
  smooth.erase(smooth.begin() + 20);  // the finite difference at 0 is not the derivative
  smooth.erase(smooth.begin() + 3);
  analytic.erase(analytic.begin() + 20);
  analytic.erase(analytic.begin() + 3);
  Vec rs = r;
  rs.erase(rs.begin() + 20);
  rs.erase(rs.begin() + 3);
  expect_fd(
      [&](const Vec& v) {
        mb::Tensor o({static_cast<int64_t>(v.size())}, mb::DType::kF64);
        ops::squared_relu_forward(o, t64(v));
        return dot(vec(o), rs);
      },
      smooth, analytic, "squared relu");
}

// SwiGLU of 3 rows of 7 (gate, up) pairs, interleaved: the formula (silu(g) = g / (1 + e^-g))
// in f64 to rounding, the backward (set, over a din holding garbage) against central finite
// differences, and f32 within a few roundings of f64. A row of an odd width is refused.
TEST(Swiglu, MatchesTheGatedFormulaAndFiniteDifferences) {
  const int rows = 3, F = 7, n = rows * F;
  const Vec x = randn(2 * n, 11, 3.0), r = randn(n, 12);
  mb::Tensor y({rows, F}, mb::DType::kF64);
  mb::Tensor dx = t64(Vec(2 * n, 7.0), {rows, 2 * F});  // garbage: the backward sets din
  ops::swiglu_forward(y, t64(x, {rows, 2 * F}));
  const Vec yv = vec(y);
  for (int j = 0; j < n; ++j) {
    const double g = x[2 * j], u = x[2 * j + 1];
    EXPECT_NEAR(yv[j], g / (1 + std::exp(-g)) * u, 1e-14 * std::max(1.0, std::abs(yv[j])));
  }
  ops::swiglu_backward(dx, t64(r, {rows, F}), t64(x, {rows, 2 * F}));
  expect_fd(
      [&](const Vec& v) {
        mb::Tensor o({rows, F}, mb::DType::kF64);
        ops::swiglu_forward(o, t64(v, {rows, 2 * F}));
        return dot(vec(o), r);
      },
      x, vec(dx), "swiglu");
  const auto xf = to_f(x);
  mb::Tensor yf({rows, F}), yd({rows, F}, mb::DType::kF64);
  ops::swiglu_forward(yf, t32(xf, {rows, 2 * F}));
  ops::swiglu_forward(yd, t64(Vec(xf.begin(), xf.end()), {rows, 2 * F}));
  expect_fp32_close(vecf(yf), vec(yd), 8, "swiglu fp32");
  mb::Tensor odd({2, 7}), half({2, 3});
  try {
    ops::swiglu_forward(half, odd);
    ADD_FAILURE() << "rows of 7 taken as pairs";
  } catch (const mb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("in rows of (gate, up) pairs"), std::string::npos) << e.what();
  }
}

// The MLP's fused halves are their parts: pre = x w^T + b, y = gelu(pre); and the second
// layer's backward through the GELU (dpre, set) against finite differences of
// L = r . (gelu(p) w2^T + b2).
TEST(LinearGelu, FusedForwardIsItsPartsAndItsBackwardMatchesFiniteDifferences) {
  const int n = 5, I = 7, O = 6, O2 = 4;
  const Vec x = randn(n * I, 21), w = randn(O * I, 22), b = randn(O, 23);
  mb::Tensor y({n, O}, mb::DType::kF64), pre({n, O}, mb::DType::kF64), lin({n, O}, mb::DType::kF64),
      g({n, O}, mb::DType::kF64);
  ops::linear_gelu_forward(y, pre, t64(x, {n, I}), t64(w, {O, I}), t64(b));
  ops::linear_forward(lin, t64(x, {n, I}), t64(w, {O, I}), t64(b));
  ops::gelu_forward(g, lin);
  EXPECT_EQ(vec(pre), vec(lin));
  EXPECT_EQ(vec(y), vec(g));
  const Vec p = randn(n * O, 24, 2.0), w2 = randn(O2 * O, 25), b2 = randn(O2, 26), r = randn(n * O2, 27);
  auto loss = [&](const Vec& pp) {
    mb::Tensor a({n, O}, mb::DType::kF64), out({n, O2}, mb::DType::kF64);
    ops::gelu_forward(a, t64(pp, {n, O}));
    ops::linear_forward(out, a, t64(w2, {O2, O}), t64(b2));
    return dot(vec(out), r);
  };
  mb::Tensor a({n, O}, mb::DType::kF64);
  ops::gelu_forward(a, t64(p, {n, O}));
  mb::Tensor dpre = t64(Vec(n * O, 7.0), {n, O});  // set, so the 7s must go
  mb::Tensor dw2 = t64(Vec(O2 * O, 0.0), {O2, O}), db2 = t64(Vec(O2, 0.0));
  ops::linear_backward_gelu(dpre, dw2, db2, t64(r, {n, O2}), a, t64(w2, {O2, O}), t64(p, {n, O}));
  expect_fd(loss, p, vec(dpre), "dpre");
  mb::Tensor dw_ref = t64(Vec(O2 * O, 0.0), {O2, O}), db_ref = t64(Vec(O2, 0.0));
  ops::linear_backward(mb::Tensor(), dw_ref, db_ref, t64(r, {n, O2}), a, t64(w2, {O2, O}));
  EXPECT_EQ(vec(dw2), vec(dw_ref));
  EXPECT_EQ(vec(db2), vec(db_ref));
}

TEST(Tanh, BackwardFromTheOutputMatchesFiniteDifferences) {
  const Vec x = randn(23, 62, 2.0), r = randn(23, 63);
  mb::Tensor y({23}, mb::DType::kF64), dx({23}, mb::DType::kF64);
  ops::tanh_forward(y, t64(x));
  ops::tanh_backward(dx, t64(r), y);
  for (int i = 0; i < 23; ++i) EXPECT_NEAR(vec(y)[i], std::tanh(x[i]), 1e-15);
  expect_fd(
      [&](const Vec& v) {
        mb::Tensor o({23}, mb::DType::kF64);
        ops::tanh_forward(o, t64(v));
        return dot(vec(o), r);
      },
      x, vec(dx), "tanh");
}

TEST(Residual, BackwardPassesTheGradientToBothInputs) {
  const Vec a = randn(13, 11), b = randn(13, 12), d = randn(13, 13);
  mb::Tensor out({13}, mb::DType::kF64), da = t64(Vec(13, 1.0)), db = t64(Vec(13, 2.0));
  ops::residual_forward(out, t64(a), t64(b));
  ops::residual_backward(da, db, t64(d));
  for (int i = 0; i < 13; ++i) {
    EXPECT_EQ(vec(out)[i], a[i] + b[i]);
    EXPECT_EQ(vec(da)[i], 1.0 + d[i]);
    EXPECT_EQ(vec(db)[i], 2.0 + d[i]);
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
  mb::Tensor y({29}, mb::DType::kF64), dx({29}, mb::DType::kF64);
  ops::dropout_forward(y, t64(x), 5, k);
  std::vector<uint8_t> keep(29);
  ops::dropout_mask(keep.data(), 29, 5, k);
  for (int i = 0; i < 29; ++i) EXPECT_DOUBLE_EQ(vec(y)[i], keep[i] ? x[i] / 0.75 : 0.0);
  ops::dropout_backward(dx, t64(r), 5, k);
  expect_fd(
      [&](const Vec& v) {
        mb::Tensor o({29}, mb::DType::kF64);
        ops::dropout_forward(o, t64(v), 5, k);
        return dot(vec(o), r);
      },
      x, vec(dx), "dropout");
}

struct AttnCase {
  int B, T, H, D;
  bool causal;
  int mask;  // 0 none, 1 pad the tail of batch 0, 2 every key of batch 0 masked, 3 pad the first key
  double p;  // attention dropout
};

class AttentionCases : public ::testing::TestWithParam<AttnCase> {};

std::vector<uint8_t> attn_mask(const AttnCase& c) {
  std::vector<uint8_t> mask;
  if (c.mask) {
    mask.assign(c.B * c.T, 1);
    for (int t = 0; t < c.T; ++t) {
      if (c.mask == 1 && t >= c.T / 2 + 1) mask[t] = 0;
      if (c.mask == 2) mask[t] = 0;
      if (c.mask == 3 && t == 0) mask[t] = 0;
    }
  }
  return mask;
}

TEST_P(AttentionCases, BackwardMatchesFiniteDifferences) {
  const AttnCase c = GetParam();
  ops::AttentionShape s{c.B, c.T, c.H, c.D, c.causal, 0, 0};
  const std::vector<uint8_t> mask = attn_mask(c);
  const mb::Tensor mt = mask.empty() ? mb::Tensor() : mb::from_host(mask, {c.B, c.T});
  const uint8_t* m = mask.empty() ? nullptr : mask.data();
  const ops::DropoutKey dk{c.p, 77, 3};
  const int64_t nq = c.B * c.T * c.H * 3 * c.D, no = c.B * c.T * c.H * c.D, np = c.B * c.H * c.T * c.T;
  const Vec qkv = randn(nq, 16), r = randn(no, 17);
  auto loss = [&](const Vec& x) {
    mb::Tensor out({no}, mb::DType::kF64), probs({np}, mb::DType::kF64);
    ops::attention_forward(out, probs, t64(x), mt, s, &dk);
    return dot(vec(out), r);
  };
  mb::Tensor out({no}, mb::DType::kF64), probs_t({np}, mb::DType::kF64), dqkv({nq}, mb::DType::kF64);
  ops::attention_forward(out, probs_t, t64(qkv), mt, s, &dk);
  ops::attention_backward(dqkv, t64(r), t64(qkv), probs_t, mt, s, &dk);
  expect_fd(loss, qkv, vec(dqkv), "dqkv");
  const Vec probs = vec(probs_t), outv = vec(out);
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
          for (int d = 0; d < c.D; ++d) EXPECT_EQ(outv[((b * c.T + i) * c.H + h) * c.D + d], 0.0);
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Ops, AttentionCases,
                         ::testing::Values(AttnCase{1, 1, 1, 1, true, 0, 0.0}, AttnCase{2, 5, 3, 4, true, 0, 0.0},
                                           AttnCase{2, 7, 2, 3, false, 1, 0.0}, AttnCase{2, 5, 1, 4, false, 2, 0.0},
                                           AttnCase{1, 6, 2, 2, true, 3, 0.0}, AttnCase{2, 5, 2, 3, true, 0, 0.3}));

TEST(Attention, AdditiveBiasGradientMatchesFiniteDifferences) {
  ops::AttentionShape s{2, 5, 2, 3, true, 0, 0};
  const int64_t nq = 2 * 5 * 2 * 3 * 3, no = 2 * 5 * 2 * 3, nb = 2 * 5 * 5, np = 2 * 2 * 5 * 5;
  const mb::Tensor mask = mb::from_host(std::vector<uint8_t>{1, 1, 1, 1, 0, 1, 1, 1, 1, 1}, {2, 5});
  const ops::DropoutKey dk{0.2, 79, 5};
  const Vec qkv = randn(nq, 44), bias = randn(nb, 45), r = randn(no, 46);
  mb::Tensor out({no}, mb::DType::kF64), probs({np}, mb::DType::kF64), dqkv({nq}, mb::DType::kF64),
      dbias({nb}, mb::DType::kF64);
  ops::attention_forward(out, probs, t64(qkv), mask, s, &dk, t64(bias));
  ops::attention_backward(dqkv, t64(r), t64(qkv), probs, mask, s, &dk, dbias);
  auto loss = [&](const Vec& x, const Vec& b) {
    mb::Tensor o({no}, mb::DType::kF64), pr({np}, mb::DType::kF64);
    ops::attention_forward(o, pr, t64(x), mask, s, &dk, t64(b));
    return dot(vec(o), r);
  };
  expect_fd([&](const Vec& x) { return loss(x, bias); }, qkv, vec(dqkv), "dqkv with bias");
  expect_fd([&](const Vec& b) { return loss(qkv, b); }, bias, vec(dbias), "dbias");
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

TEST(RelativeBias, GathersPerBucketAndHeadAndBackwardMatchesFiniteDifferences) {
  const int T = 6, H = 3, NB = 8;
  std::vector<int32_t> b(T * T);
  for (int i = 0; i < T; ++i)
    for (int j = 0; j < T; ++j) b[i * T + j] = ops::relative_position_bucket(i, j, true, NB, 16);
  const mb::Tensor buckets = mb::from_host(b, {T, T});
  const Vec table = randn(NB * H, 64), r = randn(H * T * T, 65);
  mb::Tensor out({H, T, T}, mb::DType::kF64), dtable({NB, H}, mb::DType::kF64);
  ops::relative_bias_forward(out, t64(table, {NB, H}), buckets);
  for (int h = 0; h < H; ++h)
    for (int e = 0; e < T * T; ++e) EXPECT_EQ(vec(out)[h * T * T + e], table[b[e] * H + h]);
  ops::relative_bias_backward(dtable, t64(r, {H, T, T}), buckets);
  expect_fd(
      [&](const Vec& t) {
        mb::Tensor o({H, T, T}, mb::DType::kF64);
        ops::relative_bias_forward(o, t64(t, {NB, H}), buckets);
        return dot(vec(o), r);
      },
      table, vec(dtable), "dtable");
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
  const mb::Tensor mt = mask.empty() ? mb::Tensor() : mb::from_host(mask, {c.B, c.Tk});
  const uint8_t* m = mask.empty() ? nullptr : mask.data();
  const ops::DropoutKey dk{c.p, 78, 4};
  const int64_t nq = c.B * c.Tq * c.H * c.D, nkv = c.B * c.Tk * c.H * 2 * c.D, np = c.B * c.H * c.Tq * c.Tk;
  const Vec q = randn(nq, 41), kv = randn(nkv, 42), r = randn(nq, 43);
  mb::Tensor out({nq}, mb::DType::kF64), probs_t({np}, mb::DType::kF64), dq({nq}, mb::DType::kF64),
      dkv({nkv}, mb::DType::kF64);
  ops::cross_attention_forward(out, probs_t, t64(q), t64(kv), mt, s, &dk);
  ops::cross_attention_backward(dq, dkv, t64(r), t64(q), t64(kv), probs_t, mt, s, &dk);
  auto loss = [&](const Vec& qq, const Vec& kk) {
    mb::Tensor o({nq}, mb::DType::kF64), pr({np}, mb::DType::kF64);
    ops::cross_attention_forward(o, pr, t64(qq), t64(kk), mt, s, &dk);
    return dot(vec(o), r);
  };
  expect_fd([&](const Vec& x) { return loss(x, kv); }, q, vec(dq), "dq");
  expect_fd([&](const Vec& x) { return loss(q, x); }, kv, vec(dkv), "dkv");
  // backward accumulates: a second call doubles both gradients
  const Vec dq1 = vec(dq), dkv1 = vec(dkv);
  ops::cross_attention_backward(dq, dkv, t64(r), t64(q), t64(kv), probs_t, mt, s, &dk);
  const Vec dq2 = vec(dq), dkv2 = vec(dkv);
  for (int64_t i = 0; i < nq; ++i) EXPECT_NEAR(dq2[i], 2 * dq1[i], 1e-12) << "dq " << i;
  for (int64_t i = 0; i < nkv; ++i) EXPECT_NEAR(dkv2[i], 2 * dkv1[i], 1e-12) << "dkv " << i;
  // every query attends to every unpadded encoder position: rows sum to 1, padded keys get 0
  const Vec probs = vec(probs_t);
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
  const int64_t nq = 2 * 13 * 3 * 3 * 5, no = 2 * 13 * 3 * 5, np = 2 * 3 * 13 * 13;
  const auto qf = to_f(randn(nq, 18));
  mb::Tensor of({no}), pf({np}), od({no}, mb::DType::kF64), pd({np}, mb::DType::kF64);
  ops::attention_forward(of, pf, t32(qf), {}, s, nullptr);
  ops::attention_forward(od, pd, t64(Vec(qf.begin(), qf.end())), {}, s, nullptr);
  expect_fp32_close(vecf(of), vec(od), 13 * 5, "attention fp32");
}

TEST(Attention, BiasGradientDoesNotDependOnTheThreadCount) {
  ops::AttentionShape s{4, 9, 2, 4, false, 0, 0};
  const int64_t nq = 4 * 9 * 2 * 3 * 4, no = 4 * 9 * 2 * 4, np = 4 * 2 * 9 * 9;
  const mb::Tensor qkv = t32(to_f(randn(nq, 70))), bias = t32(to_f(randn(2 * 81, 71))), r = t32(to_f(randn(no, 72)));
  std::vector<float> db[2];
  for (int k = 0; k < 2; ++k) {
    omp_set_num_threads(k == 0 ? 1 : 3);
    mb::Tensor out({no}), probs({np}), dqkv({nq}), dbias({2 * 81});
    ops::attention_forward(out, probs, qkv, {}, s, nullptr, bias);
    ops::attention_backward(dqkv, r, qkv, probs, {}, s, nullptr, dbias);
    db[k] = vecf(dbias);
  }
  omp_set_num_threads(2);
  EXPECT_EQ(db[0], db[1]) << "dbias must be bitwise the same on 1 and 3 threads";
}

TEST(Embedding, LooksUpItsShardAndScatterAddsRepeatedIds) {
  const int C = 3, rows = 4, begin = 5;  // this shard holds rows 5..8 of the full table
  const Vec table = randn(rows * C, 19);
  const std::vector<int32_t> id = {5, 9, 8, 5, 0, 6};
  mb::Tensor out({6, C}, mb::DType::kF64);
  ops::embedding_forward(out, ids(id), t64(table, {rows, C}), begin);
  for (int i = 0; i < 6; ++i)
    for (int c = 0; c < C; ++c) {
      const int r = id[i] - begin;
      EXPECT_EQ(vec(out)[i * C + c], (r >= 0 && r < rows) ? table[r * C + c] : 0.0) << i;
    }
  // accumulate: out += the rows again
  const Vec before = vec(out);
  ops::embedding_forward(out, ids(id), t64(table, {rows, C}), begin, true);
  for (int i = 0; i < 6 * C; ++i) EXPECT_EQ(vec(out)[i], 2 * before[i]);
  const Vec d = randn(6 * C, 20);
  mb::Tensor dt({rows, C}, mb::DType::kF64);
  ops::embedding_backward(dt, t64(d, {6, C}), ids(id), begin);
  expect_fd(
      [&](const Vec& t) {
        mb::Tensor o({6, C}, mb::DType::kF64);
        ops::embedding_forward(o, ids(id), t64(t, {rows, C}), begin);
        return dot(vec(o), d);
      },
      table, vec(dt), "dtable");
}

// A diverged run's logits span thousands: every probability but the largest underflows.
// Those must be exact zeros, not subnormals (or values that turn subnormal when scaled by
// 1/tokens): subnormal GEMM operands cost x86 cores a microcode assist each, which made a
// diverging point 60x slower on an Intel Xeon.
TEST(Ops, SaturatedSoftmaxGradientHasNoSubnormals) {
  EXPECT_EQ(ops::cpu::vexp(-87.5f), 0.0f);
  EXPECT_EQ(ops::cpu::vexp(-1e4f), 0.0f);
  EXPECT_GE(ops::cpu::vexp(-87.25f), FLT_MIN) << "the smallest exp above the cut is a normal float";
  const int n = 4, V = 1000;
  std::vector<float> l(static_cast<size_t>(n * V));
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>((i * 7919) % 2003) * 25.0f - 25000.0f;
  const mb::Tensor logits = mb::from_host(l, {n, V});
  const mb::Tensor targets = ids({1, 2, 3, 4});
  mb::Tensor m({n}, mb::DType::kF32), s({n}, mb::DType::kF32);
  ops::ce_row_max(m, logits);
  ops::ce_sum_exp(s, logits, m);
  mb::Tensor d({n, V}, mb::DType::kF32);
  ops::ce_backward(d, logits, m, s, targets, 0, -1, 1.0f / 512, mb::from_host(std::vector<float>{1.0f}, {1}));
  int subnormal = 0, nonzero = 0;
  for (const float x : mb::to_host_f32(d)) {
    subnormal += std::fpclassify(x) == FP_SUBNORMAL;
    nonzero += x != 0.0f;
  }
  EXPECT_EQ(subnormal, 0);
  EXPECT_GE(nonzero, n) << "the target and the maximum of each row keep their gradient";
  // the same through the kept exponentials, as the LM head computes it
  const mb::Tensor e = mb::from_host(l, {n, V});
  ops::ce_exps(s, e, m);
  ops::ce_backward_exps(e, e, s, targets, 0, -1, 1.0f / 512, mb::from_host(std::vector<float>{1.0f}, {1}));
  EXPECT_EQ(mb::to_host_f32(e), mb::to_host_f32(d));
}

class CrossEntropyShapes : public ::testing::TestWithParam<int> {};

TEST_P(CrossEntropyShapes, LossIsLogSoftmaxAndBackwardMatchesFiniteDifferences) {
  const int V = GetParam(), n = 5;
  const Vec logits = randn(n * V, 21, 3.0);
  const std::vector<int32_t> t = {0, V - 1, -1, V / 2, 0};  // one ignored row
  const mb::Tensor targets = ids(t);
  auto forward = [&](const Vec& l) {
    const mb::Tensor lt = t64(l, {n, V});
    mb::Tensor m({n}, mb::DType::kF64), s({n}, mb::DType::kF64), tl({n}, mb::DType::kF64), ls({n}, mb::DType::kF64);
    ops::ce_row_max(m, lt);
    ops::ce_sum_exp(s, lt, m);
    ops::ce_target_logit(tl, lt, targets, 0);
    ops::ce_loss(ls, m, s, tl, targets, -1);
    return std::make_tuple(vec(ls), m, s);
  };
  const auto [losses, m, s] = forward(logits);
  for (int i = 0; i < n; ++i) {
    if (t[i] == -1) {
      EXPECT_EQ(losses[i], 0.0);
      continue;
    }
    double z = 0;
    for (int j = 0; j < V; ++j) z += std::exp(logits[i * V + j]);
    EXPECT_NEAR(losses[i], std::log(z) - logits[i * V + t[i]], 1e-12);
  }
  // gradient of 0.7 x (sum of the losses), times a loss scale of 4
  mb::Tensor d({n, V}, mb::DType::kF64);
  ops::ce_backward(d, t64(logits, {n, V}), m, s, targets, 0, -1, 0.7f, mb::from_host(std::vector<float>{4.0f}, {1}));
  const Vec dv = vec(d);
  for (int j = 0; j < V; ++j) EXPECT_EQ(dv[2 * V + j], 0.0) << "ignored row has no gradient";
  expect_fd(
      [&](const Vec& l) {
        double total = 0;
        const auto pieces = forward(l);
        for (double x : std::get<0>(pieces)) total += x;
        return 0.7 * 4.0 * total;
      },
      logits, dv, "dlogits");
  // Megatron's way, as the LM head runs it: the logits become exp(l - max) in place, then
  // the same gradient is written over them (ignored rows included: 0)
  const mb::Tensor E = t64(logits, {n, V});
  mb::Tensor s2({n}, mb::DType::kF64);
  ops::ce_exps(s2, E, m);
  const Vec ev = vec(E), mv = vec(m);
  for (int i = 0; i < n; ++i) {
    EXPECT_NEAR(vec(s2)[i], vec(s)[i], 1e-12 * vec(s)[i]);
    for (int j = 0; j < V; ++j) EXPECT_NEAR(ev[i * V + j], std::exp(logits[i * V + j] - mv[i]), 1e-15);
  }
  ops::ce_backward_exps(E, E, s2, targets, 0, -1, 0.7f, mb::from_host(std::vector<float>{4.0f}, {1}));
  const Vec de = vec(E);
  for (size_t k = 0; k < dv.size(); ++k) EXPECT_NEAR(de[k], dv[k], 1e-14) << k;
  // rows that hold the whole vocabulary, in one pass per row: the same losses and gradient,
  // a gradient that finite differences of its own losses confirm, and without the gradient
  // the logits only read
  auto whole = [&targets, n, V](const Vec& l, bool grad) {
    const mb::Tensor lt = t64(l, {n, V});
    mb::Tensor ls({n}, mb::DType::kF64);
    ops::ce_whole_rows(ls, lt, targets, -1, grad, 0.7f, mb::from_host(std::vector<float>{4.0f}, {1}));
    return std::make_pair(vec(ls), vec(lt));
  };
  const auto with_grad = whole(logits, true), read_only = whole(logits, false);
  for (int i = 0; i < n; ++i) {
    EXPECT_NEAR(with_grad.first[i], losses[i], 1e-12) << i;
    EXPECT_EQ(read_only.first[i], with_grad.first[i]) << i;
  }
  EXPECT_EQ(read_only.second, logits);
  for (size_t k = 0; k < dv.size(); ++k) EXPECT_NEAR(with_grad.second[k], dv[k], 1e-14) << k;
  expect_fd(
      [&](const Vec& l) {
        double total = 0;
        for (double x : whole(l, false).first) total += x;
        return 0.7 * 4.0 * total;
      },
      logits, with_grad.second, "whole-row dlogits");
  // the same loss from two vocabulary shards combined as VocabParallelCrossEntropy does
  if (V >= 2) {
    const int V0 = V / 2, V1 = V - V0;
    Vec l0(n * V0), l1(n * V1);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < V; ++j) (j < V0 ? l0[i * V0 + j] : l1[i * V1 + j - V0]) = logits[i * V + j];
    const mb::Tensor L0 = t64(l0, {n, V0}), L1 = t64(l1, {n, V1});
    mb::Tensor m0({n}, mb::DType::kF64), m1({n}, mb::DType::kF64), s0({n}, mb::DType::kF64), s1({n}, mb::DType::kF64),
        t0({n}, mb::DType::kF64), t1({n}, mb::DType::kF64), ls({n}, mb::DType::kF64);
    ops::ce_row_max(m0, L0);
    ops::ce_row_max(m1, L1);
    Vec mm(n);
    for (int i = 0; i < n; ++i) mm[i] = std::max(vec(m0)[i], vec(m1)[i]);
    const mb::Tensor M = t64(mm);
    ops::ce_sum_exp(s0, L0, M);
    ops::ce_sum_exp(s1, L1, M);
    ops::ce_target_logit(t0, L0, targets, 0);
    ops::ce_target_logit(t1, L1, targets, V0);
    Vec ss(n), tt(n);
    for (int i = 0; i < n; ++i) ss[i] = vec(s0)[i] + vec(s1)[i], tt[i] = vec(t0)[i] + vec(t1)[i];
    ops::ce_loss(ls, M, t64(ss), t64(tt), targets, -1);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(vec(ls)[i], losses[i], 1e-12);
    // and each shard's gradient from its own exps and the global sums
    ops::ce_exps(s0, L0, M);
    ops::ce_exps(s1, L1, M);
    ops::ce_backward_exps(L0, L0, t64(ss), targets, 0, -1, 0.7f, mb::from_host(std::vector<float>{4.0f}, {1}));
    ops::ce_backward_exps(L1, L1, t64(ss), targets, V0, -1, 0.7f, mb::from_host(std::vector<float>{4.0f}, {1}));
    const Vec d0 = vec(L0), d1 = vec(L1);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < V; ++j)
        EXPECT_NEAR(j < V0 ? d0[i * V0 + j] : d1[i * V1 + j - V0], dv[i * V + j], 1e-14) << i << " " << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, CrossEntropyShapes, ::testing::Values(1, 7, 33));

// The LM head's f32 path without tensor parallelism: one pass per row against the pieces it
// replaces, on rows long enough for the vector loops and their remainders (V = 3001), with
// an ignored row (the ignore label a real column, 7, as a padding id would be), a loss scale
// and a saturated row; to a few f32 roundings.
TEST(Ops, CrossEntropyWholeRowsEqualsThePiecesInF32) {
  const int n = 6, V = 3001;
  std::vector<float> l(static_cast<size_t>(n * V));
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.0f, 4.0f);
  for (auto& x : l) x = d(g);
  for (int j = 0; j < V; ++j) l[static_cast<size_t>(5 * V + j)] = j == 17 ? 300.0f : -300.0f;  // saturated
  const mb::Tensor targets = ids({3, 7, 0, V - 1, 1500, 17});
  const mb::Tensor scale = mb::from_host(std::vector<float>{1024.0f}, {1});
  const mb::Tensor pieces = mb::from_host(l, {n, V}), fused = mb::from_host(l, {n, V});
  mb::Tensor m({n}, mb::DType::kF32), s({n}, mb::DType::kF32), t({n}, mb::DType::kF32), lp({n}, mb::DType::kF32),
      lf({n}, mb::DType::kF32);
  ops::ce_row_max(m, pieces);
  ops::ce_target_logit(t, pieces, targets, 0);
  ops::ce_exps(s, pieces, m);
  ops::ce_loss(lp, m, s, t, targets, 7);
  ops::ce_backward_exps(pieces, pieces, s, targets, 0, 7, 1.0f / 300, scale);
  ops::ce_whole_rows(lf, fused, targets, 7, true, 1.0f / 300, scale);
  const double eps = std::numeric_limits<float>::epsilon();
  const std::vector<float> a = mb::to_host_f32(lp), b = mb::to_host_f32(lf);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(b[i], a[i], 4 * eps * (1 + std::abs(a[i]))) << "loss of row " << i;
  EXPECT_EQ(b[1], 0.0f) << "an ignored row has no loss";
  const std::vector<float> da = mb::to_host_f32(pieces), db = mb::to_host_f32(fused);
  size_t worse = 0;
  for (size_t k = 0; k < da.size(); ++k) worse += std::abs(db[k] - da[k]) > 4 * eps * (std::abs(da[k]) + 1e-30);
  EXPECT_EQ(worse, 0u) << "of " << da.size() << " dlogits";
  for (int j = 0; j < V; ++j) EXPECT_EQ(db[static_cast<size_t>(V + j)], 0.0f) << "ignored row, column " << j;
}
