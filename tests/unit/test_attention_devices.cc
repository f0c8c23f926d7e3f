// The attention ops on one device, in the same three programs as test_ops_devices.cc (which
// instantiates these tests too, in f32, bf16 and f16): the explicit self- and cross-attention,
// the flash kernels (self and cross; the ordered dQ and 32 query rows a warp on a GPU) and
// T5's relative position bias, each against the f64 CPU reference, with tolerances from the
// dtype (op_harness.h). The f64 flash backward is checked by finite differences here too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/dropout.h"
#include "core/ops/flash_attention.h"
#include "core/ops/relative_position.h"
#include "tests/unit/op_harness.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
namespace ops = mb::testing::device_ops;  // on the warp emulator in test_ops_emulated
using mb::DType;
using mb::testing::OnDevice;
using mb::testing::Pair;

// Sets the process's dQ path back to what it was at its creation, at its end.
struct RestoreFlashDq {
  ops::FlashDq was = ops::flash_dq();
  ~RestoreFlashDq() { ops::set_flash_dq(was); }
};

struct AttnConfig {
  int64_t B, T, H, D;
  bool causal, mask, bias;
  double p;
};

TEST_P(OnDevice, SelfAttentionForwardAndBackward) {
  MB_SKIP_ON_EMULATOR("cuBLASLt");
  for (const AttnConfig c :
       {AttnConfig{2, 37, 3, 16, true, false, false, 0.0}, AttnConfig{3, 20, 2, 8, false, true, true, 0.0},
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
  return t == DType::kF32
             ? op + ": " + arg + " is f32, which the CUDA kernels do not take"
             : op + ": " + mb::testing::test_device().str() + " runs the flash kernels in fp16 at head size 64 only";
}

// Flash attention against the f64 CPU reference (each row in f64), which is itself checked
// against the explicit attention (the same outputs, dropout masks included) and by finite
// differences. Head sizes 64 and 128, sequences that are not multiples of the 64-row tiles,
// causal and not, padding (batch row 1 entirely padded in one case: output and gradient 0,
// lse +inf), dropout on a tensor-parallel shard (lengths that are multiples of 4, whose Philox
// blocks the GPU's lanes share, and not), T5's position bias (causal and not, with its
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
  for (const Config c :
       {Config{2, 37, 2, 64, true, false, false, 0.0, false}, Config{1, 130, 2, 64, true, true, false, 0.0, false},
        Config{2, 100, 1, 128, false, true, true, 0.0, false}, Config{2, 70, 2, 64, true, true, false, 0.2, false},
        Config{1, 65, 1, 128, true, false, false, 0.1, false}, Config{3, 72, 2, 64, false, true, false, 0.1, true},
        Config{2, 130, 1, 128, true, false, false, 0.0, true}, Config{2, 132, 1, 128, true, true, false, 0.1, false}}) {
    auto h = harness(13);
    SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " D " + std::to_string(c.D) +
                 (c.causal ? " causal" : "") + (c.mask ? " masked" : "") +
                 (c.all_padded ? " (a row all padding)" : "") + " p " + std::to_string(c.p) + (c.bias ? " bias" : ""));
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
    if (!ops::flash_attention_supported(h.device(), h.dtype(), c.D)) {                        // refused by name
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
    ops::flash_attention_backward(dqkv.dev, dy.dev, qkv.dev, out.dev, lse.dev, mask.dev, s, &dk, ops::Write::kAdd,
                                  bias.dev, dbias.dev);
    ops::flash_attention_backward(dqkv.ref, dy.ref, qkv.ref, out.ref, lse.ref, mask.ref, s, &dk, ops::Write::kAdd,
                                  bias.ref, dbias.ref);
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
    mb::Tensor flash_grad = mb::Tensor(qkv.ref.shape(), DType::kF64),
               explicit_grad = mb::Tensor(qkv.ref.shape(), DType::kF64);
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

// Documents packed in a row (attention.h's documents; Megatron's --reset-attention-mask) each
// attend as if they were alone. The reference runs every document of every row on its own (a
// batch of one row of its length) through the f64 explicit attention, which is given no
// documents. Against it: the f64 explicit and flash attention given the row's documents, to
// f64 precision; the device's explicit attention (not on the warp emulator: cuBLASLt) and its
// flash kernels (where they take the dtype; with the ordered dQ too on a GPU that has it), to
// the dtype's tolerance. Causal and not, head sizes 64 and 128, documents that end inside a
// tile and across tiles, one of a single token, a padded tail; no dropout (its draws are keyed
// by the place in the whole row).
TEST_P(OnDevice, PackedDocumentsAttendAsIfEachWereAlone) {
#ifdef MB_TEST_DEVICE_EMULATED
  if (!ops::flash_attention_supported(mb::testing::test_device(), GetParam(), 64))
    GTEST_SKIP() << "the warp emulator runs only the flash kernels here, which take no " << mb::dtype_name(GetParam());
#endif
  const RestoreFlashDq restore;
  struct Config {
    int64_t B, T, H, D;
    bool causal, mask;
  };
  for (const Config& c :
       {Config{2, 150, 2, 64, true, false}, Config{1, 130, 1, 128, true, true}, Config{2, 100, 2, 64, false, false}}) {
    auto h = harness(19);
    SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " D " + std::to_string(c.D) +
                 (c.causal ? " causal" : "") + (c.mask ? " masked" : ""));
    const ops::AttentionShape s{c.B, c.T, c.H, c.D, c.causal, 0, 0};
    const std::vector<int32_t> dv = mb::testing::packed_documents(c.B, c.T);
    const Pair docs = h.ids(dv, {c.B, c.T});
    std::vector<uint8_t> mv(static_cast<size_t>(c.B * c.T), 1);
    for (int64_t t = c.T - 9; t < c.T; ++t) mv[static_cast<size_t>(t)] = 0;  // batch row 0's tail padded
    const Pair mask = c.mask ? h.bytes(mv, {c.B, c.T}) : Pair{};
    const std::vector<int64_t> qkv_shape{c.B, c.T, c.H, 3, c.D}, out_shape{c.B, c.T, c.H, c.D};
    const Pair qkv = h.input(qkv_shape), dy = h.input(out_shape);

    // the reference: each document alone
    const std::vector<double> x = mb::to_host_f64(qkv.ref), g = mb::to_host_f64(dy.ref);
    const int64_t w = c.H * 3 * c.D, o = c.H * c.D;  // elements a token of qkv, of out
    std::vector<double> want_out(static_cast<size_t>(c.B * c.T * o)), want_grad(x.size(), 0.0);
    int64_t documents = 0;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t0 = 0, t1 = 1; t0 < c.T; t0 = t1++) {
        while (t1 < c.T && dv[static_cast<size_t>(b * c.T + t1)] == dv[static_cast<size_t>(b * c.T + t0)]) ++t1;
        const int64_t n = t1 - t0, at = b * c.T + t0;
        ++documents;
        auto slice = [](const std::vector<double>& v, int64_t from, int64_t count) {
          return std::vector<double>(v.begin() + from, v.begin() + from + count);
        };
        const mb::Tensor q = mb::from_host(slice(x, at * w, n * w), {1, n, c.H, 3, c.D}),
                         d = mb::from_host(slice(g, at * o, n * o), {1, n, c.H, c.D});
        const mb::Tensor m =
            c.mask ? mb::from_host(std::vector<uint8_t>(mv.begin() + at, mv.begin() + at + n), {1, n}) : mb::Tensor();
        const ops::AttentionShape one{1, n, c.H, c.D, c.causal, 0, 0};
        mb::Tensor out({1, n, c.H, c.D}, DType::kF64), probs({1, c.H, n, n}, DType::kF64), grad(q.shape(), DType::kF64);
        grad.zero();
        ops::attention_forward(out, probs, q, m, one, nullptr);
        ops::attention_backward(grad, d, q, probs, m, one, nullptr);
        const std::vector<double> ov = mb::to_host_f64(out), gv = mb::to_host_f64(grad);
        std::copy(ov.begin(), ov.end(), want_out.begin() + at * o);
        std::copy(gv.begin(), gv.end(), want_grad.begin() + at * w);
      }
    ASSERT_EQ(documents, 5 * c.B) << "each row holds the five documents packed_documents makes";
    if (c.B == 2 && h.device().is_cpu()) {  // ids that go down along a row: refused where the host reads them
      std::vector<int32_t> down = dv;
      down[static_cast<size_t>(c.T + 40)] = 0;  // row 1, position 40: back to its first document
      const Pair bad = h.ids(down, {c.B, c.T});
      mb::Tensor out(out_shape, DType::kF64), lse({c.B, c.H, c.T}, DType::kF64);
      mb::testing::expect_error(
          [&] { ops::flash_attention_forward(out, lse, qkv.ref, mask.ref, s, nullptr, {}, bad.ref); },
          "flash_attention_forward: documents of row 1 go from 1 to 0 at position 40; a document is a run of "
          "positions, its ids nondecreasing along a row");
    }
    auto expect_equal_f64 = [](const mb::Tensor& got, const std::vector<double>& want, const std::string& what) {
      const std::vector<double> v = mb::to_host_f64(got);
      ASSERT_EQ(v.size(), want.size());
      for (size_t i = 0; i < v.size(); ++i)
        ASSERT_NEAR(v[i], want[i], 1e-10 * (std::abs(want[i]) + 1)) << what << " " << i;
    };
    const double terms = static_cast<double>(c.D + c.T);

    {  // the f64 explicit and flash attention, given the documents
      mb::Tensor out(out_shape, DType::kF64), probs({c.B, c.H, c.T, c.T}, DType::kF64), grad(qkv_shape, DType::kF64);
      grad.zero();
      ops::attention_forward(out, probs, qkv.ref, mask.ref, s, nullptr, {}, docs.ref);
      ops::attention_backward(grad, dy.ref, qkv.ref, probs, mask.ref, s, nullptr);
      expect_equal_f64(out, want_out, "explicit out (f64)");
      expect_equal_f64(grad, want_grad, "explicit dqkv (f64)");
      mb::Tensor fout(out_shape, DType::kF64), lse({c.B, c.H, c.T}, DType::kF64), fgrad(qkv_shape, DType::kF64);
      ops::flash_attention_forward(fout, lse, qkv.ref, mask.ref, s, nullptr, {}, docs.ref);
      ops::flash_attention_backward(fgrad, dy.ref, qkv.ref, fout, lse, mask.ref, s, nullptr, ops::Write::kSet, {}, {},
                                    docs.ref);
      expect_equal_f64(fout, want_out, "flash out (f64)");
      expect_equal_f64(fgrad, want_grad, "flash dqkv (f64)");
    }
#ifndef MB_TEST_DEVICE_EMULATED
    {  // the device's explicit attention
      Pair out = h.output(out_shape), probs = h.output({c.B, c.H, c.T, c.T}), dqkv = h.accumulator(qkv_shape);
      ops::attention_forward(out.dev, probs.dev, qkv.dev, mask.dev, s, nullptr, {}, docs.dev);
      out.ref = mb::from_host(want_out, out_shape);
      h.expect_close(out, terms, "explicit out", 8.0);
      ops::attention_backward(dqkv.dev, dy.dev, qkv.dev, probs.dev, mask.dev, s, nullptr);
      std::vector<double> start = mb::to_host_f64(dqkv.ref);
      for (size_t i = 0; i < start.size(); ++i) start[i] += want_grad[i];
      dqkv.ref = mb::from_host(start, qkv_shape);
      h.expect_close(dqkv, terms, "explicit dqkv", 16.0);
    }
#endif
    if (!ops::flash_attention_supported(h.device(), h.dtype(), c.D)) continue;  // (its refusal: tested above)
    std::vector<ops::FlashDq> dq_ways{ops::FlashDq::kSeparate};
    if (ops::flash_dq_ordered_supported(h.device())) dq_ways.push_back(ops::FlashDq::kOrdered);
    for (const ops::FlashDq way : dq_ways) {  // the device's flash kernels
      SCOPED_TRACE(way == ops::FlashDq::kOrdered ? "ordered dQ" : "separate dQ");
      ops::set_flash_dq(way);
      Pair out = h.output(out_shape), lse = h.output({c.B, c.H, c.T}, DType::kF32), dqkv = h.output(qkv_shape);
      ops::flash_attention_forward(out.dev, lse.dev, qkv.dev, mask.dev, s, nullptr, {}, docs.dev);
      out.ref = mb::from_host(want_out, out_shape);
      h.expect_close(out, terms, "flash out", 8.0);
      ops::flash_attention_backward(dqkv.dev, dy.dev, qkv.dev, out.dev, lse.dev, mask.dev, s, nullptr, ops::Write::kSet,
                                    {}, {}, docs.dev);
      dqkv.ref = mb::from_host(want_grad, qkv_shape);
      h.expect_close(dqkv, terms, "flash dqkv", 16.0);
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
  const RestoreFlashDq restore;
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
    for (int64_t t = std::max<int64_t>(0, c.T - 70); t < c.T; ++t)
      mv[static_cast<size_t>(t)] = 0;  // batch row 0's last 70 keys padded
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
      ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0)
          << "run again, element " << i << ": " << a[i] << " then " << b[i];
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
        std::tuple{64, 257, true, true, 0.1}, std::tuple{64, 132, false, false, 0.2},
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

// ---- grouped-query attention ------------------------------------------------------------
// H query heads reading G key/value heads, in place from Megatron's grouped layout (attention.h:
// qkv (B, T, G, H/G + 2, D)). The reference is the f64 per-head attention, itself checked above,
// on a copy of qkv with each group's key and value repeated for its heads, which is what grouped-
// query attention means; the gradient of the grouped qkv is that copy's gradient with each key's
// and value's summed over its group (the queries' as they are).
struct GroupedCase {
  int64_t B, T, H, G, D;
  bool causal, mask;
  double p;
  std::string name() const {
    return "B " + std::to_string(B) + " T " + std::to_string(T) + " H " + std::to_string(H) + " G " +
           std::to_string(G) + " D " + std::to_string(D) + (causal ? " causal" : "") + (mask ? " masked" : "") + " p " +
           std::to_string(p);
  }
};

// Element d of query head h's query (which 0), key (1) or value (2) of token i, in the grouped
// layout and in the per-head one.
static size_t grouped_at(const GroupedCase& c, int64_t i, int64_t h, int64_t which, int64_t d) {
  const int64_t r = c.H / c.G, slot = which == 0 ? h % r : r + which - 1;
  return static_cast<size_t>(((i * c.G + h / r) * (r + 2) + slot) * c.D + d);
}
static size_t per_head_at(const GroupedCase& c, int64_t i, int64_t h, int64_t which, int64_t d) {
  return static_cast<size_t>(((i * c.H + h) * 3 + which) * c.D + d);
}

// qkv's per-head copy (f64), and a per-head gradient taken back to the grouped layout (f64)
static mb::Tensor per_head_copy(const GroupedCase& c, const mb::Tensor& grouped) {
  const std::vector<double> x = mb::to_host_f64(grouped);
  std::vector<double> y(static_cast<size_t>(c.B * c.T * c.H * 3 * c.D));
  for (int64_t i = 0; i < c.B * c.T; ++i)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t which = 0; which < 3; ++which)
        for (int64_t d = 0; d < c.D; ++d) y[per_head_at(c, i, h, which, d)] = x[grouped_at(c, i, h, which, d)];
  return mb::from_host(y, {c.B, c.T, c.H, 3, c.D});
}
static std::vector<double> grouped_sum(const GroupedCase& c, const mb::Tensor& per_head) {
  const std::vector<double> g = mb::to_host_f64(per_head);
  std::vector<double> y(static_cast<size_t>(c.B * c.T * (c.H + 2 * c.G) * c.D), 0.0);
  for (int64_t i = 0; i < c.B * c.T; ++i)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t which = 0; which < 3; ++which)
        for (int64_t d = 0; d < c.D; ++d) y[grouped_at(c, i, h, which, d)] += g[per_head_at(c, i, h, which, d)];
  return y;
}

// ref += the per-head reference's gradient, grouped (ref: an f64 tensor of the grouped shape)
static void add_grouped(const GroupedCase& c, mb::Tensor& ref, const mb::Tensor& per_head_grad) {
  std::vector<double> v = mb::to_host_f64(ref);
  const std::vector<double> add = grouped_sum(c, per_head_grad);
  for (size_t e = 0; e < v.size(); ++e) v[e] += add[e];
  ref = mb::from_host(v, ref.shape());
}

// A case's shapes (grouped, and per head for the reference), dropout, mask (batch row 0's
// last 9 keys padded), inputs, and the reference's per-head copy of qkv.
struct GroupedInputs {
  ops::AttentionShape grouped, heads;
  ops::DropoutKey dk;
  Pair mask, qkv, dy;
  mb::Tensor expanded;
  GroupedInputs(mb::testing::OpHarness& h, const GroupedCase& c)
      : grouped{c.B, c.T, c.H, c.D, c.causal, 1, c.H + 1, c.G},
        heads{c.B, c.T, c.H, c.D, c.causal, 1, c.H + 1},
        dk{c.p, 63, 2},
        qkv(h.input({c.B, c.T, c.G, c.H / c.G + 2, c.D})),
        dy(h.input({c.B, c.T, c.H, c.D})),
        expanded(per_head_copy(c, qkv.ref)) {
    std::vector<uint8_t> mv(static_cast<size_t>(c.B * c.T), 1);
    for (int64_t t = c.T - 9; t < c.T; ++t) mv[static_cast<size_t>(t)] = 0;
    if (c.mask) mask = h.bytes(mv, {c.B, c.T});
  }
};

static const GroupedCase kGroupedCases[] = {{2, 70, 4, 2, 64, true, true, 0.0},    // 2 groups of 2 heads
                                            {1, 130, 3, 1, 64, false, true, 0.1},  // multi-query, dropout
                                            {2, 37, 4, 1, 128, true, false, 0.2},
                                            {1, 65, 6, 3, 64, false, false, 0.0}};

// The explicit attention: outputs and probabilities, and the gradient (accumulated into a
// random start) against the per-head reference; a group count that does not divide the heads
// is refused.
TEST_P(OnDevice, ExplicitAttentionReadsGroupedQueryAttentionsLayoutInPlace) {
  MB_SKIP_ON_EMULATOR("cuBLASLt");
  for (const GroupedCase& c : kGroupedCases) {
    auto h = harness(21);
    SCOPED_TRACE(c.name());
    const GroupedInputs in(h, c);
    const auto& [grouped, heads, dk, mask, qkv, dy, expanded] = in;
    Pair out = h.output({c.B, c.T, c.H, c.D}), probs = h.output({c.B, c.H, c.T, c.T});
    ops::attention_forward(out.dev, probs.dev, qkv.dev, mask.dev, grouped, &dk);
    ops::attention_forward(out.ref, probs.ref, expanded, mask.ref, heads, &dk);
    const double terms = static_cast<double>(c.D + c.T);
    h.expect_close(probs, static_cast<double>(c.D), "probs", 8.0);
    h.expect_close(out, terms, "out", 8.0);
    Pair dqkv = h.accumulator({c.B, c.T, c.G, c.H / c.G + 2, c.D});
    ops::attention_backward(dqkv.dev, dy.dev, qkv.dev, probs.dev, mask.dev, grouped, &dk);
    mb::Tensor per_head_grad({c.B, c.T, c.H, 3, c.D}, DType::kF64);
    per_head_grad.zero();
    ops::attention_backward(per_head_grad, dy.ref, expanded, probs.ref, mask.ref, heads, &dk);
    add_grouped(c, dqkv.ref, per_head_grad);
    h.expect_close(dqkv, terms * static_cast<double>(c.H / c.G), "dqkv", 16.0);
  }
  auto h = harness(22);
  const Pair qkv = h.input({1, 5, 3 + 2 * 2, 8});
  Pair out = h.output({1, 5, 3, 8}), probs = h.output({1, 3, 5, 5});
  mb::testing::expect_error(
      [&] {
        ops::attention_forward(out.dev, probs.dev, qkv.dev, Pair{}.dev, ops::AttentionShape{1, 5, 3, 8, true, 0, 0, 2},
                               nullptr);
      },
      "attention_forward: 2 key/value groups do not divide 3 heads");
}

// The flash kernels: out and lse; the gradient added (separate dQ, and on a GPU of sm_80 code
// the ordered dQ too) and set (the device's NaN start must not show), against the per-head
// reference.
TEST_P(OnDevice, FlashAttentionReadsGroupedQueryAttentionsLayoutInPlace) {
  const RestoreFlashDq restore;
  int ran = 0;
  for (const GroupedCase& c : kGroupedCases) {
    auto h = harness(23);
    SCOPED_TRACE(c.name());
    if (!ops::flash_attention_supported(h.device(), h.dtype(), c.D)) continue;  // (refusals: tested above)
    ++ran;
    const GroupedInputs in(h, c);
    const auto& [grouped, heads, dk, mask, qkv, dy, expanded] = in;
    Pair out = h.output({c.B, c.T, c.H, c.D}), lse = h.output({c.B, c.H, c.T}, DType::kF32);
    ops::flash_attention_forward(out.dev, lse.dev, qkv.dev, mask.dev, grouped, &dk);
    ops::flash_attention_forward(out.ref, lse.ref, expanded, mask.ref, heads, &dk);
    const double terms = static_cast<double>(c.D + c.T), grad_terms = terms * static_cast<double>(c.H / c.G);
    h.expect_close(out, terms, "out", 8.0);
    expect_lse_close(lse, terms, 0);
    mb::Tensor per_head_grad({c.B, c.T, c.H, 3, c.D}, DType::kF64);
    per_head_grad.zero();
    ops::flash_attention_backward(per_head_grad, dy.ref, expanded, out.ref, lse.ref, mask.ref, heads, &dk);
    std::vector<ops::FlashDq> ways{ops::FlashDq::kSeparate};
    if (h.device().is_cuda() && ops::flash_dq_ordered_supported(h.device())) ways.push_back(ops::FlashDq::kOrdered);
    for (const ops::FlashDq way : ways) {
      SCOPED_TRACE(way == ops::FlashDq::kOrdered ? "ordered dQ" : "separate dQ");
      ops::set_flash_dq(way);
      const int64_t calls = ops::flash_dq_ordered_calls();
      Pair dqkv = h.accumulator({c.B, c.T, c.G, c.H / c.G + 2, c.D});
      ops::flash_attention_backward(dqkv.dev, dy.dev, qkv.dev, out.dev, lse.dev, mask.dev, grouped, &dk,
                                    ops::Write::kAdd);
      add_grouped(c, dqkv.ref, per_head_grad);
      h.expect_close(dqkv, grad_terms, "dqkv (add)", 16.0);
      Pair dqkv_set = h.output({c.B, c.T, c.G, c.H / c.G + 2, c.D});
      ops::flash_attention_backward(dqkv_set.dev, dy.dev, qkv.dev, out.dev, lse.dev, mask.dev, grouped, &dk,
                                    ops::Write::kSet);
      add_grouped(c, dqkv_set.ref, per_head_grad);
      h.expect_close(dqkv_set, grad_terms, "dqkv (set)", 16.0);
      if (way == ops::FlashDq::kOrdered) {
        EXPECT_EQ(ops::flash_dq_ordered_calls(), calls + 2) << "the backward did not take the ordered path";
      }
    }
  }
  if (ran == 0) {
    GTEST_SKIP() << mb::testing::test_device().str() << " runs no flash kernel in " << mb::dtype_name(GetParam())
                 << " (FlashAttentionMatchesTheReference... checks the refusal)";
  }
}

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
    const Pair q = h.input({c.B, c.Tq, c.H, c.D}), kv = h.input({c.B, c.Tk, c.H, 2, c.D}),
               dy = h.input({c.B, c.Tq, c.H, c.D});
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
    ops::flash_cross_attention_backward(dq_set.dev, dkv_set.dev, dy.dev, q.dev, kv.dev, out.dev, lse.dev, mask.dev, s,
                                        &dk, ops::Write::kSet);
    ops::flash_cross_attention_backward(dq_set.ref, dkv_set.ref, dy.ref, q.ref, kv.ref, out.ref, lse.ref, mask.ref, s,
                                        &dk, ops::Write::kSet);
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
    for (const auto& [name, f, e] :
         {std::tuple<const char*, mb::Tensor*, mb::Tensor*>{"dq", &fq, &eq}, {"dkv", &fkv, &ekv}}) {
      const std::vector<double> fg = mb::to_host_f64(*f), eg = mb::to_host_f64(*e);
      for (size_t i = 0; i < fg.size(); ++i)
        ASSERT_NEAR(fg[i], eg[i], 1e-10 * (std::abs(eg[i]) + 1)) << name << " " << i;
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
  const mb::Tensor mask = mb::from_host(mv, {2, 9}), dy = mb::from_host(y, {2, 9, 2, 8}),
                   qkv = mb::from_host(x, {2, 9, 2, 3, 8});
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
    ops::flash_cross_attention_forward(out, lse, mb::from_host(a, {2, 5, 2, 8}), mb::from_host(b, {2, 7, 2, 2, 8}),
                                       mask, s, &dk);
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
    for (int64_t j = 0; j < T; ++j)
      bv[static_cast<size_t>(i * T + j)] = ops::relative_position_bucket(i, j, true, NB, 32);
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
