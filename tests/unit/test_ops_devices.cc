// Every op of the op API on one device (the CPU in test_ops_cpu, the GPU in test_ops_gpu,
// label gpu) in f32, bf16 and f16, against the CPU reference in f64 on the same inputs
// (ggml's test-backend-ops shape): one test body per op, tolerances from the dtype's unit
// roundoff and the length of the f32 accumulations (op_harness.h). On the CPU the half
// types are the emulation (stored rounded, computed in f32); on a GPU these are the CUDA
// kernels. test_ops_emulated runs the CUDA kernels on the CPU's warp emulator
// (tests/emulator/emulated_ops.h), all but cuBLASLt's. Gradients are checked by
// finite differences in test_ops.cc, on the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/ops/activation.h"
#include "core/ops/attention.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/flash_attention.h"
#include "core/ops/gather.h"
#include "core/ops/gradients.h"
#include "core/ops/layernorm.h"
#include "core/ops/matmul.h"
#include "core/ops/random.h"
#include "core/ops/reduce.h"
#include "core/ops/relative_position.h"
#include "core/ops/residual.h"
#include "core/util/philox.h"
#include "tests/unit/op_harness.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
#ifdef MB_TEST_DEVICE_EMULATED
namespace ops = megabatch::testing::emulated_ops;  // the device's calls on the warp emulator
#else
namespace ops = megabatch::ops;
#endif
using mb::DType;
using mb::testing::OpHarness;
using mb::testing::Pair;

namespace {

class OnDevice : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MB_SKIP_WITHOUT_DEVICE(mb::testing::test_device()); }
  OpHarness harness(uint32_t seed) const { return OpHarness(mb::testing::test_device(), GetParam(), seed); }
};

std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info) { return mb::dtype_name(info.param); }

std::vector<int32_t> random_ids(size_t n, int32_t lo, int32_t hi, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> d(lo, hi);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace

TEST_P(OnDevice, GemmInEveryTransposeAndIntoFp32Accumulators) {
  MB_SKIP_ON_EMULATOR("cuBLASLt");
  auto h = harness(1);
  const int64_t M = 37, N = 70, K = 129;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const ops::Trans TA = ta ? ops::Trans::T : ops::Trans::N, TB = tb ? ops::Trans::T : ops::Trans::N;
      const Pair A = h.input(ta ? std::vector<int64_t>{K, M} : std::vector<int64_t>{M, K});
      const Pair B = h.input(tb ? std::vector<int64_t>{N, K} : std::vector<int64_t>{K, N});
      Pair C = h.output({M, N});
      ops::gemm(C.dev, A.dev, TA, B.dev, TB, 0.5f);
      ops::gemm(C.ref, A.ref, TA, B.ref, TB, 0.5f);
      h.expect_close(C, K, "gemm " + std::to_string(ta) + std::to_string(tb));
      Pair acc = h.accumulator({M, N}, DType::kF32);  // fp32 main-gradient accumulation: C += op(A) op(B)
      ops::gemm(acc.dev, A.dev, TA, B.dev, TB, 1.0f, 1.0f);
      ops::gemm(acc.ref, A.ref, TA, B.ref, TB, 1.0f, 1.0f);
      h.expect_close(acc, K, "gemm into f32 " + std::to_string(ta) + std::to_string(tb));
    }
}

TEST_P(OnDevice, LinearForwardAndBackward) {
  MB_SKIP_ON_EMULATOR("cuBLASLt");
  auto h = harness(2);
  const int64_t n = 67, I = 96, O = 40;
  const Pair x = h.input({n, I}), w = h.input({O, I}, 0.1), b = h.input({O}), dy = h.input({n, O});
  Pair y = h.output({n, O});
  ops::linear_forward(y.dev, x.dev, w.dev, b.dev);
  ops::linear_forward(y.ref, x.ref, w.ref, b.ref);
  h.expect_close(y, I + 1, "linear_forward");
  Pair dx = h.accumulator({n, I}), dw = h.accumulator({O, I}, DType::kF32), db = h.accumulator({O}, DType::kF32);
  ops::linear_backward(dx.dev, dw.dev, db.dev, dy.dev, x.dev, w.dev);
  ops::linear_backward(dx.ref, dw.ref, db.ref, dy.ref, x.ref, w.ref);
  h.expect_close(dx, O, "linear dx");
  h.expect_close(dw, n, "linear dweight");
  h.expect_close(db, n, "linear dbias");
  Pair dx_set = h.output({n, I});  // written whole: the device side's NaN start must not show
  ops::linear_backward(dx_set.dev, {}, {}, dy.dev, x.dev, w.dev, ops::Write::kSet);
  ops::linear_backward(dx_set.ref, {}, {}, dy.ref, x.ref, w.ref, ops::Write::kSet);
  h.expect_close(dx_set, O, "linear dx set");
  Pair z = h.accumulator({n, O}), dz = h.accumulator({O}, DType::kF32);
  ops::bias_add(z.dev, b.dev);
  ops::bias_add(z.ref, b.ref);
  ops::bias_backward(dz.dev, dy.dev);  // 67 rows: two chunks of the GPU's column sums
  ops::bias_backward(dz.ref, dy.ref);
  h.expect_close(z, 1, "bias_add");
  h.expect_close(dz, n, "bias_backward");
}

// The MLP's fused halves (on a GPU, cuBLASLt's GELU epilogues) against the reference: O 64,
// rows of whole 16-byte vectors, takes the epilogues; O 36 in the half types does not, and
// runs the unfused kernels. In f32 the bound is tight enough to tell the tanh form of GELU
// from the erf form (up to 5e-4 apart).
TEST_P(OnDevice, LinearWithGeluForwardAndBackwardThroughIt) {
  MB_SKIP_ON_EMULATOR("cuBLASLt");
  auto h = harness(15);
  for (const int64_t O : {64, 36}) {
    SCOPED_TRACE("O = " + std::to_string(O));
    const int64_t n = 67, I = 48, O2 = 40;
    const Pair x = h.input({n, I}), w = h.input({O, I}, 0.3), b = h.input({O});
    Pair y = h.output({n, O}), pre = h.output({n, O});
    ops::linear_gelu_forward(y.dev, pre.dev, x.dev, w.dev, b.dev);
    ops::linear_gelu_forward(y.ref, pre.ref, x.ref, w.ref, b.ref);
    h.expect_close(pre, I + 1, "pre-activation");
    h.expect_close(y, I + 9, "gelu of it");
    // the second layer's backward (its input a, from the pre-activation p) through the GELU
    const Pair a = h.input({n, O}), p = h.input({n, O}, 2.0), w2 = h.input({O2, O}, 0.3), dy = h.input({n, O2});
    Pair dpre = h.output({n, O}), dw2 = h.accumulator({O2, O}, DType::kF32), db2 = h.accumulator({O2}, DType::kF32);
    ops::linear_backward_gelu(dpre.dev, dw2.dev, db2.dev, dy.dev, a.dev, w2.dev, p.dev);
    ops::linear_backward_gelu(dpre.ref, dw2.ref, db2.ref, dy.ref, a.ref, w2.ref, p.ref);
    h.expect_close(dpre, O2 + 64, "dpre");
    h.expect_close(dw2, n, "dweight");
    h.expect_close(db2, n, "dbias");
  }
}

