// The flash attention kernels (core/ops/cuda/flash_attention*.cu), compiled as C++ and run
// thread by thread on the warp emulator (warp_emulator.h), against the f64 CPU reference:
// what the kernels compute, and that the ordered dQ's turns give the same bits whatever
// order the blocks and threads run in, how many blocks run at once, and when the
// asynchronous copies land. The GPU runs the same kernels in the gpu label
// (test_attention_devices.cc); this runs where there is none. First, that the emulator
// itself finds what it says it finds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/ops/cuda/flash_attention.cuh"
#include "core/ops/flash_attention.h"
#include "tests/emulator/warp_emulator.h"
#include "tests/unit/op_harness.h"

namespace mb = megabatch;
namespace ops = megabatch::ops;
namespace emu = megabatch::emu;
using mb::DType;
using mb::testing::OpHarness;
using mb::testing::Pair;

namespace {

// Sets the emulator's options for a scope.
struct WithOptions {
  explicit WithOptions(const emu::Options& o) : was(emu::options()) { emu::set_options(o); }
  ~WithOptions() { emu::set_options(was); }
  emu::Options was;
};

struct WithForwardRows {
  explicit WithForwardRows(ops::FlashForwardRows rows) : was(ops::flash_forward_rows()) { ops::set_flash_forward_rows(rows); }
  ~WithForwardRows() { ops::set_flash_forward_rows(was); }
  ops::FlashForwardRows was;
};

struct WithFlashDq {
  explicit WithFlashDq(ops::FlashDq how) : was(ops::flash_dq()) { ops::set_flash_dq(how); }
  ~WithFlashDq() { ops::set_flash_dq(was); }
  ops::FlashDq was;
};

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one saying \"" << part << "\"";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

std::string options_name(const emu::Options& o) {
  return "resident " + std::to_string(o.resident) + ", seed " + std::to_string(o.seed) +
         (o.copies == emu::Copies::kEager ? ", eager copies" : ", deferred copies");
}

std::vector<uint16_t> bits_of(const mb::Tensor& t) {
  std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.raw(), v.size() * sizeof(uint16_t));
  return v;
}

}  // namespace

// ---- the emulator ---------------------------------------------------------------------

// A 16 x 64 by 64 x 16 product through the flash kernels' fragment loads (load_a, load_b:
// ldmatrix) and mma.sync, as a warp computes S = Q K^T, against the plain product; and the
// transposing load (load_b_trans) as P V takes V.
TEST(WarpEmulator, FragmentLoadsAndMmaGiveTheMatrixProduct) {
  using T = __nv_bfloat16;
  constexpr int K = 64, RS = K + 8;
  std::vector<T> a(16 * RS), b(16 * RS), v(K * 24);  // a, b: 16 rows of K; v: K rows of 16 (+8)
  std::vector<float> af(16 * K), bf(16 * K), vf(K * 16);
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < K; ++k) {
      af[i * K + k] = static_cast<float>((i * 7 + k * 3) % 11 - 5) / 4.0f;
      bf[i * K + k] = static_cast<float>((i * 5 + k) % 13 - 6) / 8.0f;
      a[i * RS + k] = __float2bfloat16_rn(af[i * K + k]);
      b[i * RS + k] = __float2bfloat16_rn(bf[i * K + k]);
    }
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < 16; ++n) {
      vf[k * 16 + n] = static_cast<float>((k * 3 + n * 5) % 9 - 4) / 2.0f;
      v[k * 24 + n] = __float2bfloat16_rn(vf[k * 16 + n]);
    }
  std::vector<float> s(16 * 16, -1.0f), pv(16 * 16, -1.0f);
  emu::launch("fragments", dim3(1), dim3(32), 0, [&] {
    namespace flash = ops::emulated::flash;
    const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
    float acc[2][4] = {}, out[2][4] = {};
    for (int ks = 0; ks < K / 16; ++ks) {
      uint32_t af4[4], bf4[4];
      flash::load_a(af4, a.data(), RS, 0, ks * 16, lane);
      flash::load_b(bf4, b.data(), RS, 0, ks * 16, lane);
      flash::mma<T>(acc[0], af4, bf4[0], bf4[1]);
      flash::mma<T>(acc[1], af4, bf4[2], bf4[3]);
      uint32_t lo[2], hi[2];
      flash::load_b_trans(lo, hi, v.data(), 24, ks * 16, 0, lane);
      flash::mma<T>(out[0], af4, lo[0], lo[1]);
      flash::mma<T>(out[1], af4, hi[0], hi[1]);
    }
    for (int n = 0; n < 2; ++n)
      for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e >> 1), col = n * 8 + 2 * t + (e & 1);
        s[row * 16 + col] = acc[n][e];
        pv[row * 16 + col] = out[n][e];
      }
  });
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      double want = 0, want_pv = 0;
      for (int k = 0; k < K; ++k) {
        want += static_cast<double>(af[i * K + k]) * bf[j * K + k];
        want_pv += static_cast<double>(af[i * K + k]) * vf[k * 16 + j];
      }
      EXPECT_EQ(s[i * 16 + j], static_cast<float>(want)) << "S row " << i << " column " << j;
      EXPECT_EQ(pv[i * 16 + j], static_cast<float>(want_pv)) << "PV row " << i << " column " << j;
    }
}

