// GELU, tanh form (GPT-2, Megatron's "gelu" with approximate="tanh" in PyTorch):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
#pragma once

#include <cstdint>

namespace megabatch::ops {

template <typename T>
void gelu_forward(T* out, const T* in, int64_t n);

// din += dout * gelu'(in)
template <typename T>
void gelu_backward(T* din, const T* dout, const T* in, int64_t n);

}  // namespace megabatch::ops
