// The profile table (core/device/profile.h): how device intervals become rows (overlaps
// counted once, communication under compute, idle), which family each op belongs to, and
// the host recorder over real ops. The CUPTI side runs in test_gpu (gpu label).
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <string>

#include "core/device/profile.h"
#include "core/ops/layernorm.h"
#include "core/ops/matmul.h"
#include "core/tensor/tensor.h"

namespace mb = megabatch;
using mb::profile::Family;
using mb::profile::Interval;

namespace {

const mb::profile::Row* row(const mb::profile::Table& t, Family f) {
  for (const auto& r : t.rows)
    if (r.family == f) return &r;
  return nullptr;
}

double sum_of_rows(const mb::profile::Table& t) {
  double s = t.idle_seconds;
  for (const auto& r : t.rows) s += r.seconds;
  return s;
}

}  // namespace

TEST(Profile, OverlapsCountOnceCommunicationYieldsToComputeAndTheRestIsIdle) {
  // window [100, 200) ns, two steps:
  //   attention fwd [90, 110): began before the window, clipped to [100, 110); it began
  //     before the gemm, so the 10 ns both cover are its
  //   gemm       [100, 135)                       25 ns of its own
  //   comm            [120, 150)   under the gemm 15 ns, alone 15 ns
  //   memset                    [160, 170)  elementwise, a copy: 10 ns
  //   a norm after the window [210, 220): dropped
  std::vector<Interval> in = {
      {100, 135, Family::kGemm, false, "sgemm"},
      {120, 150, Family::kCommunication, false, "allreduce"},
      {160, 170, Family::kElementwise, true, "memset"},
      {90, 110, Family::kAttentionForward, false, "softmax"},
      {210, 220, Family::kNorm, false, "ln"},
  };
  const auto t = mb::profile::attribute(in, 100, 200, 2);
  ASSERT_NE(row(t, Family::kCommunication), nullptr);
  EXPECT_DOUBLE_EQ(row(t, Family::kCommunication)->seconds, 15e-9);
  EXPECT_DOUBLE_EQ(row(t, Family::kAttentionForward)->seconds, 10e-9);
  EXPECT_DOUBLE_EQ(row(t, Family::kGemm)->seconds, 25e-9);
  EXPECT_DOUBLE_EQ(row(t, Family::kElementwise)->seconds, 10e-9);
  EXPECT_DOUBLE_EQ(row(t, Family::kElementwise)->copy_seconds, 10e-9);
  EXPECT_EQ(row(t, Family::kNorm), nullptr);  // outside the window
  EXPECT_DOUBLE_EQ(t.idle_seconds, 40e-9);    // [150, 160) and [170, 200)
  EXPECT_EQ(t.short_gaps, 2);                 // both under 10 us
  EXPECT_EQ(t.long_gaps, 0);
  EXPECT_DOUBLE_EQ(t.short_gap_seconds, 40e-9);
  EXPECT_DOUBLE_EQ(t.window_seconds, 100e-9);
  EXPECT_NEAR(sum_of_rows(t), t.window_seconds, 1e-18);
  EXPECT_EQ(t.steps, 2);
  ASSERT_FALSE(t.top.empty());
  EXPECT_EQ(t.top.front().name, "sgemm");  // 25 ns counted for it, the most
  const std::string text = mb::profile::format(t);
  EXPECT_NE(text.find("communication"), std::string::npos) << text;
  EXPECT_NE(text.find("idle (GPU waiting)"), std::string::npos) << text;
}

TEST(Profile, IdleSplitsIntoShortGapsBetweenLaunchesAndLongWaits) {
  // window [0, 40 us): idle [0, 2 us) short, [3, 22 us) long (19 us), [23, 31 us) short,
  // [32, 40 us) short (c and d overlap: one busy stretch [31, 32 us), no gap inside it)
  const uint64_t us = 1000;
  const auto t = mb::profile::attribute({{2 * us, 3 * us, Family::kGemm, false, "a"},
                                         {22 * us, 23 * us, Family::kNorm, false, "b"},
                                         {31 * us, 31 * us + 500, Family::kGemm, false, "c"},
                                         {31 * us + 200, 31 * us + 1000, Family::kElementwise, false, "d"}},
                                        0, 40 * us, 1);
  EXPECT_EQ(t.long_gaps, 1);
  EXPECT_DOUBLE_EQ(t.long_gap_seconds, 19e-6);
  EXPECT_EQ(t.short_gaps, 3);
  EXPECT_NEAR(t.short_gap_seconds, 2e-6 + 8e-6 + 8e-6, 1e-15);
  EXPECT_NEAR(t.short_gap_seconds + t.long_gap_seconds, t.idle_seconds, 1e-15);
  const std::string text = mb::profile::format(t);
  EXPECT_NE(text.find("idle gaps a step: 3.0 under 10 us (0.018 ms), 1.0 longer (0.019 ms)"), std::string::npos)
      << text;
}