// What it reports: a poll that nothing will end, a barrier that a warp's lanes reach at
// different instructions, a trap, a misaligned ldmatrix row; and deferred copies land at the
// wait, not before.
TEST(WarpEmulator, ReportsDeadlocksTrapsAndLanesApartAndDefersCopies) {
  int flag = 0;
  expect_error(
      [&] {
        emu::launch("waits", dim3(2), dim3(64), 0, [&] {
          if (threadIdx.x == 0)
            while (flag == 0) __nanosleep(10);
          __syncthreads();
        });
      },
      "deadlock: the threads still running only poll");
  expect_error(
      [&] {
        emu::launch("apart", dim3(1), dim3(32), 0, [&] {
          if (threadIdx.x < 16) {
            (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
          } else {
            (void)__shfl_xor_sync(0xffffffffu, 1.0f, 2);
          }
        });
      },
      "lanes of one warp met at different warp-wide instructions");
  expect_error([&] { emu::launch("traps", dim3(3), dim3(32), 0, [&] { if (blockIdx.x == 2) __trap(); }); },
               "block (2, 0, 0) thread (0, 0, 0)");
  expect_error(
      [&] {
        emu::launch("barrier", dim3(1), dim3(64), 0, [&] {
          if (threadIdx.x < 32 || threadIdx.x == 63) {
            __syncthreads();  // (the last lane of warp 1 too, while its warp waits at a shuffle)
          } else {
            (void)__shfl_xor_sync(0xffffffffu, 0, 1);
          }
        });
      },
      "deadlock: every thread waits");
  std::vector<unsigned char> bytes(64, 0);
  unsigned char* aligned = bytes.data() + (16 - reinterpret_cast<uintptr_t>(bytes.data()) % 16) % 16;
  expect_error(
      [&] {
        emu::launch("misaligned", dim3(1), dim3(32), 0, [&] {
          uint32_t r[4];
          emu::ldmatrix_x4(r, aligned + (threadIdx.x == 5 ? 8 : 0), false);  // lane 5's row off by 8 bytes
        });
      },
      "ldmatrix: a row address not 16-byte aligned");
  std::vector<unsigned char> src(16, 7);
  unsigned char before = 0, after = 0;
  emu::launch("copies", dim3(1), dim3(1), 64, [&] {
    unsigned char* smem = emu::dynamic_smem();
    emu::cp_async16(smem, src.data(), 16);
    emu::cp_commit();
    before = smem[3];
    emu::cp_wait(0);
    after = smem[3];
  });
  EXPECT_EQ(before, 0xa5) << "a deferred copy landed before its wait";
  EXPECT_EQ(after, 7);
}

// ---- the flash kernels ------------------------------------------------------------------

class Emulated : public ::testing::TestWithParam<DType> {
 protected:
  OpHarness harness(uint32_t seed) const { return OpHarness(mb::Device::cpu(), GetParam(), seed); }
};

// Forward and backward (the separate dQ kernel; with T5's bias, the dbias kernel too) of
// self-attention against the f64 reference: causal and not, padding, dropout (its Philox
// blocks shared by lanes where the keys are a multiple of 4, drawn per element where not), the bias,
// lengths that are not multiples of the tiles, head sizes 64 and 128, grouped-query attention
// (4 heads in 2 groups, 2 in 1: the dK/dV kernel walking a group's heads); the threads in a
// random order with eager copies, so that a missing barrier shows; documents packed in a row
// (--reset-attention-mask), causal and not, with padding, dropout and groups. The forward with a
// warp per 32 rows (ops::FlashForwardRows::k32) gives the same bits as with 16.
TEST_P(Emulated, FlashAttentionForwardAndBackward) {
  struct Config {
    int64_t B, T, H, D;
    bool causal, mask;
    double p;
    bool bias;
    int64_t G = 0;  // key/value groups (grouped-query attention; 0: one a head)
    bool docs = false;
  };
  const WithOptions options({3, 11, emu::Copies::kEager});
  const WithFlashDq separate(ops::FlashDq::kSeparate);
  for (const Config& c :
       {Config{2, 37, 2, 64, true, false, 0.0, false}, Config{1, 130, 1, 64, true, true, 0.0, false},
        Config{1, 100, 1, 128, false, true, 0.1, false}, Config{1, 70, 2, 64, true, true, 0.2, false},
        Config{1, 65, 1, 128, true, false, 0.1, false}, Config{2, 72, 1, 64, false, true, 0.1, true},
        Config{1, 130, 1, 128, true, false, 0.0, true}, Config{1, 132, 4, 64, true, true, 0.1, false, 2},
        Config{1, 100, 2, 128, false, false, 0.0, false, 1}, Config{2, 150, 2, 64, true, false, 0.1, false, 0, true},
        Config{1, 130, 1, 128, true, true, 0.0, false, 0, true},
        Config{2, 100, 2, 64, false, true, 0.0, false, 0, true},
        Config{1, 140, 4, 64, true, false, 0.0, false, 2, true}}) {
    auto h = harness(13);
    const int64_t G = c.G ? c.G : c.H;
    SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " H " + std::to_string(c.H) + " G " +
                 std::to_string(G) + " D " + std::to_string(c.D) + (c.causal ? " causal" : "") +
                 (c.mask ? " masked" : "") + " p " + std::to_string(c.p) + (c.bias ? " bias" : "") +
                 (c.docs ? " documents" : ""));
    const ops::AttentionShape s{c.B, c.T, c.H, c.D, c.causal, 1, c.H + 1, G};
    const Pair docs = c.docs ? h.ids(mb::testing::packed_documents(c.B, c.T), {c.B, c.T}) : Pair{};
    const ops::DropoutKey dk{c.p, 57, 4};
    std::vector<uint8_t> mv(static_cast<size_t>(c.B * c.T), 1);
    for (int64_t t = c.T - 9; t < c.T; ++t) mv[static_cast<size_t>(t)] = 0;
    const Pair mask = c.mask ? h.bytes(mv, {c.B, c.T}) : Pair{};
    const Pair qkv = h.input({c.B, c.T, G, c.H / G + 2, c.D}), dy = h.input({c.B, c.T, c.H, c.D});
    const Pair bias = c.bias ? h.input({c.H, c.T, c.T}) : Pair{};
    Pair out = h.output({c.B, c.T, c.H, c.D}), lse = h.output({c.B, c.H, c.T}, DType::kF32);
    ops::emulated::flash_attention_forward(out.dev, lse.dev, qkv.dev, mask.dev, s, &dk, bias.dev, docs.dev);
    ops::flash_attention_forward(out.ref, lse.ref, qkv.ref, mask.ref, s, &dk, bias.ref, docs.ref);
    const double terms = static_cast<double>(c.D + c.T);
    h.expect_close(out, terms, "out", 8.0);
    h.expect_close(lse, terms, "lse", 8.0);
    {  // a warp per 32 rows (at head size 128, the queries from shared memory): the same bits
      const WithForwardRows rows(ops::FlashForwardRows::k32);
      Pair out32 = h.output({c.B, c.T, c.H, c.D}), lse32 = h.output({c.B, c.H, c.T}, DType::kF32);
      ops::emulated::flash_attention_forward(out32.dev, lse32.dev, qkv.dev, mask.dev, s, &dk, bias.dev, docs.dev);
      EXPECT_EQ(bits_of(out32.dev), bits_of(out.dev)) << "32 rows a warp";
      EXPECT_EQ(mb::to_host_f32(lse32.dev), mb::to_host_f32(lse.dev)) << "32 rows a warp";
    }
    Pair dqkv = h.accumulator({c.B, c.T, G, c.H / G + 2, c.D});
    Pair dbias = c.bias ? h.accumulator({c.H, c.T, c.T}, DType::kF32) : Pair{};
    ops::emulated::flash_attention_backward(dqkv.dev, dy.dev, qkv.dev, out.dev, lse.dev, mask.dev, s, &dk,
                                            ops::Write::kAdd, bias.dev, dbias.dev, docs.dev);
    ops::flash_attention_backward(dqkv.ref, dy.ref, qkv.ref, out.ref, lse.ref, mask.ref, s, &dk, ops::Write::kAdd,
                                  bias.ref, dbias.ref, docs.ref);
    h.expect_close(dqkv, terms * static_cast<double>(c.H / G), "dqkv", 16.0);
    if (c.bias) h.expect_close(dbias, terms + static_cast<double>(c.B), "dbias", 16.0);
  }
}

