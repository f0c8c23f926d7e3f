// Elementwise activations, computed in f32 (f64 for f64 tensors) whatever the storage:
//   gelu (tanh form: GPT-2, Megatron's "gelu", PyTorch approximate="tanh"):
//     gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   squared ReLU (Megatron's --squared-relu, Primer's MLP): max(x, 0)^2;
//   tanh (BERT's pooler);
//   swiglu (Megatron's --swiglu, LLaMA's gated MLP) of F (gate, up) pairs, interleaved in the
//     rows of in: out[r, j] = silu(in[r, 2j]) in[r, 2j + 1], silu(g) = g / (1 + exp(-g)).
//     The pairs are adjacent so that fc1's output splits over tensor-parallel ranks as any
//     column-parallel layer's, each rank holding whole pairs.
// Backward accumulates into din (gelu_backward sets it when told: write.h; swiglu_backward and
// squared_relu_backward always set it).
#pragma once

#include "core/ops/write.h"
#include "core/tensor/tensor.h"

namespace megabatch::ops {

void gelu_forward(const Tensor& out, const Tensor& in);
// din += dout * gelu'(in) (= with kSet)
void gelu_backward(const Tensor& din, const Tensor& dout, const Tensor& in, Write w = Write::kAdd);

void squared_relu_forward(const Tensor& out, const Tensor& in);
// din = dout * 2 max(in, 0) (set)
void squared_relu_backward(const Tensor& din, const Tensor& dout, const Tensor& in);

// out (n, F) from in (n, 2F)
void swiglu_forward(const Tensor& out, const Tensor& in);
// din (n, 2F) = (dgate, dup) pairs, set: dgate = dout up silu'(gate), dup = dout silu(gate),
// with silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)
void swiglu_backward(const Tensor& din, const Tensor& dout, const Tensor& in);

void tanh_forward(const Tensor& out, const Tensor& in);
// din += dout * (1 - out^2), from the forward's output
void tanh_backward(const Tensor& din, const Tensor& dout, const Tensor& out);

}  // namespace megabatch::ops
