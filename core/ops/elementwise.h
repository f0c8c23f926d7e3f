// Whole-tensor elementwise operations: dtype conversion, scaling.
#pragma once

#include "core/tensor/tensor.h"

namespace megabatch::ops {

// dst = src converted to dst's dtype (round to nearest even into the half types). Same
// number of elements and device.
void cast(const Tensor& dst, const Tensor& src);
// x *= s
void scale(const Tensor& x, float s);

}  // namespace megabatch::ops
