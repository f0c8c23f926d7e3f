// Weighted blends of datasets (Megatron's --data-path W1 A W2 B): data_path's forms and their
// errors, the blend order against a plain run of Megatron's rule from sample 0 (the order
// saves its counts every 1024 samples and starts a range from them), each share held to
// within two samples, and a blended source's samples taken from the sources the order names.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "core/data/blend.h"
#include "core/train/blended_source.h"
#include "core/util/error.h"
#include "tests/unit/test_util.h"

namespace megabatch::data {
namespace {

using megabatch::testing::expect_error;
using Picked = std::vector<std::pair<size_t, uint64_t>>;

// The rule as stated, sample by sample from 0, in exact rational arithmetic on integer
// weights: the dataset furthest behind its share of max(i, 1) samples, the first on a tie.
Picked plain_order(const std::vector<double>& w, uint64_t n) {
  int64_t sum = 0;
  for (double x : w) sum += static_cast<int64_t>(x);
  std::vector<int64_t> given(w.size(), 0);
  Picked out;
  for (uint64_t i = 0; i < n; ++i) {
    const int64_t at = std::max<int64_t>(static_cast<int64_t>(i), 1);
    size_t best = 0;  // behind_k * sum = w_k * at - given_k * sum
    for (size_t k = 1; k < w.size(); ++k)
      if (static_cast<int64_t>(w[k]) * at - given[k] * sum > static_cast<int64_t>(w[best]) * at - given[best] * sum)
        best = k;
    out.emplace_back(best, static_cast<uint64_t>(given[best]++));
  }
  return out;
}

// Integer weights whose largest is a power of two, so that 2^-32 of it is exact and the ties
// of the rational rule are the order's; and weights that are not.
const std::vector<std::vector<double>> kExact = {{3, 4}, {1, 1, 1}, {1, 16, 1}, {1, 1024}, {3, 5, 8, 1, 2}};
const std::vector<std::vector<double>> kWeights = {
    {0.3, 0.7}, {1, 1, 1}, {0.05, 0.9, 0.05}, {3, 1e-3}, {0.11, 0.23, 0.07, 0.31, 0.28}};

TEST(BlendOrder, AnyRangeIsThatOfTheRuleRunFromSampleZero) {
  constexpr uint64_t kN = 5000;  // several of the order's saved strides
  std::mt19937_64 rng(7);
  for (const auto& w : kExact) {
    SCOPED_TRACE(::testing::PrintToString(w));
    const Picked want = plain_order(w, kN);
    BlendOrder order(w);
    Picked got;
    order.range(0, kN, got);
    EXPECT_EQ(got, want);
    BlendOrder fresh(w);  // ranges asked out of order, from a fresh order and an extended one
    for (BlendOrder* o : {&fresh, &order})
      for (int t = 0; t < 50; ++t) {
        const uint64_t first = rng() % (kN - 100);
        const int64_t count = static_cast<int64_t>(rng() % 100);
        o->range(first, count, got);
        EXPECT_EQ(got, Picked(want.begin() + static_cast<long>(first), want.begin() + static_cast<long>(first) + count))
            << "first " << first << " count " << count;
      }
  }
}

TEST(BlendOrder, EveryPrefixHoldsEachDatasetsShareToWithinTwoSamples) {
  for (const auto& w : kWeights) {
    SCOPED_TRACE(::testing::PrintToString(w));
    double sum = 0;
    for (double x : w) sum += x;
    BlendOrder order(w);
    Picked got;
    order.range(0, 20000, got);
    std::vector<double> given(w.size(), 0);
    for (size_t n = 0; n < got.size(); ++n) {
      EXPECT_EQ(got[n].second, static_cast<uint64_t>(given[got[n].first])) << "each dataset's samples in order";
      given[got[n].first] += 1;
      for (size_t k = 0; k < w.size(); ++k)
        ASSERT_LE(std::abs(given[k] - w[k] / sum * double(n + 1)), 2.0) << "dataset " << k << " after " << n + 1;
    }
  }
}

TEST(BlendOrder, WeightsOfAnyScaleGiveTheSameOrder) {
  BlendOrder a({0.3, 0.7}), b({3, 7});
  Picked x, y;
  a.range(100, 3000, x);
  b.range(100, 3000, y);
  EXPECT_EQ(x, y);
  expect_error([] { BlendOrder({0.5, 0}); }, "a blend weight is 0");
  expect_error([] { BlendOrder({1, 1e-12}); }, "a blend weight of 1e-12 is below 2^-32 of the largest, 1");
}

TEST(DataPath, OnePrefixWeightedPairsOrPrefixesAlone) {
  EXPECT_EQ(parse_data_path({"data/a"}).size(), 1u);
  const auto pairs = parse_data_path({"0.3", "data/a", "7e-1", "data/b"});
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[1].prefix, "data/b");
  EXPECT_DOUBLE_EQ(pairs[1].weight, 0.7);
  const auto sized = parse_data_path({"data/a", "data/b", "data/c"});
  ASSERT_EQ(sized.size(), 3u);
  EXPECT_EQ(sized[2].weight, 0) << "weighed by their samples";