// Cross-attention (T5's decoder on the encoder): fewer keys than queries and more, padding,
// dropout, both head sizes; the forward with 32 rows a warp gives the same bits.
TEST_P(Emulated, FlashCrossAttentionForwardAndBackward) {
  struct Config {
    int64_t B, Tq, Tk, H, D;
    bool mask;
    double p;
  };
  const WithOptions options({2, 5, emu::Copies::kDeferred});
  for (const Config c : {Config{2, 37, 50, 1, 64, false, 0.0}, Config{1, 130, 70, 1, 64, true, 0.0},
                         Config{1, 65, 129, 1, 128, true, 0.0}, Config{1, 20, 100, 2, 64, true, 0.2}}) {
    auto h = harness(17);
    SCOPED_TRACE("B " + std::to_string(c.B) + " Tq " + std::to_string(c.Tq) + " Tk " + std::to_string(c.Tk) + " D " +
                 std::to_string(c.D) + (c.mask ? " masked" : "") + " p " + std::to_string(c.p));
    const ops::CrossAttentionShape s{c.B, c.Tq, c.Tk, c.H, c.D, 1, c.H + 1};
    const ops::DropoutKey dk{c.p, 59, 6};
    std::vector<uint8_t> mv(static_cast<size_t>(c.B * c.Tk), 1);
    for (int64_t t = c.Tk - 5; t < c.Tk; ++t) mv[static_cast<size_t>(t)] = 0;
    const Pair mask = c.mask ? h.bytes(mv, {c.B, c.Tk}) : Pair{};
    const Pair q = h.input({c.B, c.Tq, c.H, c.D}), kv = h.input({c.B, c.Tk, c.H, 2, c.D}), dy = h.input({c.B, c.Tq, c.H, c.D});
    Pair out = h.output({c.B, c.Tq, c.H, c.D}), lse = h.output({c.B, c.H, c.Tq}, DType::kF32);
    ops::emulated::flash_cross_attention_forward(out.dev, lse.dev, q.dev, kv.dev, mask.dev, s, &dk);
    ops::flash_cross_attention_forward(out.ref, lse.ref, q.ref, kv.ref, mask.ref, s, &dk);
    const double terms = static_cast<double>(c.D + c.Tk);
    h.expect_close(out, terms, "out", 8.0);
    {
      const WithForwardRows rows(ops::FlashForwardRows::k32);
      Pair out32 = h.output({c.B, c.Tq, c.H, c.D}), lse32 = h.output({c.B, c.H, c.Tq}, DType::kF32);
      ops::emulated::flash_cross_attention_forward(out32.dev, lse32.dev, q.dev, kv.dev, mask.dev, s, &dk);
      EXPECT_EQ(bits_of(out32.dev), bits_of(out.dev)) << "32 rows a warp";
    }
    // kSet: dq and dkv written whole from their NaN start
    Pair dq_set = h.output({c.B, c.Tq, c.H, c.D}), dkv = h.output({c.B, c.Tk, c.H, 2, c.D});
    ops::emulated::flash_cross_attention_backward(dq_set.dev, dkv.dev, dy.dev, q.dev, kv.dev, out.dev, lse.dev, mask.dev,
                                                  s, &dk, ops::Write::kSet);
    ops::flash_cross_attention_backward(dq_set.ref, dkv.ref, dy.ref, q.ref, kv.ref, out.ref, lse.ref, mask.ref, s, &dk,
                                        ops::Write::kSet);
    h.expect_close(dq_set, terms, "dq", 16.0);
    h.expect_close(dkv, terms, "dkv", 16.0);
  }
}

