// Dropout driven by the counter-based Philox RNG: element i of a tensor is kept when the
// uniform draw for counter (stream, offset + i) under `key` is >= p. The mask is a pure
// function of (key, stream, element), never stored and never dependent on thread count;
// backward regenerates it. Callers derive key from (seed, iteration, micro-batch) and
// stream from the dropout site, and use the element index of the full (unsharded) tensor.
#pragma once

#include <cstdint>

namespace megabatch::ops {

struct DropoutKey {
  double p = 0.0;        // drop probability in [0, 1)
  uint64_t key = 0;      // from (seed, iteration, micro-batch)
  uint64_t stream = 0;   // the dropout site
};

// keep[i] = 1 when element offset + i is kept.
void dropout_mask(uint8_t* keep, int64_t n, uint64_t offset, const DropoutKey& k);

// out = in * keep / (1 - p)
template <typename T>
void dropout_forward(T* out, const T* in, int64_t n, uint64_t offset, const DropoutKey& k);

// din += dout * keep / (1 - p)
template <typename T>
void dropout_backward(T* din, const T* dout, int64_t n, uint64_t offset, const DropoutKey& k);

}  // namespace megabatch::ops