TEST_P(OnDevice, LayerNormAndRmsNormForwardAndBackward) {
  auto h = harness(3);
  // C 300: over a block of 256 threads, and not whole 16-byte vectors of 2-byte types (a GPU's
  // block-per-row kernels there); 768 and 64: whole vectors (its warp-per-row kernels, 4 and 1
  // vectors a lane). n over one row chunk of the parameter gradients.
  for (const int64_t C : {300, 768, 64}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const int64_t n = 70;
    const double roundings = static_cast<double>(C);  // a row's sums
    const Pair x = h.input({n, C}, 2.0), w = h.input({C}), b = h.input({C}), dy = h.input({n, C});
    Pair y = h.output({n, C}), mean = h.output({n}, DType::kF32), rstd = h.output({n}, DType::kF32);
    ops::layernorm_forward(y.dev, mean.dev, rstd.dev, x.dev, w.dev, b.dev, 1e-5);
    ops::layernorm_forward(y.ref, mean.ref, rstd.ref, x.ref, w.ref, b.ref, 1e-5);
    h.expect_close(y, roundings, "layernorm out");
    h.expect_close(mean, roundings, "layernorm mean");
    h.expect_close(rstd, roundings, "layernorm rstd");
    Pair dx = h.accumulator({n, C}), dw = h.accumulator({C}, DType::kF32), db = h.accumulator({C}, DType::kF32);
    ops::layernorm_backward(dx.dev, dw.dev, db.dev, dy.dev, x.dev, w.dev, mean.dev, rstd.dev);
    ops::layernorm_backward(dx.ref, dw.ref, db.ref, dy.ref, x.ref, w.ref, mean.ref, rstd.ref);
    h.expect_close(dx, roundings, "layernorm dx");
    h.expect_close(dw, n, "layernorm dweight");
    h.expect_close(db, n, "layernorm dbias");

    Pair ry = h.output({n, C}), rr = h.output({n}, DType::kF32);
    ops::rmsnorm_forward(ry.dev, rr.dev, x.dev, w.dev, 1e-6);
    ops::rmsnorm_forward(ry.ref, rr.ref, x.ref, w.ref, 1e-6);
    h.expect_close(ry, roundings, "rmsnorm out");
    Pair rdx = h.accumulator({n, C}), rdw = h.accumulator({C}, DType::kF32);
    ops::rmsnorm_backward(rdx.dev, rdw.dev, dy.dev, x.dev, w.dev, rr.dev);
    ops::rmsnorm_backward(rdx.ref, rdw.ref, dy.ref, x.ref, w.ref, rr.ref);
    h.expect_close(rdx, roundings, "rmsnorm dx");
    h.expect_close(rdw, n, "rmsnorm dweight");

    // the residual add fused in: sum = a + b (rounded), then the norm of it (one pass on a
    // GPU at C 768 and 64)
    const Pair ra = h.input({n, C}, 2.0), rb = h.input({n, C});
    Pair sum = h.output({n, C}), fy = h.output({n, C}), fm = h.output({n}, DType::kF32), fr = h.output({n}, DType::kF32);
    ops::layernorm_residual_forward(sum.dev, fy.dev, fm.dev, fr.dev, ra.dev, rb.dev, w.dev, b.dev, 1e-5);
    ops::layernorm_residual_forward(sum.ref, fy.ref, fm.ref, fr.ref, ra.ref, rb.ref, w.ref, b.ref, 1e-5);
    h.expect_close(sum, 1, "residual sum");
    h.expect_close(fy, roundings + 2, "layernorm of the sum");
    h.expect_close(fm, roundings + 2, "layernorm of the sum: mean");
    h.expect_close(fr, roundings + 2, "layernorm of the sum: rstd");
    Pair rsum = h.output({n, C}), rfy = h.output({n, C}), rfr = h.output({n}, DType::kF32);
    ops::rmsnorm_residual_forward(rsum.dev, rfy.dev, rfr.dev, ra.dev, rb.dev, w.dev, 1e-6);
    ops::rmsnorm_residual_forward(rsum.ref, rfy.ref, rfr.ref, ra.ref, rb.ref, w.ref, 1e-6);
    h.expect_close(rsum, 1, "rms residual sum");
    h.expect_close(rfy, roundings + 2, "rmsnorm of the sum");
    h.expect_close(rfr, roundings + 2, "rmsnorm of the sum: rstd");
  }
}

TEST_P(OnDevice, ElementwiseActivationsResidualsAndCasts) {
  auto h = harness(4);
  const int64_t n = 100003;  // not a multiple of any block size
  const Pair x = h.input({n}, 2.0), y = h.input({n}), g = h.input({n});
  Pair gl = h.output({n}), th = h.output({n}), sum = h.output({n});
  ops::gelu_forward(gl.dev, x.dev);
  ops::gelu_forward(gl.ref, x.ref);
  ops::tanh_forward(th.dev, x.dev);
  ops::tanh_forward(th.ref, x.ref);
  ops::residual_forward(sum.dev, x.dev, y.dev);
  ops::residual_forward(sum.ref, x.ref, y.ref);
  h.expect_close(gl, 8, "gelu");
  // a view one element in: on a GPU not 16-byte aligned, so the kernels' one-at-a-time path
  const size_t m = static_cast<size_t>(n - 1);
  Pair gv = h.output({n - 1}), dgv = h.accumulator({n - 1});
  ops::gelu_forward(gv.dev, x.dev.flat(1, m));
  ops::gelu_forward(gv.ref, x.ref.flat(1, m));
  h.expect_close(gv, 8, "gelu of an unaligned view");
  ops::gelu_backward(dgv.dev, g.dev.flat(1, m), x.dev.flat(1, m));
  ops::gelu_backward(dgv.ref, g.ref.flat(1, m), x.ref.flat(1, m));
  h.expect_close(dgv, 64, "gelu backward of unaligned views");
  h.expect_close(th, 8, "tanh");
  h.expect_close(sum, 1, "residual");
  Pair dg = h.accumulator({n}), dt = h.accumulator({n}), da = h.accumulator({n}), db = h.accumulator({n});
  ops::gelu_backward(dg.dev, g.dev, x.dev);
  ops::gelu_backward(dg.ref, g.ref, x.ref);
  ops::tanh_backward(dt.dev, g.dev, th.dev);
  ops::tanh_backward(dt.ref, g.ref, th.ref);
  ops::residual_backward(da.dev, db.dev, g.dev);
  ops::residual_backward(da.ref, db.ref, g.ref);
  // 1 - tanh^2 cancels at large |x| (inputs up to ~8 here): about 64 roundings' worth in f32
  h.expect_close(dg, 64, "gelu backward");
  Pair dg_set = h.output({n});  // written whole: the device side's NaN start must not show
  ops::gelu_backward(dg_set.dev, g.dev, x.dev, ops::Write::kSet);
  ops::gelu_backward(dg_set.ref, g.ref, x.ref, ops::Write::kSet);
  h.expect_close(dg_set, 64, "gelu backward set");
  h.expect_close(dt, 8, "tanh backward");
  h.expect_close(da, 1, "residual da");
  h.expect_close(db, 1, "residual db");
  // casts between every pair of floating types, and scaling
  for (DType to : {DType::kF32, DType::kBF16, DType::kF16}) {
    Pair c = h.output({n}, to);
    ops::cast(c.dev, x.dev);
    c.ref = mb::from_host(mb::to_host_f32(x.ref), {n}, to);  // the host's rounding to nearest even
    const auto got = mb::to_host_f32(c.dev), want = mb::to_host_f32(c.ref);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(got[i], want[i]) << "cast from " << mb::dtype_name(x.dev.dtype()) << " to " << mb::dtype_name(to)
                                 << " of element " << i;
  }
  Pair s = h.accumulator({n});
  ops::scale(s.dev, 0.375f);
  ops::scale(s.ref, 0.375f);
  h.expect_close(s, 1, "scale");
}

TEST_P(OnDevice, DropoutKeepsExactlyTheElementsOfTheCpuMask) {
  auto h = harness(5);
  const int64_t n = 4099;
  const ops::DropoutKey k{0.3, 1234, 17};
  const Pair x = h.input({n}), g = h.input({n});
  Pair y = h.output({n}), dx = h.accumulator({n});
  ops::dropout_forward(y.dev, x.dev, 6, k);  // an offset that is not a multiple of 4
  ops::dropout_forward(y.ref, x.ref, 6, k);
  ops::dropout_backward(dx.dev, g.dev, 6, k);
  ops::dropout_backward(dx.ref, g.ref, 6, k);
  h.expect_close(y, 1, "dropout forward");
  h.expect_close(dx, 1, "dropout backward");
  Pair dx_set = h.output({n});  // written whole, dropped elements as zeros
  ops::dropout_backward(dx_set.dev, g.dev, 6, k, ops::Write::kSet);
  ops::dropout_backward(dx_set.ref, g.ref, 6, k, ops::Write::kSet);
  h.expect_close(dx_set, 1, "dropout backward set");
  const auto got = mb::to_host_f64(y.dev), ref = mb::to_host_f64(y.ref);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i] == 0.0, ref[i] == 0.0) << "element " << i << " dropped differently";
}

TEST_P(OnDevice, EmbeddingForwardAccumulateAndDeterministicBackward) {
  auto h = harness(6);
  const int64_t n = 1000, C = 48, rows = 64, begin = 32;  // a shard: ids outside [32, 96) give zeros
  const std::vector<int32_t> idv = random_ids(n, 0, 127, 7);  // many repeats
  const Pair ids = h.ids(idv, {n}), table = h.input({rows, C}), dy = h.input({n, C});
  Pair y = h.output({n, C});
  ops::embedding_forward(y.dev, ids.dev, table.dev, begin);
  ops::embedding_forward(y.ref, ids.ref, table.ref, begin);
  h.expect_close(y, 0, "embedding forward", 1.0);
  Pair acc = h.accumulator({n, C});
  ops::embedding_forward(acc.dev, ids.dev, table.dev, begin, true);
  ops::embedding_forward(acc.ref, ids.ref, table.ref, begin, true);
  h.expect_close(acc, 1, "embedding forward, accumulating");
  Pair dt = h.accumulator({rows, C}, DType::kF32);
  const std::vector<float> start = mb::to_host_f32(dt.dev);
  ops::embedding_backward(dt.dev, dy.dev, ids.dev, begin);
  ops::embedding_backward(dt.ref, dy.ref, ids.ref, begin);
  h.expect_close(dt, n / 16, "embedding backward");
  // deterministic: from the same start, a second run gives the same bits
  const std::vector<float> first = mb::to_host_f32(dt.dev);
  mb::copy(dt.dev, mb::from_host(start, {rows, C}, DType::kF32, h.device()));
  ops::embedding_backward(dt.dev, dy.dev, ids.dev, begin);
  EXPECT_EQ(mb::to_host_f32(dt.dev), first) << "embedding backward is not deterministic";
}