// The ordered dQ (ops::FlashDq::kOrdered) against the f64 reference, on emulated GPUs that
// hold from one block to all of them at once, in round-robin and random orders, with
// copies deferred and eager: the path ran (its counter), the result is within the
// reference's tolerance, and every schedule gives the same bits; with grouped-query attention
// too (each item walking its group's heads in turn), and with documents packed in a row. A non-causal shape whose
// key blocks do not all fit at once takes the separate kernels, and gives what they give. In
// bf16 (the turns do not depend on the type; the other tests run both).
TEST(EmulatedBf16, FlashOrderedDqIsTheSameWhateverTheSchedule) {
  struct Config {
    int64_t B, T, H, D;
    bool causal, mask;
    double p;
    int64_t G = 0;  // key/value groups (grouped-query attention; 0: one a head)
    bool docs = false;
  };
  const WithFlashDq ordered(ops::FlashDq::kOrdered);
  for (const Config c :
       {Config{1, 200, 2, 64, false, true, 0.0}, Config{1, 193, 2, 64, true, false, 0.0},
        Config{2, 150, 1, 64, true, true, 0.15}, Config{1, 260, 1, 128, false, false, 0.1},
        Config{1, 270, 1, 128, true, true, 0.0}, Config{1, 40, 2, 64, false, false, 0.0},
        Config{1, 200, 4, 64, false, true, 0.1, 2}, Config{1, 193, 3, 64, true, false, 0.0, 1},
        Config{2, 200, 2, 64, true, false, 0.1, 0, true}, Config{1, 270, 1, 128, false, true, 0.0, 0, true}}) {
    OpHarness h(mb::Device::cpu(), DType::kBF16, 17);
    const int64_t G = c.G ? c.G : c.H;
    SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " H " + std::to_string(c.H) + " G " +
                 std::to_string(G) + " D " + std::to_string(c.D) + (c.causal ? " causal" : "") +
                 (c.mask ? " masked" : "") + " p " + std::to_string(c.p) + (c.docs ? " documents" : ""));
    const Pair docs = c.docs ? h.ids(mb::testing::packed_documents(c.B, c.T), {c.B, c.T}) : Pair{};
    const int64_t key_blocks = (c.T + (c.D == 64 ? 63 : 127)) / (c.D == 64 ? 64 : 128);
    const ops::AttentionShape s{c.B, c.T, c.H, c.D, c.causal, 0, 0, G};
    const std::vector<int64_t> qkv_shape{c.B, c.T, G, c.H / G + 2, c.D};
    const ops::DropoutKey dk{c.p, 61, 3};
    std::vector<uint8_t> mv(static_cast<size_t>(c.B * c.T), 1);
    for (int64_t t = std::max<int64_t>(0, c.T - 70); t < c.T; ++t) mv[static_cast<size_t>(t)] = 0;
    const Pair mask = c.mask ? h.bytes(mv, {c.B, c.T}) : Pair{};
    const Pair qkv = h.input(qkv_shape), dy = h.input({c.B, c.T, c.H, c.D});
    Pair out = h.output({c.B, c.T, c.H, c.D}), lse = h.output({c.B, c.H, c.T}, DType::kF32);
    ops::emulated::flash_attention_forward(out.dev, lse.dev, qkv.dev, mask.dev, s, &dk, {}, docs.dev);
    ops::flash_attention_forward(out.ref, lse.ref, qkv.ref, mask.ref, s, &dk, {}, docs.ref);
    const double terms = static_cast<double>(c.D + c.T) * static_cast<double>(c.H / G);  // (dK, dV: a group's)
    Pair dqkv = h.accumulator(qkv_shape);
    {
      const WithOptions o({static_cast<int>(key_blocks), 0, emu::Copies::kDeferred});
      const int64_t calls = ops::flash_dq_ordered_calls();
      ops::emulated::flash_attention_backward(dqkv.dev, dy.dev, qkv.dev, out.dev, lse.dev, mask.dev, s, &dk,
                                              ops::Write::kAdd, {}, {}, docs.dev);
      ASSERT_EQ(ops::flash_dq_ordered_calls(), calls + 1) << "the backward did not take the ordered path";
    }
    ops::flash_attention_backward(dqkv.ref, dy.ref, qkv.ref, out.ref, lse.ref, mask.ref, s, &dk, ops::Write::kAdd, {},
                                  {}, docs.ref);
    h.expect_close(dqkv, terms, "dqkv (add)", 16.0);

    Pair first = h.output(qkv_shape);
    ops::flash_attention_backward(first.ref, dy.ref, qkv.ref, out.ref, lse.ref, mask.ref, s, &dk, ops::Write::kSet, {},
                                  {}, docs.ref);
    std::vector<emu::Options> schedules = {{static_cast<int>(key_blocks), 0, emu::Copies::kDeferred},
                                           {static_cast<int>(key_blocks) + 3, 7, emu::Copies::kEager},
                                           {static_cast<int>(2 * key_blocks), 23, emu::Copies::kDeferred}};
    if (c.causal) schedules.push_back({1, 5, emu::Copies::kEager});  // causal: free of deadlock on one block
    std::vector<uint16_t> bits;
    for (const emu::Options& o : schedules) {
      SCOPED_TRACE(options_name(o));
      const WithOptions with(o);
      const int64_t calls = ops::flash_dq_ordered_calls();
      Pair again = h.output(qkv_shape);
      ops::emulated::flash_attention_backward(again.dev, dy.dev, qkv.dev, out.dev, lse.dev, mask.dev, s, &dk,
                                              ops::Write::kSet, {}, {}, docs.dev);
      ASSERT_EQ(ops::flash_dq_ordered_calls(), calls + 1);
      if (bits.empty()) {
        again.ref = first.ref;
        h.expect_close(again, terms, "dqkv (set)", 16.0);
        bits = bits_of(again.dev);
      } else {
        ASSERT_EQ(bits_of(again.dev), bits) << "another schedule gave other bits";
      }
    }
    if (!c.causal && key_blocks > 1) {  // too few blocks at once: the separate kernels, the same result
      const WithOptions o({static_cast<int>(key_blocks) - 1, 3, emu::Copies::kDeferred});
      const int64_t calls = ops::flash_dq_ordered_calls();
      Pair separate = h.output(qkv_shape);
      ops::emulated::flash_attention_backward(separate.dev, dy.dev, qkv.dev, out.dev, lse.dev, mask.dev, s, &dk,
                                              ops::Write::kSet, {}, {}, docs.dev);
      EXPECT_EQ(ops::flash_dq_ordered_calls(), calls) << "the ordered path ran where a head's key blocks do not fit";
      separate.ref = first.ref;
      h.expect_close(separate, terms, "dqkv (separate)", 16.0);
    }
  }
}

