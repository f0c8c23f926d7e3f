// Reductions that keep their results on the device (the host reads them only when it
// logs): loss sums, and the per-tensor squared norms behind gradient clipping.
// Every reduction has a fixed order, independent of thread count and launch shape.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "core/tensor/tensor.h"

namespace megabatch::ops {

// out[0] = sum of x's elements (accumulate: out[0] += ...), summed in double; out is a
// one-element floating tensor.
void sum(const Tensor& out, const Tensor& x, bool accumulate = false);

// out[k] += weights[k] * x[k] for k < x.numel() (a handful of loss terms, at most 8), in
// double. x f32 or f64; out f32 or f64.
void weighted_accumulate(const Tensor& out, const Tensor& x, const std::vector<double>& weights);

// out[s] = sum over elements [begin_s, end_s) of x of x^2, in double (out: f64 (S)). x is
// a flat f32 buffer (the gradients), segments its parameters.
void segment_sum_squares(const Tensor& out, const Tensor& x, const std::vector<std::pair<size_t, size_t>>& segments);

// As segment_sum_squares, of x - prev (what x has grown by since prev was taken), then
// prev = x within the segments, in one pass (prev: f32 as x; outside the segments
// untouched). The elements' differences are rounded to f32 as x - prev would be, and
// summed in the order segment_sum_squares sums.
void segment_sum_squares_of_growth(const Tensor& out, const Tensor& x, const Tensor& prev,
                                   const std::vector<std::pair<size_t, size_t>>& segments);

}  // namespace megabatch::ops