TEST(Profile, CommunicationAloneIsCountedAndComputeAfterItTakesOver) {
  // a collective that begins first still yields the overlap to compute started inside it
  const auto t = mb::profile::attribute({{0, 100, Family::kCommunication, false, "nccl"}, {40, 60, Family::kGemm, false, "g"}},
                                        0, 100, 1);
  EXPECT_DOUBLE_EQ(row(t, Family::kCommunication)->seconds, 80e-9);
  EXPECT_DOUBLE_EQ(row(t, Family::kGemm)->seconds, 20e-9);
  EXPECT_DOUBLE_EQ(t.idle_seconds, 0.0);
}

TEST(Profile, EveryOpOfTheBackendsHasAFamily) {
  // the entry points every backend implements, read from the list the backends compile
  std::ifstream f(std::string(MEGABATCH_SOURCE_DIR) + "/core/ops/backend_ops.inc");
  ASSERT_TRUE(f) << "core/ops/backend_ops.inc";
  const std::regex decl(R"(^void ([a-z0-9_]+)\()");
  std::set<std::string> ops;
  for (std::string line; std::getline(f, line);) {
    std::smatch m;
    if (std::regex_search(line, m, decl)) ops.insert(m[1]);
  }
  ASSERT_GT(ops.size(), 40u);
  for (const auto& op : ops) EXPECT_NE(mb::profile::family_of_op(op), Family::kOther) << op;
  // the families the table is read by
  EXPECT_EQ(mb::profile::family_of_op("attention_forward"), Family::kAttentionForward);
  EXPECT_EQ(mb::profile::family_of_op("cross_attention_backward"), Family::kAttentionBackward);
  EXPECT_EQ(mb::profile::family_of_op("relative_bias_backward"), Family::kAttentionBackward);
  EXPECT_EQ(mb::profile::family_of_op("linear_backward"), Family::kGemm);
  EXPECT_EQ(mb::profile::family_of_op("ce_whole_rows"), Family::kLmHeadLoss);
  EXPECT_EQ(mb::profile::family_of_op("rmsnorm_forward"), Family::kNorm);
  EXPECT_EQ(mb::profile::family_of_op("embedding_backward"), Family::kEmbedding);
  EXPECT_EQ(mb::profile::family_of_op("unscale_and_check"), Family::kOptimizer);
  EXPECT_EQ(mb::profile::family_of_op("dropout_forward"), Family::kElementwise);
}

TEST(Profile, TheHostRecorderCountsEachOpOnceAndARegionOwnsTheOpsInsideIt) {
  EXPECT_FALSE(mb::profile::active());
  const int64_t n = 96;
  std::vector<float> v(n * n);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
  const mb::Tensor A = mb::from_host(v, {n, n}), B = mb::from_host(v, {n, n}), C = mb::Tensor({n, n}, mb::DType::kF32);
  const mb::Tensor w = mb::from_host(std::vector<float>(n, 1.0f), {n}), b = mb::from_host(std::vector<float>(n, 0.0f), {n});
  const mb::Tensor mean = mb::Tensor({n}, mb::DType::kF32), rstd = mb::Tensor({n}, mb::DType::kF32);
  mb::profile::Table t;
  {
    mb::profile::Recorder rec(mb::Device::cpu());
    EXPECT_TRUE(mb::profile::active());
    EXPECT_THROW(mb::profile::Recorder(mb::Device::cpu()), std::exception);  // one at a time
    for (int i = 0; i < 3; ++i) mb::ops::gemm(C, A, mb::ops::Trans::N, B, mb::ops::Trans::N);
    mb::ops::layernorm_forward(C, mean, rstd, A, w, b, 1e-5);
    {
      const mb::profile::Region head(Family::kLmHeadLoss);
      mb::ops::gemm(C, A, mb::ops::Trans::N, B, mb::ops::Trans::T);  // the LM head's, not a linear layer's
      {
        const mb::profile::Region comm(Family::kCommunication);  // the innermost region wins
        mb::ops::gemm(C, A, mb::ops::Trans::N, B, mb::ops::Trans::N);
      }
      mb::ops::gemm(C, A, mb::ops::Trans::N, B, mb::ops::Trans::N);
    }
    t = rec.stop(2);
  }
  EXPECT_FALSE(mb::profile::active());
  EXPECT_EQ(t.clock, "host");
  ASSERT_NE(row(t, Family::kGemm), nullptr);
  EXPECT_EQ(row(t, Family::kGemm)->count, 3);
  EXPECT_EQ(row(t, Family::kNorm)->count, 1);
  EXPECT_EQ(row(t, Family::kLmHeadLoss)->count, 1);  // one region, though a region inside cut it in two
  EXPECT_EQ(row(t, Family::kCommunication)->count, 1);
  for (const auto& r : t.rows) EXPECT_GT(r.seconds, 0.0) << mb::profile::family_name(r.family);
  EXPECT_GE(t.idle_seconds, 0.0);
  EXPECT_NEAR(sum_of_rows(t), t.window_seconds, 1e-9);
  const std::string text = mb::profile::format(t);
  EXPECT_NE(text.find("outside ops (host)"), std::string::npos) << text;
  EXPECT_NE(text.find("costliest ops:"), std::string::npos) << text;
}
