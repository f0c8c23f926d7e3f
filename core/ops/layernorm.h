// Normalization over the last dimension C of x (n, C):
//   LayerNorm: out = (x - mean) rstd weight + bias,  rstd = 1 / sqrt(var + eps)
//   RMSNorm (T5): out = x rstd weight,               rstd = 1 / sqrt(mean(x^2) + eps)
// Statistics (mean, rstd: n) are saved for backward in the accumulator dtype (f32 for the
// half types). Backward accumulates: din in the activation dtype, dweight and dbias in the
// accumulator dtype, each reduced over fixed row blocks in a fixed order (no dependence on
// thread count or launch shape); any of them may be undefined.
#pragma once

#include "core/tensor/tensor.h"

namespace megabatch::ops {

void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in,
                       const Tensor& weight, const Tensor& bias, double eps);
void layernorm_backward(const Tensor& din, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& in, const Tensor& weight, const Tensor& mean, const Tensor& rstd);

void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& weight, double eps);

// The residual add fused with the norm after it: sum = a + b (rounded to the dtype, as
// residual_forward), then the forward above of sum (a GPU reads a and b once and writes sum
// and out in one pass where its warp-per-row kernel takes the rows; else the two ops).
void layernorm_residual_forward(const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias, double eps);
void rmsnorm_residual_forward(const Tensor& sum, const Tensor& out, const Tensor& rstd, const Tensor& a,
                              const Tensor& b, const Tensor& weight, double eps);
void rmsnorm_backward(const Tensor& din, const Tensor& dweight, const Tensor& dout, const Tensor& in,
                      const Tensor& weight, const Tensor& rstd);

}  // namespace megabatch::ops