TEST_P(OnDevice, CrossEntropyPiecesAndBackward) {
  auto h = harness(8);
  const int64_t n = 33, V = 1000;
  std::vector<int32_t> tv = random_ids(n, 0, V - 1, 9);
  tv[3] = -1;  // ignored
  tv[4] = static_cast<int32_t>(V + 5);  // another shard's column
  const Pair logits = h.input({n, V}, 3.0), targets = h.ids(tv, {n});
  Pair m = h.output({n}, DType::kF32), s = h.output({n}, DType::kF32), t = h.output({n}, DType::kF32),
       l = h.output({n}, DType::kF32);
  auto run = [&](bool dev) {
    auto pick = [&](const Pair& p) -> const mb::Tensor& { return dev ? p.dev : p.ref; };
    ops::ce_row_max(pick(m), pick(logits));
    ops::ce_sum_exp(pick(s), pick(logits), pick(m));
    ops::ce_target_logit(pick(t), pick(logits), pick(targets), 0);
    ops::ce_loss(pick(l), pick(m), pick(s), pick(t), pick(targets), -1);
  };
  run(true);
  run(false);
  h.expect_close(m, 1, "row max");
  h.expect_close(s, V, "sum exp");
  h.expect_close(t, 1, "target logit");
  h.expect_close(l, V, "loss");
  const mb::Tensor scale_dev = mb::from_host(std::vector<float>{8.0f}, {1}, DType::kF32, h.device());
  Pair d = h.accumulator({n, V});
  ops::ce_backward(d.dev, logits.dev, m.dev, s.dev, targets.dev, 0, -1, 0.25f, scale_dev);
  ops::ce_backward(d.ref, logits.ref, m.ref, s.ref, targets.ref, 0, -1, 0.25f, mb::from_host(std::vector<float>{8.0f}, {1}));
  h.expect_close(d, V, "dlogits");
  // Megatron's way, as the LM head runs it: the logits become their exps (in the logits'
  // dtype), then the gradient is written over them.
  Pair e = h.output({n, V}), s2 = h.output({n}, DType::kF32);
  mb::copy(e.dev, logits.dev);
  mb::copy(e.ref, logits.ref);
  ops::ce_exps(s2.dev, e.dev, m.dev);
  ops::ce_exps(s2.ref, e.ref, m.ref);
  h.expect_close(s2, V, "sum of exps");
  h.expect_close(e, 1, "exps");
  ops::ce_backward_exps(e.dev, e.dev, s2.dev, targets.dev, 0, -1, 0.25f, scale_dev);
  ops::ce_backward_exps(e.ref, e.ref, s2.ref, targets.ref, 0, -1, 0.25f, mb::from_host(std::vector<float>{8.0f}, {1}));
  h.expect_close(e, V, "dlogits from exps, in place");
  // rows that hold the whole vocabulary (no tensor parallelism), one pass each: losses,
  // and the gradient in place or the logits only read
  Pair w = h.output({n, V}), lw = h.output({n}, DType::kF32);
  for (const bool grad : {false, true}) {
    SCOPED_TRACE(grad ? "whole rows, with the gradient" : "whole rows, losses only");
    mb::copy(w.dev, logits.dev);
    mb::copy(w.ref, logits.ref);
    ops::ce_whole_rows(lw.dev, w.dev, targets.dev, -1, grad, 0.25f, scale_dev);
    ops::ce_whole_rows(lw.ref, w.ref, targets.ref, -1, grad, 0.25f, mb::from_host(std::vector<float>{8.0f}, {1}));
    h.expect_close(lw, V, "losses");
    if (grad) h.expect_close(w, V, "dlogits");
    else EXPECT_EQ(mb::to_host_f32(w.dev), mb::to_host_f32(logits.dev)) << "the logits were written";
  }
  // rows wider than a GPU block's threads (several elements a thread), targets in the first
  // and last columns, an ignore label that is a real column (7), and one row's logits far
  // above the rest (the max matters)
  const int64_t V2 = 5003;
  std::vector<int32_t> tw = random_ids(n, 0, static_cast<int32_t>(V2 - 1), 10);
  tw[0] = 0;
  tw[1] = static_cast<int32_t>(V2 - 1);
  tw[2] = 7;
  std::vector<float> wv(static_cast<size_t>(n * V2));
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (size_t k = 0; k < wv.size(); ++k) wv[k] = nd(g) + (k / static_cast<size_t>(V2) == 5 ? 40.0f : 0.0f);
  Pair wide = h.values(wv, {n, V2}), wide_targets = h.ids(tw, {n}), lw2 = h.output({n}, DType::kF32);
  ops::ce_whole_rows(lw2.dev, wide.dev, wide_targets.dev, 7, true, 0.25f, scale_dev);
  ops::ce_whole_rows(lw2.ref, wide.ref, wide_targets.ref, 7, true, 0.25f, mb::from_host(std::vector<float>{8.0f}, {1}));
  h.expect_close(lw2, V2, "losses, rows of 5,003");
  h.expect_close(wide, V2, "dlogits, rows of 5,003");
  EXPECT_EQ(mb::to_host_f32(lw2.dev)[2], 0.0f) << "the ignored row has a loss";
  // rows of whole 16-byte vectors (10,000 is a multiple of 8 and 4): a GPU loads them 16
  // bytes at a time, several vectors a thread; the same large row
  const int64_t V3 = 10000;
  std::vector<int32_t> t3 = random_ids(n, 0, static_cast<int32_t>(V3 - 1), 12);
  t3[0] = static_cast<int32_t>(V3 - 1);
  std::vector<float> vv(static_cast<size_t>(n * V3));
  for (size_t k = 0; k < vv.size(); ++k) vv[k] = nd(g) + (k / static_cast<size_t>(V3) == 5 ? 40.0f : 0.0f);
  Pair vec = h.values(vv, {n, V3}), vec_targets = h.ids(t3, {n}), lw3 = h.output({n}, DType::kF32);
  ops::ce_whole_rows(lw3.dev, vec.dev, vec_targets.dev, -1, true, 0.25f, scale_dev);
  ops::ce_whole_rows(lw3.ref, vec.ref, vec_targets.ref, -1, true, 0.25f, mb::from_host(std::vector<float>{8.0f}, {1}));
  h.expect_close(lw3, V3, "losses, rows of 10,000");
  h.expect_close(vec, V3, "dlogits, rows of 10,000");
}

struct AttnConfig {
  int64_t B, T, H, D;
  bool causal, mask, bias;
  double p;
};

TEST_P(OnDevice, SelfAttentionForwardAndBackward) {
  MB_SKIP_ON_EMULATOR("cuBLASLt");
  for (const AttnConfig c : {AttnConfig{2, 37, 3, 16, true, false, false, 0.0}, AttnConfig{3, 20, 2, 8, false, true, true, 0.0},
                             AttnConfig{2, 33, 2, 8, true, true, false, 0.2}}) {
    auto h = harness(10);
    SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + (c.causal ? " causal" : "") +
                 (c.mask ? " masked" : "") + (c.bias ? " bias" : "") + " p " + std::to_string(c.p));
    const ops::AttentionShape s{c.B, c.T, c.H, c.D, c.causal, 1, c.H + 2};  // a TP shard: heads 1.. of H + 2
    const ops::DropoutKey dk{c.p, 55, 2};
    std::vector<uint8_t> mv(static_cast<size_t>(c.B * c.T), 1);
    for (int64_t t = c.T - 5; t < c.T; ++t) mv[static_cast<size_t>(t)] = 0;  // batch row 0's tail padded
    const Pair mask = c.mask ? h.bytes(mv, {c.B, c.T}) : Pair{};
    const Pair qkv = h.input({c.B, c.T, c.H, 3, c.D}), bias = c.bias ? h.input({c.H, c.T, c.T}) : Pair{};
    const Pair dy = h.input({c.B, c.T, c.H, c.D});
    Pair out = h.output({c.B, c.T, c.H, c.D}), probs = h.output({c.B, c.H, c.T, c.T});
    ops::attention_forward(out.dev, probs.dev, qkv.dev, mask.dev, s, &dk, bias.dev);
    ops::attention_forward(out.ref, probs.ref, qkv.ref, mask.ref, s, &dk, bias.ref);
    const double terms = static_cast<double>(c.D + c.T);
    h.expect_close(probs, static_cast<double>(c.D), "probs", 8.0);
    h.expect_close(out, terms, "out", 8.0);
    Pair dqkv = h.accumulator({c.B, c.T, c.H, 3, c.D});
    Pair dbias = c.bias ? h.accumulator({c.H, c.T, c.T}, DType::kF32) : Pair{};
    ops::attention_backward(dqkv.dev, dy.dev, qkv.dev, probs.dev, mask.dev, s, &dk, dbias.dev);
    ops::attention_backward(dqkv.ref, dy.ref, qkv.ref, probs.ref, mask.ref, s, &dk, dbias.ref);
    h.expect_close(dqkv, terms, "dqkv", 16.0);
    if (c.bias) h.expect_close(dbias, terms, "dbias", 16.0);
  }
}

