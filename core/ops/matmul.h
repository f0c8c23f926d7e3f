// Matrix multiply (OpenBLAS on the CPU, cuBLASLt on a GPU) and the linear layer built on
// it. Tensors are row-major; a tensor of more than 2 dimensions is taken as its rows
// (all leading dimensions) by its last dimension. Backward functions accumulate (+=); an
// undefined output tensor skips that gradient.
//
// Dtypes: inputs and weights in one activation dtype (f32, bf16, f16; f64 on the CPU);
// weight and bias gradients in its accumulator dtype (f32 for the half types, as
// Megatron's fp32 main gradients; f64 for f64), every product accumulated in f32 or
// better.
#pragma once

#include <cstdint>

#include "core/tensor/tensor.h"

namespace megabatch::ops {

enum class Trans { N, T };

// C(M, N) = alpha op(A)(M, K) op(B)(K, N) + beta C. A and B of one dtype; C of that dtype
// or of its accumulator dtype (beta = 1: accumulation into fp32 main gradients).
void gemm(const Tensor& C, const Tensor& A, Trans ta, const Tensor& B, Trans tb, float alpha = 1.0f,
          float beta = 0.0f);

// out(n, O) = in(n, I) weight(O, I)^T + bias(O); bias may be undefined.
void linear_forward(const Tensor& out, const Tensor& in, const Tensor& weight, const Tensor& bias);

// din(n, I) += dout weight; dweight(O, I) += dout^T in; dbias(O) += column sums of dout.
void linear_backward(const Tensor& din, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& in, const Tensor& weight);

// x(n, O) += bias(O) on every row.
void bias_add(const Tensor& x, const Tensor& bias);
// dbias(O) += column sums of dx(n, O) (accumulator dtype; rows summed in order).
void bias_backward(const Tensor& dbias, const Tensor& dx);

}  // namespace megabatch::ops
