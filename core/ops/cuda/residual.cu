// Residual add and gradient accumulation on a GPU: elementwise maps (common.cuh), 16 bytes
// a thread.
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

namespace megabatch::ops::MB_CUDA_BACKEND {
namespace {

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

}  // namespace

void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) {
  with_type<accepts::residual_forward_a.cuda.bits>(a.dtype(), "residual_forward", [&](auto zero) {
    using T = decltype(zero);
    map("residual_forward", stream_of(a), ptr<T>(out), static_cast<int64_t>(a.numel()), Add{}, ptr<const T>(a), ptr<const T>(b));
  });
}

void residual_backward(const Tensor& da, const Tensor& db, const Tensor& dout) {
  with_type<accepts::residual_backward_dout.cuda.bits>(dout.dtype(), "residual_backward", [&](auto zero) {
    using T = decltype(zero);
    for (const Tensor* d : {&da, &db})
      if (d->defined())
        map("residual_backward", stream_of(dout), ptr<T>(*d), static_cast<int64_t>(dout.numel()), Add{}, ptr<const T>(*d),
            ptr<const T>(dout));
  });
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