// With documents (--reset-attention-mask) the flash kernels read only the tiles that share a
// document with their block: the forward, the backward's separate dK/dV and dQ kernels, and
// the ordered dQ, whose key blocks take turns only at the tiles they reach. Each one's
// tensor-core work with documents (the emulator's mma count) is its work without them per
// (query tile, key tile) pair, times the pairs that share a document, counted here from the
// document ids; and what it computes is the reference's. Head size 64: every block is one
// tile, and every tile a kernel walks costs it the same mma (no warp's rows lie wholly past a
// causal tile).
TEST(EmulatedBf16, FlashKernelsReadOnlyTheTilesThatShareADocument) {
  const WithForwardRows rows(ops::FlashForwardRows::k16);
  constexpr int64_t B = 2, T = 400, H = 1, D = 64, kTile = 64, tiles = (T + kTile - 1) / kTile;
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b)  // row 0: four documents; row 1: one at every 90 positions
    for (int64_t t = 0; t < T; ++t)
      ids[static_cast<size_t>(b * T + t)] =
          static_cast<int32_t>(b == 0 ? (t >= 100) + (t >= 200) + (t >= 330) : t / 90);
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    int64_t pairs = 0, shared = 0;  // (key tile, query tile) pairs without documents; those sharing one
    for (int64_t b = 0; b < B; ++b)
      for (int64_t k = 0; k < tiles; ++k)
        for (int64_t q = causal ? k : 0; q < tiles; ++q) {
          ++pairs;
          bool share = false;
          for (int64_t x = k * kTile; x < std::min(T, (k + 1) * kTile) && !share; ++x)
            for (int64_t y = q * kTile; y < std::min(T, (q + 1) * kTile) && !share; ++y)
              share = ids[static_cast<size_t>(b * T + x)] == ids[static_cast<size_t>(b * T + y)];
          shared += share;
        }
    ASSERT_LT(shared, pairs) << "the documents leave no tile out";
    OpHarness h(mb::Device::cpu(), DType::kBF16, 29);
    const ops::AttentionShape s{B, T, H, D, causal, 0, 0, H};
    const std::vector<int64_t> qkv_shape{B, T, H, 3, D};
    const ops::DropoutKey dk{0.1, 7, 2};
    const Pair docs = h.ids(ids, {B, T}), qkv = h.input(qkv_shape), dy = h.input({B, T, H, D});
    const WithOptions o({static_cast<int>(tiles), 11, emu::Copies::kDeferred});
    // the mma of f(documents) without documents and with them: the second, the first's per pair
    // times the pairs that share a document
    auto expect_skips = [&](const std::string& what, const std::function<void(const mb::Tensor&)>& f) {
      int64_t mmas[2];
      for (const int with : {0, 1}) {
        const int64_t before = emu::mmas();
        f(with ? docs.dev : mb::Tensor{});
        mmas[with] = emu::mmas() - before;
      }
      ASSERT_EQ(mmas[0] % (pairs * H), 0) << what << ": " << mmas[0] << " mma for " << pairs * H << " tile pairs";
      EXPECT_EQ(mmas[1], mmas[0] / (pairs * H) * shared * H)
          << what << ": of " << pairs << " tile pairs " << shared << " share a document";
    };
    Pair out = h.output({B, T, H, D}), lse = h.output({B, H, T}, DType::kF32);
    expect_skips("forward", [&](const mb::Tensor& documents) {
      ops::emulated::flash_attention_forward(out.dev, lse.dev, qkv.dev, {}, s, &dk, {}, documents);
    });
    ops::flash_attention_forward(out.ref, lse.ref, qkv.ref, {}, s, &dk, {}, docs.ref);
    h.expect_close(out, static_cast<double>(T), "out", 16.0);
    Pair first = h.output(qkv_shape);
    ops::flash_attention_backward(first.ref, dy.ref, qkv.ref, out.ref, lse.ref, {}, s, &dk, ops::Write::kSet, {}, {},
                                  docs.ref);
    for (const ops::FlashDq how : {ops::FlashDq::kSeparate, ops::FlashDq::kOrdered}) {
      const std::string what = how == ops::FlashDq::kOrdered ? "ordered dQ" : "separate dQ";
      const WithFlashDq dq(how);
      Pair dqkv = h.output(qkv_shape);
      const int64_t calls = ops::flash_dq_ordered_calls();
      expect_skips(what, [&](const mb::Tensor& documents) {
        ops::emulated::flash_attention_backward(dqkv.dev, dy.dev, qkv.dev, out.dev, lse.dev, {}, s, &dk,
                                                ops::Write::kSet, {}, {}, documents);
      });
      EXPECT_EQ(ops::flash_dq_ordered_calls(), calls + (how == ops::FlashDq::kOrdered ? 2 : 0)) << what;
      dqkv.ref = first.ref;
      h.expect_close(dqkv, static_cast<double>(D + T), what + ": dqkv", 16.0);
    }
  }
}

