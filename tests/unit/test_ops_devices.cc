// Every op of the op API on one device (the CPU in test_ops_cpu, the GPU in test_ops_gpu,
// label gpu) in f32, bf16 and f16, against the CPU reference in f64 on the same inputs
// (ggml's test-backend-ops shape): one test body per op, tolerances from the dtype's unit
// roundoff and the length of the f32 accumulations (op_harness.h). On the CPU the half
// types are the emulation (stored rounded, computed in f32); on a GPU these are the CUDA
// kernels. test_ops_emulated runs the CUDA kernels on the CPU's warp emulator
// (tests/emulator/emulated_ops.h), all but cuBLASLt's. Gradients are checked by
// finite differences in test_ops.cc, on the reference. The attention ops' tests are
// test_attention_devices.cc's, in the same programs; this file instantiates both files' tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/ops/activation.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/gather.h"
#include "core/ops/gradients.h"
#include "core/ops/layernorm.h"
#include "core/ops/matmul.h"
#include "core/ops/random.h"
#include "core/ops/reduce.h"
#include "core/ops/residual.h"
#include "core/ops/rotary.h"
#include "core/util/philox.h"
#include "tests/unit/op_harness.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
namespace ops = mb::testing::device_ops;  // on the warp emulator in test_ops_emulated
using mb::DType;
using mb::testing::OnDevice;
using mb::testing::Pair;

namespace {

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
  // SwiGLU: (n - 1) / 2 (gate, up) pairs of x in rows of 6; the backward written whole (set)
  const int64_t pairs = (n - 1) / 2 / 3 * 3;
  Pair sw = h.output({pairs / 3, 3}), dsw = h.output({pairs / 3, 6});
  ops::swiglu_forward(sw.dev, x.dev.flat(0, static_cast<size_t>(2 * pairs)).view({pairs / 3, 6}));
  ops::swiglu_forward(sw.ref, x.ref.flat(0, static_cast<size_t>(2 * pairs)).view({pairs / 3, 6}));
  h.expect_close(sw, 8, "swiglu");
  ops::swiglu_backward(dsw.dev, g.dev.flat(0, static_cast<size_t>(pairs)).view({pairs / 3, 3}),
                       x.dev.flat(0, static_cast<size_t>(2 * pairs)).view({pairs / 3, 6}));
  ops::swiglu_backward(dsw.ref, g.ref.flat(0, static_cast<size_t>(pairs)).view({pairs / 3, 3}),
                       x.ref.flat(0, static_cast<size_t>(2 * pairs)).view({pairs / 3, 6}));
  h.expect_close(dsw, 16, "swiglu backward");
  // squared ReLU, and its backward written whole (set)
  Pair sq = h.output({n}), dsq = h.output({n});
  ops::squared_relu_forward(sq.dev, x.dev);
  ops::squared_relu_forward(sq.ref, x.ref);
  h.expect_close(sq, 2, "squared relu");
  ops::squared_relu_backward(dsq.dev, g.dev, x.dev);
  ops::squared_relu_backward(dsq.ref, g.ref, x.ref);
  h.expect_close(dsq, 2, "squared relu backward");
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

// RoPE in place on a QKV output of 3 sequences of 37 positions, 4 heads of dim 64 (the first 48
// channels turned) and base 10000: the turned values and, turned back, the gradient; each is a
// few roundings of the dtype from the CPU's (cos and sin of fp32 angles on both sides). Also
// interleaved, and on grouped-query attention's layout.
TEST_P(OnDevice, RotaryPositionsTurnQueriesAndKeysAsTheCpuDoes) {
  auto h = harness(4);
  // rope on the device and the CPU from the same input: forward, and backward of the forward
  auto expect_turn = [&](const ops::RotaryShape& s, int64_t width, const std::string& what) {
    const int64_t rows = 3 * 37;
    const Pair x = h.input({rows, width}, 2.0);
    Pair y = h.output({rows, width});
    mb::copy(y.dev, x.dev);
    mb::copy(y.ref, x.ref);
    ops::rope_forward(y.dev, s);
    ops::rope_forward(y.ref, s);
    h.expect_close(y, 4, what + " forward");
    ops::rope_backward(y.dev, s);
    ops::rope_backward(y.ref, s);
    h.expect_close(y, 8, what + " backward of the forward (the input again)");
  };
  expect_turn(ops::RotaryShape{37, 4, 64, 48, 10000.0}, 3 * 4 * 64, "rope");
  expect_turn(ops::RotaryShape{37, 4, 64, 48, 10000.0, true, 0.5}, 3 * 4 * 64, "interleaved rope, positions halved");
  // grouped-query attention's layout: 8 heads in 2 groups of [4 queries, a key, a value]
  expect_turn(ops::RotaryShape{37, 8, 64, 48, 10000.0, false, 1.0, 2}, (8 + 2 * 2) * 64, "grouped rope");
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
    Pair half_out = h.output({4, 5});
    mb::testing::expect_error(
        [&] {
          ops::normal_fill(half_out.dev, 1, ops::ShardLayout{4, 5, 5, -1, 0, 0});
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
  // scatter (=): the rows named take src's, exactly; the others keep theirs (the reference is
  // checked against that formula too)
  Pair set = h.accumulator({20, 33});
  const std::vector<double> before = mb::to_host_f64(set.ref), from = mb::to_host_f64(src.ref);
  ops::scatter_rows(set.dev, src.dev, idx.dev);
  ops::scatter_rows(set.ref, src.ref, idx.ref);
  h.expect_close(set, 0, "scatter", 0.0);
  const std::vector<double> after = mb::to_host_f64(set.ref);
  for (size_t row = 0; row < 20; ++row) {
    const auto at = std::find(rows.begin(), rows.end(), static_cast<int32_t>(row));
    for (size_t c = 0; c < 33; ++c)
      ASSERT_EQ(after[row * 33 + c],
                at == rows.end() ? before[row * 33 + c] : from[static_cast<size_t>(at - rows.begin()) * 33 + c])
          << "row " << row << " column " << c;
  }
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
