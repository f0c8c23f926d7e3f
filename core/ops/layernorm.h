// LayerNorm over the last dimension: out = (x - mean) * rstd * weight + bias.
#pragma once

#include <cstdint>

namespace megabatch::ops {

// in, out: (n, C); mean, rstd: (n) saved for backward.
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* in, const T* weight, const T* bias, int64_t n, int64_t C,
                       double eps);

// din(n, C) += ...; dweight(C), dbias(C) += ... (either may be null). Row blocks of fixed
// size are reduced in a fixed order, so dweight does not depend on the thread count.
template <typename T>
void layernorm_backward(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight, const T* mean,
                        const T* rstd, int64_t n, int64_t C);

}  // namespace megabatch::ops
