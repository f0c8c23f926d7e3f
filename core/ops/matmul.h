// Matrix multiply (OpenBLAS on the CPU, cuBLASLt on a GPU) and the linear layer built on
// it. Tensors are row-major; a tensor of more than 2 dimensions is taken as its rows
// (all leading dimensions) by its last dimension. Backward functions accumulate (+=) unless
// told to set (write.h); an undefined output tensor skips that gradient.
//
// Dtypes: inputs and weights in one activation dtype (f32, bf16, f16; f64 on the CPU);
// weight and bias gradients in its accumulator dtype (f32 for the half types, as
// Megatron's fp32 main gradients; f64 for f64), every product accumulated in f32 or
// better.
#pragma once

#include <cstdint>

#include "core/ops/write.h"
#include "core/tensor/tensor.h"

namespace megabatch::ops {

enum class Trans { N, T };

// C(M, N) = alpha op(A)(M, K) op(B)(K, N) + beta C. A and B of one dtype; C of that dtype
// or of its accumulator dtype (beta = 1: accumulation into fp32 main gradients).
void gemm(const Tensor& C, const Tensor& A, Trans ta, const Tensor& B, Trans tb, float alpha = 1.0f,
          float beta = 0.0f);

// out(n, O) = in(n, I) weight(O, I)^T + bias(O); bias may be undefined.
void linear_forward(const Tensor& out, const Tensor& in, const Tensor& weight, const Tensor& bias);

// din(n, I) += dout weight (= with din_write kSet); dweight(O, I) += dout^T in; dbias(O) +=
// column sums of dout.
void linear_backward(const Tensor& din, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& in, const Tensor& weight, Write din_write = Write::kAdd);

// The MLP's first linear layer and the GELU after it, in one: pre(n, O) = in weight^T + bias
// (saved for the backward) and out(n, O) = gelu(pre) (activation.h's tanh form). A GPU does
// the bias and the GELU in the GEMM's epilogue (cuBLASLt GELU_AUX_BIAS) where cuBLASLt has
// an algorithm for it, and runs linear_forward and gelu_forward otherwise.
void linear_gelu_forward(const Tensor& out, const Tensor& pre, const Tensor& in, const Tensor& weight,
                         const Tensor& bias);
// The backward of the MLP's second linear layer, out = in weight^T + bias with in = gelu(pre),
// through that GELU: dweight(O, I) += dout^T in; dbias(O) += column sums of dout; dpre(n, I) =
// (dout weight) * gelu'(pre), set, not added. A GPU applies gelu' in the GEMM's epilogue
// (cuBLASLt DGELU) where it can, and runs linear_backward and gelu_backward otherwise.
void linear_backward_gelu(const Tensor& dpre, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                          const Tensor& in, const Tensor& weight, const Tensor& pre);

// x(n, O) += bias(O) on every row.
void bias_add(const Tensor& x, const Tensor& bias);
// dbias(O) += column sums of dx(n, O) (accumulator dtype; rows summed in order).
void bias_backward(const Tensor& dbias, const Tensor& dx);

}  // namespace megabatch::ops