  expect_error([] { parse_data_path({"0.3", "data/a", "0.7"}); }, "data_path: 3 items, but a weighted blend is pairs");
  expect_error(
      [] {
        parse_data_path({"0.3", "data/a", "data/b", "data/c"});
      },
      "data_path: item 3 'data/b' is not a weight");
  expect_error(
      [] {
        parse_data_path({"0.3", "data/a", "0", "data/b"});
      },
      "data_path: weight 0 of data/b is not above 0");
  expect_error(
      [] {
        parse_data_path({"0.3", "0.5", "0.7", "data/b"});
      },
      "data_path: item 2 '0.5' is a number where the dataset prefix of weight 0.3 belongs");
  expect_error([] { parse_data_path({"data/a", "0.5", "data/b"}); }, "data_path: item 2 '0.5' is a number among");
  expect_error([] { parse_data_path({"0.5", "data/a", "0.5", "data/a"}); }, "data_path: data/a is given twice");
  expect_error([] { parse_data_path({"1"}); }, "data_path: '1' is a weight without a dataset prefix");
}

// A source whose sample j of dataset k is one token, k * 1e6 + j (and, BERT-like, a padding
// mask, a token type and a sentence label from it; T5-like, two decoder tokens and their mask).
class Numbered final : public train::BatchSource {
 public:
  explicit Numbered(int32_t k) : k_(k) {}
  void fill(uint64_t first, int64_t count, train::Batch& out) override {
    out = train::Batch{};
    out.batch = count;
    out.seq = 1;
    out.decoder_seq = 2;
    for (int64_t b = 0; b < count; ++b) {
      const int32_t id = k_ * 1000000 + static_cast<int32_t>(first) + static_cast<int32_t>(b);
      out.tokens.push_back(id);
      out.labels.push_back(id + 1);
      out.padding_mask.push_back(static_cast<uint8_t>(id % 2));
      out.token_types.push_back(k_);
      out.sample_labels.push_back(id % 3);
      out.decoder_tokens.insert(out.decoder_tokens.end(), {-id, id + 7});
      out.decoder_padding_mask.insert(out.decoder_padding_mask.end(), {1, static_cast<uint8_t>(id % 5 != 0)});
    }
  }

 private:
  int32_t k_;
};

TEST(BlendedSource, EachSampleIsTheOneTheOrderNames) {
  const std::vector<double> w = {2, 8, 3};
  std::vector<std::unique_ptr<train::BatchSource>> sources;
  for (int32_t k = 0; k < 3; ++k) sources.push_back(std::make_unique<Numbered>(k));
  train::BlendedSource blend(std::move(sources), w);
  const Picked want = plain_order(w, 2100);
  train::Batch batch;
  blend.fill(2000, 64, batch);
  ASSERT_EQ(batch.batch, 64);
  ASSERT_EQ(batch.tokens.size(), 64u);
  for (const auto* field : {&batch.labels, &batch.token_types, &batch.sample_labels}) ASSERT_EQ(field->size(), 64u);
  ASSERT_EQ(batch.padding_mask.size(), 64u);
  ASSERT_EQ(batch.decoder_tokens.size(), 128u);
  ASSERT_EQ(batch.decoder_padding_mask.size(), 128u);
  for (size_t b = 0; b < 64; ++b) {
    const auto [k, j] = want[2000 + b];
    const int32_t id = static_cast<int32_t>(k) * 1000000 + static_cast<int32_t>(j);
    EXPECT_EQ(batch.tokens[b], id) << b;
    EXPECT_EQ(batch.labels[b], id + 1) << b;
    EXPECT_EQ(batch.padding_mask[b], id % 2) << b;
    EXPECT_EQ(batch.token_types[b], static_cast<int32_t>(k)) << b;
    EXPECT_EQ(batch.sample_labels[b], id % 3) << b;
    EXPECT_EQ(batch.decoder_tokens[2 * b], -id) << b;
    EXPECT_EQ(batch.decoder_tokens[2 * b + 1], id + 7) << b;
    EXPECT_EQ(batch.decoder_padding_mask[2 * b + 1], id % 5 != 0) << b;
  }
  EXPECT_EQ(batch.decoder_seq, 2);
  blend.fill(0, 1, batch);  // refilled, not appended to
  EXPECT_EQ(batch.batch, 1);
  EXPECT_EQ(batch.tokens.size(), 1u);
}

}  // namespace
}  // namespace megabatch::data
