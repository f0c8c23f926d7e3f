// Elementwise activations, computed in f32 (f64 for f64 tensors) whatever the storage:
//   gelu (tanh form: GPT-2, Megatron's "gelu", PyTorch approximate="tanh"):
//     gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   tanh (BERT's pooler).
// Backward accumulates into din (gelu_backward sets it when told: write.h).
#pragma once

#include "core/ops/write.h"
#include "core/tensor/tensor.h"

namespace megabatch::ops {

void gelu_forward(const Tensor& out, const Tensor& in);
// din += dout * gelu'(in) (= with kSet)
void gelu_backward(const Tensor& din, const Tensor& dout, const Tensor& in, Write w = Write::kAdd);

void tanh_forward(const Tensor& out, const Tensor& in);
// din += dout * (1 - out^2), from the forward's output
void tanh_backward(const Tensor& din, const Tensor& dout, const Tensor& out);

}  // namespace megabatch::ops
