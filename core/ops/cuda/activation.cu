// GELU (tanh form) and tanh on a GPU.
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

namespace megabatch::ops::cuda {
namespace {

constexpr float kGeluS = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = to_f32(in[i]);
    out[i] = from_f32<T>(0.5f * x * (1.0f + tanhf(kGeluS * (x + kGeluA * x * x * x))));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(T* din, const T* dout, const T* in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = to_f32(in[i]);
    const float t = tanhf(kGeluS * (x + kGeluA * x * x * x));
    const float dt = kGeluS * (1.0f + 3.0f * kGeluA * x * x);
    din[i] = from_f32<T>(to_f32(din[i]) + to_f32(dout[i]) * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dt));
  }
}

template <typename T>
__global__ void tanh_forward_kernel(T* out, const T* in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(tanhf(to_f32(in[i])));
}

template <typename T>
__global__ void tanh_backward_kernel(T* din, const T* dout, const T* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float y = to_f32(out[i]);
    din[i] = from_f32<T>(to_f32(din[i]) + to_f32(dout[i]) * (1.0f - y * y));
  }
}

}  // namespace

void gelu_forward(const Tensor& out, const Tensor& in) {
  const int64_t n = static_cast<int64_t>(in.numel());
  with_type<accepts::gelu_forward_in.cuda.bits>(in.dtype(), "gelu_forward", [&](auto zero) {
    using T = decltype(zero);
    gelu_forward_kernel<T><<<blocks_for(n, 256), 256, 0, stream_of(in)>>>(ptr<T>(out), ptr<T>(in), n);
    MB_CUDA_LAUNCHED("gelu_forward_kernel");
  });
}

void gelu_backward(const Tensor& din, const Tensor& dout, const Tensor& in) {
  const int64_t n = static_cast<int64_t>(in.numel());
  with_type<accepts::gelu_backward_in.cuda.bits>(in.dtype(), "gelu_backward", [&](auto zero) {
    using T = decltype(zero);
    gelu_backward_kernel<T><<<blocks_for(n, 256), 256, 0, stream_of(in)>>>(ptr<T>(din), ptr<T>(dout), ptr<T>(in), n);
    MB_CUDA_LAUNCHED("gelu_backward_kernel");
  });
}

void tanh_forward(const Tensor& out, const Tensor& in) {
  const int64_t n = static_cast<int64_t>(in.numel());
  with_type<accepts::tanh_forward_in.cuda.bits>(in.dtype(), "tanh_forward", [&](auto zero) {
    using T = decltype(zero);
    tanh_forward_kernel<T><<<blocks_for(n, 256), 256, 0, stream_of(in)>>>(ptr<T>(out), ptr<T>(in), n);
    MB_CUDA_LAUNCHED("tanh_forward_kernel");
  });
}

void tanh_backward(const Tensor& din, const Tensor& dout, const Tensor& out) {
  const int64_t n = static_cast<int64_t>(out.numel());
  with_type<accepts::tanh_backward_out.cuda.bits>(out.dtype(), "tanh_backward", [&](auto zero) {
    using T = decltype(zero);
    tanh_backward_kernel<T><<<blocks_for(n, 256), 256, 0, stream_of(out)>>>(ptr<T>(din), ptr<T>(dout), ptr<T>(out), n);
    MB_CUDA_LAUNCHED("tanh_backward_kernel");
  });
}

}  // namespace megabatch::ops::cuda