// A flash forward's lse against the reference's: +inf exactly where the reference has it
// (rows whose keys are all masked: `infinite` of them), elsewhere close for `terms` terms.
static void expect_lse_close(const Pair& lse, double terms, int64_t infinite) {
  const std::vector<double> got = mb::to_host_f64(lse.dev), ref = mb::to_host_f64(lse.ref);
  int64_t seen = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      EXPECT_TRUE(std::isinf(got[i]) && got[i] > 0) << "lse " << i << ": " << got[i];
      ++seen;
    } else {
      EXPECT_NEAR(got[i], ref[i], 1e-4 * (std::abs(ref[i]) + 1) * terms / 64) << "lse " << i;
    }
  }
  EXPECT_EQ(seen, infinite);
}

// What a flash op says when the GPU's kernels do not take the dtype (f32) or, on sm_75 (a T4,
// or a build for sm_75 alone run on a newer GPU), anything but fp16 at head size 64.
static std::string refusal(const std::string& op, const std::string& arg, DType t) {
  return t == DType::kF32 ? op + ": " + arg + " is f32, which the CUDA kernels do not take"
                          : op + ": " + mb::testing::test_device().str() + " runs the flash kernels in fp16 at head size 64 only";
}

// Flash attention against the f64 CPU reference (each row in f64), which is itself checked
// against the explicit attention (the same outputs, dropout masks included) and by finite
// differences. Head sizes 64 and 128, sequences that are not multiples of the 64-row tiles,
// causal and not, padding (batch row 1 entirely padded in one case: output and gradient 0,
// lse +inf), dropout on a tensor-parallel shard, T5's position bias (causal and not, with its
// gradient summed over the batch). Where the device's kernels do not take the dtype (CUDA
// and f32), the op must say so.
TEST_P(OnDevice, FlashAttentionMatchesTheReferenceAndTheExplicitAttention) {
  MB_SKIP_ON_EMULATOR("cuBLASLt, for the explicit attention");
  struct Config {
    int64_t B, T, H, D;
    bool causal, mask, all_padded;
    double p;
    bool bias;
  };
  for (const Config c : {Config{2, 37, 2, 64, true, false, false, 0.0, false}, Config{1, 130, 2, 64, true, true, false, 0.0, false},
                         Config{2, 100, 1, 128, false, true, true, 0.0, false}, Config{2, 70, 2, 64, true, true, false, 0.2, false},
                         Config{1, 65, 1, 128, true, false, false, 0.1, false}, Config{3, 70, 2, 64, false, true, false, 0.1, true},
                         Config{2, 130, 1, 128, true, false, false, 0.0, true}}) {
    auto h = harness(13);
    SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " D " + std::to_string(c.D) +
                 (c.causal ? " causal" : "") + (c.mask ? " masked" : "") + (c.all_padded ? " (a row all padding)" : "") +
                 " p " + std::to_string(c.p) + (c.bias ? " bias" : ""));
    const ops::AttentionShape s{c.B, c.T, c.H, c.D, c.causal, 1, c.H + 1};
    const ops::DropoutKey dk{c.p, 57, 4};
    std::vector<uint8_t> mv(static_cast<size_t>(c.B * c.T), 1);
    for (int64_t t = c.T - 9; t < c.T; ++t) mv[static_cast<size_t>(t)] = 0;  // batch row 0's tail padded
    if (c.all_padded)
      for (int64_t t = 0; t < c.T; ++t) mv[static_cast<size_t>(c.T + t)] = 0;
    const Pair mask = c.mask ? h.bytes(mv, {c.B, c.T}) : Pair{};
    const Pair qkv = h.input({c.B, c.T, c.H, 3, c.D}), dy = h.input({c.B, c.T, c.H, c.D});
    const Pair bias = c.bias ? h.input({c.H, c.T, c.T}) : Pair{};
    Pair out = h.output({c.B, c.T, c.H, c.D}), lse = h.output({c.B, c.H, c.T}, DType::kF32);  // (f64 in the reference)
    if (!ops::flash_attention_supported(h.device(), h.dtype(), c.D)) {  // refused by name
      mb::testing::expect_error([&] { ops::flash_attention_forward(out.dev, lse.dev, qkv.dev, mask.dev, s, &dk); },
                                refusal("flash_attention_forward", "qkv", h.dtype()));
      continue;
    }
    ops::flash_attention_forward(out.dev, lse.dev, qkv.dev, mask.dev, s, &dk, bias.dev);
    ops::flash_attention_forward(out.ref, lse.ref, qkv.ref, mask.ref, s, &dk, bias.ref);
    const double terms = static_cast<double>(c.D + c.T);
    h.expect_close(out, terms, "out", 8.0);
    expect_lse_close(lse, terms, c.all_padded ? c.H * c.T : 0);
    Pair dqkv = h.accumulator({c.B, c.T, c.H, 3, c.D});
    Pair dbias = c.bias ? h.accumulator({c.H, c.T, c.T}, DType::kF32) : Pair{};
    ops::flash_attention_backward(dqkv.dev, dy.dev, qkv.dev, out.dev, lse.dev, mask.dev, s, &dk, ops::Write::kAdd, bias.dev,
                                  dbias.dev);
    ops::flash_attention_backward(dqkv.ref, dy.ref, qkv.ref, out.ref, lse.ref, mask.ref, s, &dk, ops::Write::kAdd, bias.ref,
                                  dbias.ref);
    h.expect_close(dqkv, terms, "dqkv", 16.0);
    if (c.bias) h.expect_close(dbias, terms + static_cast<double>(c.B), "dbias", 16.0);
    Pair dqkv_set = h.output({c.B, c.T, c.H, 3, c.D});  // written whole: the device's NaN start must not show
    ops::flash_attention_backward(dqkv_set.dev, dy.dev, qkv.dev, out.dev, lse.dev, mask.dev, s, &dk, ops::Write::kSet,
                                  bias.dev);
    ops::flash_attention_backward(dqkv_set.ref, dy.ref, qkv.ref, out.ref, lse.ref, mask.ref, s, &dk, ops::Write::kSet,
                                  bias.ref);
    h.expect_close(dqkv_set, terms, "dqkv set", 16.0);

    // the reference is the explicit attention (f64, the same dropout draws)
    Pair eout = h.output({c.B, c.T, c.H, c.D}), probs = h.output({c.B, c.H, c.T, c.T});
    ops::attention_forward(eout.ref, probs.ref, qkv.ref, mask.ref, s, &dk, bias.ref);
    const std::vector<double> fo = mb::to_host_f64(out.ref), eo = mb::to_host_f64(eout.ref);
    for (size_t i = 0; i < fo.size(); ++i) ASSERT_NEAR(fo[i], eo[i], 1e-12 * (std::abs(eo[i]) + 1)) << "out " << i;
    mb::Tensor flash_grad = mb::Tensor(qkv.ref.shape(), DType::kF64), explicit_grad = mb::Tensor(qkv.ref.shape(), DType::kF64);
    flash_grad.zero();
    explicit_grad.zero();
    mb::Tensor flash_dbias, explicit_dbias;
    if (c.bias) {
      flash_dbias = mb::Tensor({c.H, c.T, c.T}, DType::kF64);
      explicit_dbias = mb::Tensor({c.H, c.T, c.T}, DType::kF64);
      flash_dbias.zero();
      explicit_dbias.zero();
    }
    ops::flash_attention_backward(flash_grad, dy.ref, qkv.ref, out.ref, lse.ref, mask.ref, s, &dk, ops::Write::kAdd,
                                  bias.ref, flash_dbias);
    ops::attention_backward(explicit_grad, dy.ref, qkv.ref, probs.ref, mask.ref, s, &dk, explicit_dbias);
    const std::vector<double> fg = mb::to_host_f64(flash_grad), eg = mb::to_host_f64(explicit_grad);
    for (size_t i = 0; i < fg.size(); ++i) ASSERT_NEAR(fg[i], eg[i], 1e-10 * (std::abs(eg[i]) + 1)) << "dqkv " << i;
    if (c.bias) {
      const std::vector<double> fb = mb::to_host_f64(flash_dbias), eb = mb::to_host_f64(explicit_dbias);
      for (size_t i = 0; i < fb.size(); ++i) ASSERT_NEAR(fb[i], eb[i], 1e-10 * (std::abs(eb[i]) + 1)) << "dbias " << i;
    }
  }
}

