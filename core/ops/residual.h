// Residual add: out = a + b; backward passes dout to both inputs (da += dout, db += dout).
// residual_backward(d, {}, g) is also the plain accumulation d += g.
#pragma once

#include "core/tensor/tensor.h"

namespace megabatch::ops {

void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b);
// da += dout; db += dout (either may be undefined).
void residual_backward(const Tensor& da, const Tensor& db, const Tensor& dout);

}  // namespace megabatch::ops
