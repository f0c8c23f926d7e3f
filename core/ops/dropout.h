// Dropout driven by the counter-based Philox RNG: element i of a tensor is kept when the
// uniform draw for counter (stream, offset + i) under `key` is >= p. The mask is a pure
// function of (key, stream, element), never stored, and the same on the CPU and a GPU and
// for any thread count or launch shape; backward regenerates it. Callers derive key from
// (seed, iteration, micro-batch) and stream from the dropout site, and use the element
// index of the full (unsharded) tensor.
#pragma once

#include <cstdint>

#include "core/ops/write.h"
#include "core/tensor/tensor.h"

namespace megabatch::ops {

struct DropoutKey {
  double p = 0.0;        // drop probability in [0, 1)
  uint64_t key = 0;      // from (seed, iteration, micro-batch)
  uint64_t stream = 0;   // the dropout site
};

// keep[i] = 1 when element offset + i is kept (host memory; the reference of the mask).
void dropout_mask(uint8_t* keep, int64_t n, uint64_t offset, const DropoutKey& k);

// out = in * keep / (1 - p)
void dropout_forward(const Tensor& out, const Tensor& in, uint64_t offset, const DropoutKey& k);
// din += dout * keep / (1 - p) (= with kSet: the forward applied to dout)
void dropout_backward(const Tensor& din, const Tensor& dout, uint64_t offset, const DropoutKey& k,
                      Write w = Write::kAdd);

}  // namespace megabatch::ops