// Attention dropout draws each Philox block of the scores (four keys' bits) once in each kernel
// that needs the mask, not once per score: where the keys are a multiple of 4 the lanes that
// hold a block's keys share it. Counted on the emulator, not causal (every tile whole): the
// forward with 16 and 32 rows a warp, the backward's separate dK/dV and dQ kernels (once each),
// and the ordered dQ's single walk; head sizes 64 and 128.
TEST(EmulatedBf16, FlashDropoutDrawsEachPhiloxBlockOncePerKernel) {
  constexpr int64_t B = 1, T = 128, H = 2, blocks = B * H * T * T / 4;
  const WithOptions o({4, 0, emu::Copies::kDeferred});
  for (const int64_t D : {64, 128}) {
    SCOPED_TRACE("D " + std::to_string(D));
    OpHarness h(mb::Device::cpu(), DType::kBF16, 31);
    const ops::AttentionShape s{B, T, H, D, false, 0, 0, H};
    const ops::DropoutKey dk{0.1, 5, 1};
    const Pair qkv = h.input({B, T, H, 3, D}), dy = h.input({B, T, H, D});
    Pair out = h.output({B, T, H, D}), lse = h.output({B, H, T}, DType::kF32), dqkv = h.output({B, T, H, 3, D});
    auto drawn = [](const std::function<void()>& f) {
      const int64_t before = emu::philox_blocks();
      f();
      return emu::philox_blocks() - before;
    };
    for (const ops::FlashForwardRows r : {ops::FlashForwardRows::k32, ops::FlashForwardRows::k16}) {
      const WithForwardRows rows(r);
      EXPECT_EQ(drawn([&] { ops::emulated::flash_attention_forward(out.dev, lse.dev, qkv.dev, {}, s, &dk, {}, {}); }),
                blocks)
          << "forward, " << (r == ops::FlashForwardRows::k32 ? 32 : 16) << " rows a warp";
    }
    for (const ops::FlashDq how : {ops::FlashDq::kSeparate, ops::FlashDq::kOrdered}) {
      const WithFlashDq dq(how);
      const int64_t calls = ops::flash_dq_ordered_calls();
      EXPECT_EQ(drawn([&] {
                  ops::emulated::flash_attention_backward(dqkv.dev, dy.dev, qkv.dev, out.dev, lse.dev, {}, s, &dk,
                                                          ops::Write::kSet, {}, {}, {});
                }),
                how == ops::FlashDq::kOrdered ? blocks : 2 * blocks)
          << (how == ops::FlashDq::kOrdered ? "ordered dQ" : "separate dQ");
      EXPECT_EQ(ops::flash_dq_ordered_calls(), calls + (how == ops::FlashDq::kOrdered ? 1 : 0));
    }
  }
}

