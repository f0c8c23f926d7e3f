// Collectives over tensors of every dtype (core/comm/collectives.h): an all-gather moves
// bits, so half-precision parameters (the distributed optimizer's all-gather) arrive exactly
// as their owner rounded them — NaN payloads, negative zeros and subnormals included — with
// no widening to f32 on the way.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "core/comm/collectives.h"
#include "core/comm/thread_communicator.h"

namespace mb = megabatch;

namespace {

// Rank r's n elements of `t`: bit patterns that a conversion would change or lose.
std::vector<uint8_t> pattern(mb::DType t, int r, size_t n) {
  const size_t es = mb::dtype_size(t);
  std::vector<uint8_t> bytes(n * es);
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = 0;
    const uint32_t pick = static_cast<uint32_t>(i + 3 * r) % 4;
    if (es == 2) bits = pick == 0 ? 0x8000u : pick == 1 ? 0x7FC1u + static_cast<uint32_t>(r) : pick == 2 ? 0x0001u : 0x3C00u + static_cast<uint32_t>(i);
    else bits = pick == 0 ? 0x80000000u : pick == 1 ? 0x7FC00001u + static_cast<uint32_t>(r) : pick == 2 ? 0x00000001u : 0x3F800000u + static_cast<uint32_t>(i);
    std::memcpy(bytes.data() + i * es, &bits, es);
  }
  return bytes;
}

}  // namespace

TEST(Collectives, AllGatherMovesTheBitsOfEveryDtype) {
  constexpr int kRanks = 3;
  constexpr size_t kN = 5;  // odd: no pairing of halves into wider words
  for (const mb::DType t : {mb::DType::kF32, mb::DType::kBF16, mb::DType::kF16}) {
    SCOPED_TRACE(mb::dtype_name(t));
    mb::comm::ThreadGroup group(kRanks);
    std::vector<std::vector<uint8_t>> got(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r)
      threads.emplace_back([&, r] {
        const mb::Tensor in({static_cast<int64_t>(kN)}, t), out({static_cast<int64_t>(kN * kRanks)}, t);
        const auto mine = pattern(t, r, kN);
        std::memcpy(in.raw(), mine.data(), mine.size());
        mb::comm::all_gather(group.rank(r), in, out);
        got[static_cast<size_t>(r)].assign(static_cast<uint8_t*>(out.raw()), static_cast<uint8_t*>(out.raw()) + out.nbytes());
      });
    for (auto& th : threads) th.join();
    std::vector<uint8_t> want;
    for (int r = 0; r < kRanks; ++r) {
      const auto p = pattern(t, r, kN);
      want.insert(want.end(), p.begin(), p.end());
    }
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], want) << "rank " << r;
  }
}