// The ordered dQ (ops::FlashDq::kOrdered: the dK/dV kernel adds each key block's share into
// an f32 sum per query tile, the blocks taking turns) against the f64 reference, and the
// same bits when run again. Shapes of several key blocks and query tiles (up to 5 x 5),
// causal and not, odd lengths, padding, dropout, head sizes 64 (blocks of 64 keys, one per
// tile) and 128 (128 keys, two tiles each), add and set. The path must have run where the
// GPU's code is sm_80 or later; on sm_75 code (test_ops_gpu_sm75) the separate kernels must
// run instead, with the same checks. A dtype or head size the kernels do not take is refused
// by name with the ordered dQ chosen. (The GPU program's only: the CPU computes each row whole.)
#ifdef MB_TEST_DEVICE_CUDA
TEST_P(OnDevice, FlashAttentionOrderedDqMatchesTheReferenceAndRepeatsBitwise) {
  struct Restore {
    ops::FlashDq was = ops::flash_dq();
    ~Restore() { ops::set_flash_dq(was); }
  } restore;
  struct Config {
    int64_t B, T, H, D;
    bool causal, mask;
    double p;
  };
  for (const Config c : {Config{2, 300, 2, 64, false, true, 0.0}, Config{1, 257, 3, 64, true, false, 0.0},
                         Config{2, 190, 2, 64, true, true, 0.15}, Config{1, 300, 2, 128, false, false, 0.1},
                         Config{2, 270, 1, 128, true, true, 0.0}, Config{1, 40, 2, 64, false, false, 0.0}}) {
    auto h = harness(17);
    SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " D " + std::to_string(c.D) +
                 (c.causal ? " causal" : "") + (c.mask ? " masked" : "") + " p " + std::to_string(c.p));
    const ops::AttentionShape s{c.B, c.T, c.H, c.D, c.causal, 0, 0};
    const ops::DropoutKey dk{c.p, 61, 3};
    std::vector<uint8_t> mv(static_cast<size_t>(c.B * c.T), 1);
    for (int64_t t = std::max<int64_t>(0, c.T - 70); t < c.T; ++t) mv[static_cast<size_t>(t)] = 0;  // batch row 0's last 70 keys padded
    const Pair mask = c.mask ? h.bytes(mv, {c.B, c.T}) : Pair{};
    const Pair qkv = h.input({c.B, c.T, c.H, 3, c.D}), dy = h.input({c.B, c.T, c.H, c.D});
    Pair out = h.output({c.B, c.T, c.H, c.D}), lse = h.output({c.B, c.H, c.T}, DType::kF32);
    const int64_t calls = ops::flash_dq_ordered_calls();
    if (!ops::flash_attention_supported(h.device(), h.dtype(), c.D)) {  // the ordered dQ refuses it by name too
      ops::set_flash_dq(ops::FlashDq::kOrdered);
      Pair dqkv = h.accumulator({c.B, c.T, c.H, 3, c.D});
      mb::testing::expect_error(
          [&] {
            ops::flash_attention_backward(dqkv.dev, dy.dev, qkv.dev, out.dev, lse.dev, mask.dev, s, &dk,
                                          ops::Write::kAdd);
          },
          refusal("flash_attention_backward", "qkv", h.dtype()));
      EXPECT_EQ(ops::flash_dq_ordered_calls(), calls) << "a refused backward counted as an ordered call";
      ops::set_flash_dq(ops::FlashDq::kSeparate);
      continue;
    }
    ops::flash_attention_forward(out.dev, lse.dev, qkv.dev, mask.dev, s, &dk);
    ops::flash_attention_forward(out.ref, lse.ref, qkv.ref, mask.ref, s, &dk);
    ops::set_flash_dq(ops::FlashDq::kOrdered);
    Pair dqkv = h.accumulator({c.B, c.T, c.H, 3, c.D});
    ops::flash_attention_backward(dqkv.dev, dy.dev, qkv.dev, out.dev, lse.dev, mask.dev, s, &dk, ops::Write::kAdd);
    ops::flash_attention_backward(dqkv.ref, dy.ref, qkv.ref, out.ref, lse.ref, mask.ref, s, &dk, ops::Write::kAdd);
    const int64_t ordered = ops::flash_dq_ordered_supported(h.device()) ? 1 : 0;  // calls that take the path
    ASSERT_EQ(ops::flash_dq_ordered_calls(), calls + ordered)
        << (ordered ? "the backward did not take the ordered path" : "sm_75 code took the ordered path");
    const double terms = static_cast<double>(c.D + c.T);
    h.expect_close(dqkv, terms, "dqkv (add)", 16.0);
    Pair once = h.output({c.B, c.T, c.H, 3, c.D}), again = h.output({c.B, c.T, c.H, 3, c.D});
    ops::flash_attention_backward(once.dev, dy.dev, qkv.dev, out.dev, lse.dev, mask.dev, s, &dk, ops::Write::kSet);
    ops::flash_attention_backward(again.dev, dy.dev, qkv.dev, out.dev, lse.dev, mask.dev, s, &dk, ops::Write::kSet);
    ops::flash_attention_backward(once.ref, dy.ref, qkv.ref, out.ref, lse.ref, mask.ref, s, &dk, ops::Write::kSet);
    ASSERT_EQ(ops::flash_dq_ordered_calls(), calls + 3 * ordered);
    h.expect_close(once, terms, "dqkv (set)", 16.0);
    const std::vector<float> a = mb::to_host_f32(once.dev), b = mb::to_host_f32(again.dev);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0) << "run again, element " << i << ": " << a[i] << " then " << b[i];
    ops::set_flash_dq(ops::FlashDq::kSeparate);
  }
}
#endif

// The forward with a warp per 32 query rows (ops::FlashForwardRows::k32; at head size 128
// with the queries' fragments loaded from shared memory) gives the bits of the one with 16,
// out and lse: each row's products and sums are the same instructions in the same order.
// Head sizes 64 and 128, causal and not, padding, dropout, lengths past the 128-row blocks; a
// dtype the kernels do not take (f32) is refused by name with 32 rows as with 16. (The GPU
// program's only: the CPU has one forward.)
#ifdef MB_TEST_DEVICE_CUDA
TEST_P(OnDevice, FlashForwardWith32RowsAWarpGivesTheSameBits) {
  struct Restore {
    ops::FlashForwardRows was = ops::flash_forward_rows();
    ~Restore() { ops::set_flash_forward_rows(was); }
  } restore;
  for (const auto& [D, T, causal, masked, p] :
       {std::tuple{64, 37, true, false, 0.0}, std::tuple{64, 300, false, true, 0.0},
        std::tuple{64, 257, true, true, 0.1}, std::tuple{64, 130, false, false, 0.2},
        std::tuple{128, 37, true, false, 0.0}, std::tuple{128, 300, false, true, 0.0},
        std::tuple{128, 257, true, true, 0.1}}) {
    auto h = harness(19);
    SCOPED_TRACE("D " + std::to_string(D) + " T " + std::to_string(T) + (causal ? " causal" : "") +
                 (masked ? " masked" : "") + " p " + std::to_string(p));
    const int64_t B = 2, H = 2;
    const ops::AttentionShape s{B, T, H, D, causal, 0, 0};
    const ops::DropoutKey dk{p, 67, 2};
    std::vector<uint8_t> mv(static_cast<size_t>(B * T), 1);
    for (int64_t t = T / 2; t < T; ++t) mv[static_cast<size_t>(t)] = 0;
    const Pair mask = masked ? h.bytes(mv, {B, T}) : Pair{};
    const Pair qkv = h.input({B, T, H, 3, D});
    Pair out16 = h.output({B, T, H, D}), lse16 = h.output({B, H, T}, DType::kF32);
    Pair out32 = h.output({B, T, H, D}), lse32 = h.output({B, H, T}, DType::kF32);
    if (!ops::flash_attention_supported(h.device(), h.dtype(), D)) {  // 32 rows a warp refuses it by name too
      ops::set_flash_forward_rows(ops::FlashForwardRows::k32);
      mb::testing::expect_error([&] { ops::flash_attention_forward(out32.dev, lse32.dev, qkv.dev, mask.dev, s, &dk); },
                                refusal("flash_attention_forward", "qkv", h.dtype()));
      continue;
    }
    ops::set_flash_forward_rows(ops::FlashForwardRows::k16);
    ops::flash_attention_forward(out16.dev, lse16.dev, qkv.dev, mask.dev, s, &dk);
    ops::set_flash_forward_rows(ops::FlashForwardRows::k32);
    ops::flash_attention_forward(out32.dev, lse32.dev, qkv.dev, mask.dev, s, &dk);
    const std::vector<float> o16 = mb::to_host_f32(out16.dev), o32 = mb::to_host_f32(out32.dev);
    const std::vector<float> l16 = mb::to_host_f32(lse16.dev), l32 = mb::to_host_f32(lse32.dev);
    for (size_t i = 0; i < o16.size(); ++i)
      ASSERT_EQ(std::memcmp(&o16[i], &o32[i], sizeof(float)), 0) << "out " << i << ": " << o16[i] << " and " << o32[i];
    for (size_t i = 0; i < l16.size(); ++i)
      ASSERT_EQ(std::memcmp(&l16[i], &l32[i], sizeof(float)), 0) << "lse " << i << ": " << l16[i] << " and " << l32[i];
  }
}
#endif

