// Philox4x32-10 against the published known-answer vectors (Random123 kat_vectors).
#include <gtest/gtest.h>

#include <cmath>

#include "core/util/philox.h"

namespace megabatch {
namespace {

TEST(Philox, KnownAnswerVectors) {
  // counter 0, key 0
  EXPECT_EQ(Philox4x32::generate(0, 0, 0), (Philox4x32::Block{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  // counter all ones, key all ones
  EXPECT_EQ(Philox4x32::generate(~0ull, ~0ull, ~0ull),
            (Philox4x32::Block{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  // counter = pi digits 243f6a88 85a308d3 13198a2e 03707344, key = a4093822 299f31d0
  EXPECT_EQ(Philox4x32::generate(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull),
            (Philox4x32::Block{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, UniformAndBelowHaveTheRightMoments) {
  PhiloxStream rng(123, 4);
  const int n = 200000;
  double sum = 0, sq = 0;
  std::vector<int> counts(7, 0);
  for (int i = 0; i < n; ++i) {
    const double u = rng.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sq += u * u;
    ++counts[rng.below(7)];
  }
  // mean 1/2 and variance 1/12, within 5 standard errors
  EXPECT_NEAR(sum / n, 0.5, 5 * std::sqrt(1.0 / 12 / n));
  EXPECT_NEAR(sq / n - (sum / n) * (sum / n), 1.0 / 12, 0.002);
  for (int c : counts) EXPECT_NEAR(c, n / 7.0, 5 * std::sqrt(n / 7.0));
}

TEST(Philox, StreamsAreFunctionsOfKeyAndCounter) {
  PhiloxStream a(9, 1), b(9, 1), c(9, 2);
  for (int i = 0; i < 10; ++i) {
    const auto x = a.next_u32();
    EXPECT_EQ(x, b.next_u32());
    (void)c;
  }
  PhiloxStream d(9, 1), e(9, 2);
  int same = 0;
  for (int i = 0; i < 64; ++i) same += d.next_u32() == e.next_u32();
  EXPECT_LT(same, 2);
}

}  // namespace
}  // namespace megabatch
