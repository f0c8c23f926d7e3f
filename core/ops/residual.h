// Residual add: out = a + b; backward passes dout to both inputs.
#pragma once

#include <cstdint>

namespace megabatch::ops {

template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n);

// da += dout; db += dout (either may be null).
template <typename T>
void residual_backward(T* da, T* db, const T* dout, int64_t n);

}  // namespace megabatch::ops