// The f64 flash backward against finite differences of its forward: L = sum(dy * out).
TEST(FlashAttention, GradientsMatchFiniteDifferences) {
  const ops::AttentionShape s{2, 11, 2, 8, true, 0, 0};
  const ops::DropoutKey dk{0.15, 58, 5};
  std::mt19937 g(3);
  std::normal_distribution<double> nd;
  std::vector<double> q(static_cast<size_t>(2 * 11 * 2 * 3 * 8)), y(static_cast<size_t>(2 * 11 * 2 * 8));
  for (auto& x : q) x = nd(g);
  for (auto& x : y) x = nd(g);
  std::vector<uint8_t> mv(22, 1);
  mv[10] = mv[9] = 0;
  const mb::Tensor mask = mb::from_host(mv, {2, 11}), dy = mb::from_host(y, {2, 11, 2, 8});
  auto loss = [&](const std::vector<double>& x) {
    mb::Tensor out({2, 11, 2, 8}, DType::kF64), lse({2, 2, 11}, DType::kF64);
    ops::flash_attention_forward(out, lse, mb::from_host(x, {2, 11, 2, 3, 8}), mask, s, &dk);
    const std::vector<double> o = mb::to_host_f64(out);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * y[i];
    return l;
  };
  const mb::Tensor qkv = mb::from_host(q, {2, 11, 2, 3, 8});
  mb::Tensor out({2, 11, 2, 8}, DType::kF64), lse({2, 2, 11}, DType::kF64), grad({2, 11, 2, 3, 8}, DType::kF64);
  grad.zero();
  ops::flash_attention_forward(out, lse, qkv, mask, s, &dk);
  ops::flash_attention_backward(grad, dy, qkv, out, lse, mask, s, &dk);
  const std::vector<double> an = mb::to_host_f64(grad);
  int checked = 0;
  for (size_t i = 0; i < q.size(); i += 7) {
    std::vector<double> plus = q, minus = q;
    plus[i] += 1e-6;
    minus[i] -= 1e-6;
    const double fd = (loss(plus) - loss(minus)) / 2e-6;
    EXPECT_NEAR(an[i], fd, 1e-6 * (std::abs(fd) + 1)) << "qkv element " << i;
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

// Flash cross-attention (T5's decoder attending to the encoder) against the f64 CPU
// reference, which is checked against the explicit cross-attention (outputs, gradients,
// dropout masks) and by finite differences. Query and key counts differ and are not
// multiples of the 64-row tiles (fewer keys than queries, and more), head sizes 64 and 128,
// padded encoder positions (batch row 1 entirely padded in one case: output and gradient 0,
// lse +inf), dropout on a tensor-parallel shard. CUDA and f32: refused by name.
TEST_P(OnDevice, FlashCrossAttentionMatchesTheReferenceAndTheExplicitCrossAttention) {
  MB_SKIP_ON_EMULATOR("cuBLASLt, for the explicit attention");
  struct Config {
    int64_t B, Tq, Tk, H, D;
    bool mask, all_padded;
    double p;
  };
  for (const Config c : {Config{2, 37, 50, 2, 64, false, false, 0.0}, Config{1, 130, 70, 2, 64, true, false, 0.0},
                         Config{2, 65, 129, 1, 128, true, true, 0.0}, Config{2, 20, 100, 2, 64, true, false, 0.2},
                         Config{1, 100, 9, 1, 128, false, false, 0.1}}) {
    auto h = harness(17);
    SCOPED_TRACE("B " + std::to_string(c.B) + " Tq " + std::to_string(c.Tq) + " Tk " + std::to_string(c.Tk) + " D " +
                 std::to_string(c.D) + (c.mask ? " masked" : "") + (c.all_padded ? " (a row all padding)" : "") +
                 " p " + std::to_string(c.p));
    const ops::CrossAttentionShape s{c.B, c.Tq, c.Tk, c.H, c.D, 1, c.H + 1};
    const ops::DropoutKey dk{c.p, 59, 6};
    std::vector<uint8_t> mv(static_cast<size_t>(c.B * c.Tk), 1);
    for (int64_t t = c.Tk - 5; t < c.Tk; ++t) mv[static_cast<size_t>(t)] = 0;  // batch row 0's tail padded
    if (c.all_padded)
      for (int64_t t = 0; t < c.Tk; ++t) mv[static_cast<size_t>(c.Tk + t)] = 0;
    const Pair mask = c.mask ? h.bytes(mv, {c.B, c.Tk}) : Pair{};
    const Pair q = h.input({c.B, c.Tq, c.H, c.D}), kv = h.input({c.B, c.Tk, c.H, 2, c.D}), dy = h.input({c.B, c.Tq, c.H, c.D});
    Pair out = h.output({c.B, c.Tq, c.H, c.D}), lse = h.output({c.B, c.H, c.Tq}, DType::kF32);
    if (!ops::flash_attention_supported(h.device(), h.dtype(), c.D)) {  // refused by name
      mb::testing::expect_error(
          [&] { ops::flash_cross_attention_forward(out.dev, lse.dev, q.dev, kv.dev, mask.dev, s, &dk); },
          refusal("flash_cross_attention_forward", "q", h.dtype()));
      continue;
    }
    ops::flash_cross_attention_forward(out.dev, lse.dev, q.dev, kv.dev, mask.dev, s, &dk);
    ops::flash_cross_attention_forward(out.ref, lse.ref, q.ref, kv.ref, mask.ref, s, &dk);
    const double terms = static_cast<double>(c.D + c.Tk);
    h.expect_close(out, terms, "out", 8.0);
    expect_lse_close(lse, terms, c.all_padded ? c.H * c.Tq : 0);
    Pair dq = h.accumulator({c.B, c.Tq, c.H, c.D}), dkv = h.accumulator({c.B, c.Tk, c.H, 2, c.D});
    ops::flash_cross_attention_backward(dq.dev, dkv.dev, dy.dev, q.dev, kv.dev, out.dev, lse.dev, mask.dev, s, &dk);
    ops::flash_cross_attention_backward(dq.ref, dkv.ref, dy.ref, q.ref, kv.ref, out.ref, lse.ref, mask.ref, s, &dk);
    h.expect_close(dq, terms, "dq", 16.0);
    h.expect_close(dkv, static_cast<double>(c.D + c.Tq), "dkv", 16.0);
    // written whole: the device's NaN start must not show
    Pair dq_set = h.output({c.B, c.Tq, c.H, c.D}), dkv_set = h.output({c.B, c.Tk, c.H, 2, c.D});
    ops::flash_cross_attention_backward(dq_set.dev, dkv_set.dev, dy.dev, q.dev, kv.dev, out.dev, lse.dev, mask.dev, s, &dk,
                                        ops::Write::kSet);
    ops::flash_cross_attention_backward(dq_set.ref, dkv_set.ref, dy.ref, q.ref, kv.ref, out.ref, lse.ref, mask.ref, s, &dk,
                                        ops::Write::kSet);
    h.expect_close(dq_set, terms, "dq set", 16.0);
    h.expect_close(dkv_set, static_cast<double>(c.D + c.Tq), "dkv set", 16.0);

    // the reference is the explicit cross-attention (f64, the same dropout draws)
    Pair eout = h.output({c.B, c.Tq, c.H, c.D}), probs = h.output({c.B, c.H, c.Tq, c.Tk});
    ops::cross_attention_forward(eout.ref, probs.ref, q.ref, kv.ref, mask.ref, s, &dk);
    const std::vector<double> fo = mb::to_host_f64(out.ref), eo = mb::to_host_f64(eout.ref);
    for (size_t i = 0; i < fo.size(); ++i) ASSERT_NEAR(fo[i], eo[i], 1e-12 * (std::abs(eo[i]) + 1)) << "out " << i;
    mb::Tensor fq(q.ref.shape(), DType::kF64), fkv(kv.ref.shape(), DType::kF64), eq(q.ref.shape(), DType::kF64),
        ekv(kv.ref.shape(), DType::kF64);
    for (mb::Tensor* t : {&fq, &fkv, &eq, &ekv}) t->zero();
    ops::flash_cross_attention_backward(fq, fkv, dy.ref, q.ref, kv.ref, out.ref, lse.ref, mask.ref, s, &dk);
    ops::cross_attention_backward(eq, ekv, dy.ref, q.ref, kv.ref, probs.ref, mask.ref, s, &dk);
    for (const auto& [name, f, e] : {std::tuple<const char*, mb::Tensor*, mb::Tensor*>{"dq", &fq, &eq}, {"dkv", &fkv, &ekv}}) {
      const std::vector<double> fg = mb::to_host_f64(*f), eg = mb::to_host_f64(*e);
      for (size_t i = 0; i < fg.size(); ++i) ASSERT_NEAR(fg[i], eg[i], 1e-10 * (std::abs(eg[i]) + 1)) << name << " " << i;
    }
  }
}

// The f64 flash backward's position-bias gradient (summed over the batch) against finite
// differences of its forward: L = sum(dy * out), causal, with dropout and padding.
TEST(FlashAttention, BiasGradientMatchesFiniteDifferences) {
  const ops::AttentionShape s{2, 9, 2, 8, true, 0, 0};
  const ops::DropoutKey dk{0.15, 61, 8};
  std::mt19937 g(6);
  std::normal_distribution<double> nd;
  std::vector<double> x(static_cast<size_t>(2 * 9 * 2 * 3 * 8)), y(static_cast<size_t>(2 * 9 * 2 * 8)),
      bv(static_cast<size_t>(2 * 9 * 9));
  for (auto* v : {&x, &y, &bv})
    for (auto& e : *v) e = nd(g);
  std::vector<uint8_t> mv(18, 1);
  mv[8] = mv[7] = 0;
  const mb::Tensor mask = mb::from_host(mv, {2, 9}), dy = mb::from_host(y, {2, 9, 2, 8}), qkv = mb::from_host(x, {2, 9, 2, 3, 8});
  auto loss = [&](const std::vector<double>& b) {
    mb::Tensor out({2, 9, 2, 8}, DType::kF64), lse({2, 2, 9}, DType::kF64);
    ops::flash_attention_forward(out, lse, qkv, mask, s, &dk, mb::from_host(b, {2, 9, 9}));
    const std::vector<double> o = mb::to_host_f64(out);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * y[i];
    return l;
  };
  const mb::Tensor bias = mb::from_host(bv, {2, 9, 9});
  mb::Tensor out({2, 9, 2, 8}, DType::kF64), lse({2, 2, 9}, DType::kF64), grad({2, 9, 2, 3, 8}, DType::kF64),
      dbias({2, 9, 9}, DType::kF64);
  grad.zero();
  dbias.zero();
  ops::flash_attention_forward(out, lse, qkv, mask, s, &dk, bias);
  ops::flash_attention_backward(grad, dy, qkv, out, lse, mask, s, &dk, ops::Write::kAdd, bias, dbias);
  const std::vector<double> an = mb::to_host_f64(dbias);
  int nonzero = 0;
  for (size_t i = 0; i < bv.size(); ++i) {
    std::vector<double> plus = bv, minus = bv;
    plus[i] += 1e-6;
    minus[i] -= 1e-6;
    const double fd = (loss(plus) - loss(minus)) / 2e-6;
    EXPECT_NEAR(an[i], fd, 1e-6 * (std::abs(fd) + 1)) << "bias element " << i;
    nonzero += an[i] != 0.0;
  }
  EXPECT_GT(nonzero, 60) << "the causal half and the padded keys have no gradient; the rest has";
}

// The f64 flash cross-attention backward against finite differences of its forward:
// L = sum(dy * out), with dropout and padded encoder positions.
TEST(FlashAttention, CrossAttentionGradientsMatchFiniteDifferences) {
  const ops::CrossAttentionShape s{2, 5, 7, 2, 8, 0, 0};
  const ops::DropoutKey dk{0.15, 60, 7};
  std::mt19937 g(4);
  std::normal_distribution<double> nd;
  std::vector<double> xq(static_cast<size_t>(2 * 5 * 2 * 8)), xkv(static_cast<size_t>(2 * 7 * 2 * 2 * 8)), y(xq.size());
  for (auto* v : {&xq, &xkv, &y})
    for (auto& x : *v) x = nd(g);
  std::vector<uint8_t> mv(14, 1);
  mv[6] = mv[5] = 0;
  const mb::Tensor mask = mb::from_host(mv, {2, 7}), dy = mb::from_host(y, {2, 5, 2, 8});
  auto loss = [&](const std::vector<double>& a, const std::vector<double>& b) {
    mb::Tensor out({2, 5, 2, 8}, DType::kF64), lse({2, 2, 5}, DType::kF64);
    ops::flash_cross_attention_forward(out, lse, mb::from_host(a, {2, 5, 2, 8}), mb::from_host(b, {2, 7, 2, 2, 8}), mask, s,
                                       &dk);
    const std::vector<double> o = mb::to_host_f64(out);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * y[i];
    return l;
  };
  const mb::Tensor q = mb::from_host(xq, {2, 5, 2, 8}), kv = mb::from_host(xkv, {2, 7, 2, 2, 8});
  mb::Tensor out({2, 5, 2, 8}, DType::kF64), lse({2, 2, 5}, DType::kF64), dq({2, 5, 2, 8}, DType::kF64),
      dkv({2, 7, 2, 2, 8}, DType::kF64);
  dq.zero();
  dkv.zero();
  ops::flash_cross_attention_forward(out, lse, q, kv, mask, s, &dk);
  ops::flash_cross_attention_backward(dq, dkv, dy, q, kv, out, lse, mask, s, &dk);
  const std::vector<double> aq = mb::to_host_f64(dq), akv = mb::to_host_f64(dkv);
  int checked = 0;
  for (size_t i = 0; i < xq.size(); i += 3) {
    std::vector<double> plus = xq, minus = xq;
    plus[i] += 1e-6;
    minus[i] -= 1e-6;
    const double fd = (loss(plus, xkv) - loss(minus, xkv)) / 2e-6;
    EXPECT_NEAR(aq[i], fd, 1e-6 * (std::abs(fd) + 1)) << "q element " << i;
    ++checked;
  }
  for (size_t i = 0; i < xkv.size(); i += 5) {
    std::vector<double> plus = xkv, minus = xkv;
    plus[i] += 1e-6;
    minus[i] -= 1e-6;
    const double fd = (loss(xq, plus) - loss(xq, minus)) / 2e-6;
    EXPECT_NEAR(akv[i], fd, 1e-6 * (std::abs(fd) + 1)) << "kv element " << i;
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

TEST_P(OnDevice, CrossAttentionForwardAndBackward) {
  MB_SKIP_ON_EMULATOR("cuBLASLt");
  auto h = harness(11);
  const ops::CrossAttentionShape s{2, 9, 23, 2, 8, 0, 0};
  const ops::DropoutKey dk{0.1, 56, 3};
  std::vector<uint8_t> mv(2 * 23, 1);
  for (int t = 18; t < 23; ++t) mv[static_cast<size_t>(t)] = 0;
  const Pair mask = h.bytes(mv, {2, 23}), q = h.input({2, 9, 2, 8}), kv = h.input({2, 23, 2, 2, 8}),
             dy = h.input({2, 9, 2, 8});
  Pair out = h.output({2, 9, 2, 8}), probs = h.output({2, 2, 9, 23});
  ops::cross_attention_forward(out.dev, probs.dev, q.dev, kv.dev, mask.dev, s, &dk);
  ops::cross_attention_forward(out.ref, probs.ref, q.ref, kv.ref, mask.ref, s, &dk);
  h.expect_close(probs, 8, "cross probs", 8.0);
  h.expect_close(out, 8 + 23, "cross out", 8.0);
  Pair dq = h.accumulator({2, 9, 2, 8}), dkv = h.accumulator({2, 23, 2, 2, 8});
  ops::cross_attention_backward(dq.dev, dkv.dev, dy.dev, q.dev, kv.dev, probs.dev, mask.dev, s, &dk);
  ops::cross_attention_backward(dq.ref, dkv.ref, dy.ref, q.ref, kv.ref, probs.ref, mask.ref, s, &dk);
  h.expect_close(dq, 8 + 23, "cross dq", 16.0);
  h.expect_close(dkv, 8 + 23, "cross dkv", 16.0);
}

TEST_P(OnDevice, RelativePositionBiasForwardAndBackward) {
  auto h = harness(12);
  const int64_t T = 40, H = 3, NB = 16;
  std::vector<int32_t> bv(static_cast<size_t>(T * T));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) bv[static_cast<size_t>(i * T + j)] = ops::relative_position_bucket(i, j, true, NB, 32);
  const Pair buckets = h.ids(bv, {T, T}), table = h.input({NB, H}), dy = h.input({H, T, T}, 1.0, DType::kF32);
  Pair out = h.output({H, T, T});
  ops::relative_bias_forward(out.dev, table.dev, buckets.dev);
  ops::relative_bias_forward(out.ref, table.ref, buckets.ref);
  h.expect_close(out, 0, "relative bias", 1.0);
  Pair dt = h.accumulator({NB, H}, DType::kF32);
  ops::relative_bias_backward(dt.dev, dy.dev, buckets.dev);
  ops::relative_bias_backward(dt.ref, dy.ref, buckets.ref);
  h.expect_close(dt, T * T, "relative bias backward");
}

// The Philox normal fill (f32 only): the unsharded tensor's draws are philox_normal's in
// double on the host; a shard of either partition dimension, and a distributed optimizer's
// piece of a shard, hold exactly the full tensor's draws at their elements' places. A half
// type is refused by name (a skip here would fail tests/gpu/run.sh, which counts a skipped
// gpu test as one that checked nothing; the emulated program, whose calls skip the public
// op's checks, skips it).
TEST_P(OnDevice, NormalFillOfAnyShardIsTheFullTensorsDraws) {
  auto h = harness(15);
  if (GetParam() != DType::kF32) {
#ifdef MB_TEST_DEVICE_EMULATED  // (the public op's check: the emulated program's calls go to the kernels)
    GTEST_SKIP() << "normal_fill writes f32 only; its refusal of a half type is the public op's, checked in the CPU "
                    "and GPU programs";
#endif
    Pair half = h.output({4, 5});
    mb::testing::expect_error(
        [&] {
          ops::normal_fill(half.dev, 1, ops::ShardLayout{4, 5, 5, -1, 0, 0});
        },
        std::string("normal_fill: out must be f32, got ") + mb::dtype_name(GetParam()));
    return;
  }
  const int64_t R = 38, C = 50;  // 1,900 elements: several blocks, and a partial last one
  const uint64_t key = 0x5eed0f2a11ULL;
  Pair full = h.output({R, C}, DType::kF32);
  std::vector<double> want(static_cast<size_t>(R * C));
  for (size_t i = 0; i < want.size(); ++i) want[i] = mb::philox_normal(key, i);
  full.ref = mb::from_host(want, {R, C});
  ops::normal_fill(full.dev, key, ops::ShardLayout{R, C, C, -1, 0, 0});
  h.expect_close(full, 0, "normal_fill", 1.0);
  const std::vector<double> drawn = mb::to_host_f64(full.dev);
  auto at = [&](int64_t r, int64_t c) { return drawn[static_cast<size_t>(r * C + c)]; };
  for (int dim : {0, 1})
    for (int64_t rank : {0, 1}) {
      const int64_t rows = dim == 0 ? R / 2 : R, cols = dim == 1 ? C / 2 : C;
      const ops::ShardLayout layout{rows, cols, C, dim, rank, 0};
      Pair shard = h.output({rows, cols}, DType::kF32);
      ops::normal_fill(shard.dev, key, layout);
      const std::vector<double> got = mb::to_host_f64(shard.dev);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(got[static_cast<size_t>(r * cols + c)], dim == 0 ? at(rank * rows + r, c) : at(r, rank * cols + c))
              << "partition dim " << dim << ", rank " << rank << ", element (" << r << ", " << c << ")";
      // elements [123, 424) of the shard, as a distributed optimizer's piece
      const int64_t offset = 123, n = 301;
      Pair piece = h.output({n}, DType::kF32);
      ops::normal_fill(piece.dev, key, ops::ShardLayout{rows, cols, C, dim, rank, offset});
      const std::vector<double> part = mb::to_host_f64(piece.dev);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(part[static_cast<size_t>(i)], got[static_cast<size_t>(offset + i)])
            << "piece at offset " << offset << " of partition dim " << dim << ", rank " << rank << ", element " << i;
    }
}

TEST_P(OnDevice, GatherAndScatterRows) {
  auto h = harness(13);
  const std::vector<int32_t> rows = {5, 0, 17, 3, 9};
  const Pair idx = h.ids(rows, {5}), x = h.input({20, 33}), src = h.input({5, 33});
  Pair g = h.output({5, 33}), acc = h.accumulator({20, 33});
  ops::gather_rows(g.dev, x.dev, idx.dev);
  ops::gather_rows(g.ref, x.ref, idx.ref);
  ops::scatter_add_rows(acc.dev, src.dev, idx.dev);
  ops::scatter_add_rows(acc.ref, src.ref, idx.ref);
  h.expect_close(g, 0, "gather", 1.0);
  h.expect_close(acc, 1, "scatter add");
}

TEST_P(OnDevice, ReductionsForLossesAndGradientNorms) {
  auto h = harness(14);
  const int64_t n = 70000;
  const Pair x = h.input({n});
  Pair s = h.accumulator({1}, DType::kF32);
  ops::sum(s.dev, x.dev, true);
  ops::sum(s.ref, x.ref, true);
  h.expect_close(s, 16, "sum");
  Pair s64 = h.accumulator({1}, DType::kF64);  // an f64 result, as the dispatcher allows
  ops::sum(s64.dev, x.dev, true);
  ops::sum(s64.ref, x.ref, true);
  h.expect_close(s64, 16, "sum into f64");
  const Pair terms = h.input({3}, 1.0, DType::kF32);
  Pair w = h.accumulator({3}, DType::kF32);
  ops::weighted_accumulate(w.dev, terms.dev, {0.5, 2.0, 1.0 / 3.0});
  ops::weighted_accumulate(w.ref, terms.ref, {0.5, 2.0, 1.0 / 3.0});
  h.expect_close(w, 1, "weighted accumulate");
  // f64 terms (the noise scale's squared norms) into f64 and f32 slots
  const Pair norms = h.input({2}, 1e3, DType::kF64);
  Pair w64 = h.accumulator({2}, DType::kF64), w32 = h.accumulator({2}, DType::kF32);
  for (Pair* acc : {&w64, &w32}) {
    ops::weighted_accumulate(acc->dev, norms.dev, {0.25, 1.0 / 7.0});
    ops::weighted_accumulate(acc->ref, norms.ref, {0.25, 1.0 / 7.0});
  }
  h.expect_close(w64, 1, "weighted accumulate of f64 terms");
  h.expect_close(w32, 1, "weighted accumulate of f64 terms into f32");
  // per-segment squared norms of an f32 gradient buffer, segments longer than one piece
  const Pair g = h.input({200000}, 0.01, DType::kF32);
  const std::vector<std::pair<size_t, size_t>> segs = {{0, 16}, {16, 16}, {32, 150000}, {150016, 200000}};
  Pair out = h.output({4}, DType::kF64);
  ops::segment_sum_squares(out.dev, g.dev, segs);
  mb::Tensor ref({4}, DType::kF64);
  const auto gv = mb::to_host_f64(g.ref);
  for (size_t k = 0; k < segs.size(); ++k) {
    double acc = 0;
    for (size_t i = segs[k].first; i < segs[k].second; ++i) acc += gv[i] * gv[i];
    ref.data<double>()[k] = acc;
  }
  out.ref = ref;
  h.expect_close(out, 0, "segment sums of squares", 1.0);
  // of what g grew by since `before` (a micro-batch's gradient in the accumulated ones), in
  // one pass that also sets `before` to g: within the segments, and nothing outside them
  const Pair before = h.input({200000}, 0.01, DType::kF32);
  const auto bv = mb::to_host_f64(before.dev);
  Pair grown = h.output({4}, DType::kF64), split = h.output({2}, DType::kF64);
  ops::segment_sum_squares_of_growth(grown.dev, g.dev, before.dev, segs);
  mb::Tensor grown_ref({4}, DType::kF64);
  for (size_t k = 0; k < segs.size(); ++k) {
    double acc = 0;
    for (size_t i = segs[k].first; i < segs[k].second; ++i) acc += (gv[i] - bv[i]) * (gv[i] - bv[i]);
    grown_ref.data<double>()[k] = acc;
  }
  grown.ref = grown_ref;
  h.expect_close(grown, 1, "segment sums of squares of growth", 2.0);  // g - before rounded to f32
  const auto after = mb::to_host_f64(before.dev);
  size_t wrong = 0, i = 0;
  for (size_t k = 0; k <= segs.size(); ++k) {  // the gap before segment k, then segment k
    for (; i < (k < segs.size() ? segs[k].first : after.size()); ++i) wrong += after[i] != bv[i];
    for (; k < segs.size() && i < segs[k].second; ++i) wrong += after[i] != gv[i];
  }
  EXPECT_EQ(wrong, 0u) << "before = g within the segments, untouched outside them";
#ifndef MB_TEST_DEVICE_EMULATED  // (the public op's check: the emulated program's calls go to the kernels)
  EXPECT_THROW(ops::segment_sum_squares_of_growth(grown.dev, g.dev, g.dev, segs), std::exception) << "prev is x";
#endif
  // split in two as the trainer splits a gradient norm (TP-sharded, replicated): nothing
  // grew since `before` became g; then g's own squares
  ops::split_sum_squares_of_growth(split.dev, g.dev, before.dev, {segs[2]}, {segs[0], segs[3]});
  EXPECT_EQ(mb::to_host_f64(split.dev), (std::vector<double>{0.0, 0.0}));
  ops::scale(before.dev, 0.0f);
  ops::split_sum_squares_of_growth(split.dev, g.dev, before.dev, {segs[2]}, {segs[0], segs[3]});
  mb::Tensor split_ref({2}, DType::kF64);
  split_ref.data<double>()[0] = ref.data<double>()[2];
  split_ref.data<double>()[1] = ref.data<double>()[0] + ref.data<double>()[3];
  split.ref = split_ref;
  h.expect_close(split, 0, "split sums of squares of growth from zero", 1.0);
}

INSTANTIATE_TEST_SUITE_P(MB_TEST_DEVICE_NAME, OnDevice, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16), dtype_param_name);
