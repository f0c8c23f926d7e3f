// Philox4x32-10 counter-based random numbers (Salmon et al., SC'11).
//
// A draw is a pure function of (key, counter), so a stream keyed by (seed, purpose) and
// indexed by (sample, element) gives the same numbers on any thread count, on CPU and on
// GPU, and after a resume: nothing is carried from one draw to the next.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "core/util/host_device.h"

namespace megabatch {

struct Philox4x32 {
  using Block = std::array<uint32_t, 4>;

  MB_HOST_DEVICE static Block generate(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
    uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
    uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = uint64_t{0xD2511F53u} * c0;
      const uint64_t p1 = uint64_t{0xCD9E8D57u} * c2;
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
      c1 = static_cast<uint32_t>(p1);
      c3 = static_cast<uint32_t>(p0);
      c0 = n0;
      c2 = n2;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    return {c0, c1, c2, c3};
  }
};

// A sequential view over one Philox stream: (key, stream) fixed, draws advance the
// low counter. Cheap to construct; construct one per (sample, purpose).
class PhiloxStream {
 public:
  MB_HOST_DEVICE PhiloxStream(uint64_t key, uint64_t stream) : key_(key), stream_(stream) {}

  MB_HOST_DEVICE uint32_t next_u32() {
    if (used_ == 4) {
      block_ = Philox4x32::generate(key_, stream_, counter_++);
      used_ = 0;
    }
    return block_[used_++];
  }
  MB_HOST_DEVICE uint64_t next_u64() {
    const uint64_t hi = next_u32();
    return (hi << 32) | next_u32();
  }
  // Uniform in [0, 1) with 53 random bits.
  MB_HOST_DEVICE double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0, without modulo bias (Lemire's method).
  MB_HOST_DEVICE uint64_t below(uint64_t n) {
    if (n <= 1) return 0;
    for (;;) {
      const uint64_t x = next_u64();
      __extension__ using u128 = unsigned __int128;
      const u128 m = static_cast<u128>(x) * n;
      const uint64_t low = static_cast<uint64_t>(m);
      if (low >= n || low >= (0 - n) % n) return static_cast<uint64_t>(m >> 64);
    }
  }

 private:
  uint64_t key_, stream_, counter_ = 0;
  Philox4x32::Block block_{};
  int used_ = 4;
};

// Mixes several 64-bit values into one key (splitmix64 finalizer per value).
MB_HOST_DEVICE inline uint64_t mix_key(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9E3779B97F4A7C15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A 64-bit key from a name (FNV-1a), e.g. to key a parameter's random stream by its name.
inline uint64_t name_key(const char* s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(s[i])) * 1099511628211ull;
  return h;
}

// A standard normal draw that is a pure function of (key, index): Box-Muller over the
// Philox block of counter index / 2, the cosine branch for even and the sine for odd.
MB_HOST_DEVICE inline double philox_normal(uint64_t key, uint64_t index) {
  const Philox4x32::Block r = Philox4x32::generate(key, 0, index / 2);
  const double u1 = (static_cast<double>(((uint64_t{r[0]} << 32) | r[1]) >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(((uint64_t{r[2]} << 32) | r[3]) >> 11) * 0x1.0p-53;
  const double rad = std::sqrt(-2.0 * std::log(u1)), ang = 6.283185307179586476925 * u2;
  return rad * (index % 2 == 0 ? std::cos(ang) : std::sin(ang));
}

// Fisher-Yates shuffle of [first, first + n) driven by a Philox stream.
template <typename T>
void philox_shuffle(T* first, uint64_t n, PhiloxStream& rng) {
  for (uint64_t i = n; i > 1; --i) {
    const uint64_t j = rng.below(i);
    T tmp = first[i - 1];
    first[i - 1] = first[j];
    first[j] = tmp;
  }
}

}  // namespace megabatch