std::string dtype_param_name(const ::testing::TestParamInfo<DType>& p) { return mb::dtype_name(p.param); }
INSTANTIATE_TEST_SUITE_P(Flash, Emulated, ::testing::Values(DType::kBF16, DType::kF16), dtype_param_name);

// MEGABATCH_FLASH_DQ and MEGABATCH_FLASH_FORWARD_ROWS set the variants a process starts with
// (tests/gpu/run.sh runs the trainer's GPU tests under the opt-in ones with them); another
// value is an error naming the variable. Each case runs in a process of its own (gtest starts
// the program again), whose first ask reads the environment.
TEST(FlashVariants, TheEnvironmentChoosesTheStartingOnes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto ask = [](const char* dq, const char* rows) {  // nullptr: unset
    for (const auto& [name, value] :
         {std::pair{"MEGABATCH_FLASH_DQ", dq}, std::pair{"MEGABATCH_FLASH_FORWARD_ROWS", rows}}) {
      if (value) {
        setenv(name, value, 1);
      } else {
        unsetenv(name);
      }
    }
    try {
      const bool ordered = ops::flash_dq() == ops::FlashDq::kOrdered;
      const bool rows32 = ops::flash_forward_rows() == ops::FlashForwardRows::k32;
      std::exit(10 + 2 * ordered + rows32);  // which variants were chosen
    } catch (const mb::Error& e) {
      std::cerr << e.what() << std::endl;
      std::exit(3);
    }
  };
  using ::testing::ExitedWithCode;
  EXPECT_EXIT(ask(nullptr, nullptr), ExitedWithCode(10), "");
  EXPECT_EXIT(ask("ordered", nullptr), ExitedWithCode(12), "");
  EXPECT_EXIT(ask("separate", "16"), ExitedWithCode(10), "");
  EXPECT_EXIT(ask(nullptr, "32"), ExitedWithCode(11), "");
  EXPECT_EXIT(ask("ordered", "32"), ExitedWithCode(13), "");
  EXPECT_EXIT(ask("sideways", nullptr), ExitedWithCode(3),
              "MEGABATCH_FLASH_DQ=sideways: expected separate or ordered \\(or leave it unset\\)");
  EXPECT_EXIT(ask(nullptr, "64"), ExitedWithCode(3), "MEGABATCH_FLASH_FORWARD_ROWS=64: expected 16 or 32");
}
