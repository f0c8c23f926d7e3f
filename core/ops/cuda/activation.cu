// GELU (tanh form), squared ReLU and tanh on a GPU: elementwise maps (common.cuh), 16 bytes a thread;
// SwiGLU: a thread per (gate, up) pair.
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

namespace megabatch::ops::MB_CUDA_BACKEND {
namespace {

constexpr float kGeluS = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

struct Gelu {
  __device__ float operator()(float x) const { return 0.5f * x * (1.0f + tanhf(kGeluS * (x + kGeluA * x * x * x))); }
};
__device__ float gelu_grad(float dout, float x) {  // dout * gelu'(x)
  const float t = tanhf(kGeluS * (x + kGeluA * x * x * x));
  const float dt = kGeluS * (1.0f + 3.0f * kGeluA * x * x);
  return dout * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dt);
}
struct GeluBackwardAdd {  // din + dout * gelu'(x)
  __device__ float operator()(float din, float dout, float x) const { return din + gelu_grad(dout, x); }
};
struct GeluBackwardSet {  // dout * gelu'(x)
  __device__ float operator()(float dout, float x) const { return gelu_grad(dout, x); }
};
struct SquaredRelu {
  __device__ float operator()(float x) const { return x > 0.0f ? x * x : 0.0f; }
};
struct SquaredReluBackward {  // dout * 2 max(x, 0)
  __device__ float operator()(float dout, float x) const { return x > 0.0f ? 2.0f * x * dout : 0.0f; }
};
struct Tanh {
  __device__ float operator()(float x) const { return tanhf(x); }
};
struct TanhBackward {  // din + dout * (1 - y^2)
  __device__ float operator()(float din, float dout, float y) const { return din + dout * (1.0f - y * y); }
};

// out[j] = silu(in[2j]) in[2j + 1] for the n pairs
template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* in, int64_t n) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_f32(in[2 * j]), u = to_f32(in[2 * j + 1]), s = 1.0f / (1.0f + expf(-g));
    out[j] = from_f32<T>(g * s * u);
  }
}

// din[2j] = dout[j] up silu'(gate), din[2j + 1] = dout[j] silu(gate) (set)
template <typename T>
__global__ void swiglu_backward_kernel(T* din, const T* dout, const T* in, int64_t n) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_f32(in[2 * j]), u = to_f32(in[2 * j + 1]), dy = to_f32(dout[j]);
    const float s = 1.0f / (1.0f + expf(-g));
    din[2 * j] = from_f32<T>(dy * u * s * (1.0f + g * (1.0f - s)));
    din[2 * j + 1] = from_f32<T>(dy * g * s);
  }
}

}  // namespace

void swiglu_forward(const Tensor& out, const Tensor& in) {
  with_type<accepts::swiglu_forward_in.cuda.bits>(in.dtype(), "swiglu_forward", [&](auto zero) {
    using T = decltype(zero);
    const int64_t n = static_cast<int64_t>(out.numel());
    if (n > 0)
      launch(swiglu_forward_kernel<T>, dim3(blocks_for(n, 256)), 256, 0, stream_of(in), "swiglu_forward", ptr<T>(out),
             ptr<const T>(in), n);
  });
}

void swiglu_backward(const Tensor& din, const Tensor& dout, const Tensor& in) {
  with_type<accepts::swiglu_backward_in.cuda.bits>(in.dtype(), "swiglu_backward", [&](auto zero) {
    using T = decltype(zero);
    const int64_t n = static_cast<int64_t>(dout.numel());
    if (n > 0)
      launch(swiglu_backward_kernel<T>, dim3(blocks_for(n, 256)), 256, 0, stream_of(in), "swiglu_backward", ptr<T>(din),
             ptr<const T>(dout), ptr<const T>(in), n);
  });
}

void gelu_forward(const Tensor& out, const Tensor& in) {
  with_type<accepts::gelu_forward_in.cuda.bits>(in.dtype(), "gelu_forward", [&](auto zero) {
    using T = decltype(zero);
    map("gelu_forward", stream_of(in), ptr<T>(out), static_cast<int64_t>(in.numel()), Gelu{}, ptr<const T>(in));
  });
}

void gelu_backward(const Tensor& din, const Tensor& dout, const Tensor& in, Write w) {
  with_type<accepts::gelu_backward_in.cuda.bits>(in.dtype(), "gelu_backward", [&](auto zero) {
    using T = decltype(zero);
    const int64_t n = static_cast<int64_t>(in.numel());
    if (w == Write::kSet)
      map("gelu_backward", stream_of(in), ptr<T>(din), n, GeluBackwardSet{}, ptr<const T>(dout), ptr<const T>(in));
    else
      map("gelu_backward", stream_of(in), ptr<T>(din), n, GeluBackwardAdd{}, ptr<const T>(din), ptr<const T>(dout),
          ptr<const T>(in));
  });
}

void squared_relu_forward(const Tensor& out, const Tensor& in) {
  with_type<accepts::squared_relu_forward_in.cuda.bits>(in.dtype(), "squared_relu_forward", [&](auto zero) {
    using T = decltype(zero);
    map("squared_relu_forward", stream_of(in), ptr<T>(out), static_cast<int64_t>(in.numel()), SquaredRelu{},
        ptr<const T>(in));
  });
}

void squared_relu_backward(const Tensor& din, const Tensor& dout, const Tensor& in) {
  with_type<accepts::squared_relu_backward_in.cuda.bits>(in.dtype(), "squared_relu_backward", [&](auto zero) {
    using T = decltype(zero);
    map("squared_relu_backward", stream_of(in), ptr<T>(din), static_cast<int64_t>(in.numel()), SquaredReluBackward{},
        ptr<const T>(dout), ptr<const T>(in));
  });
}

void tanh_forward(const Tensor& out, const Tensor& in) {
  with_type<accepts::tanh_forward_in.cuda.bits>(in.dtype(), "tanh_forward", [&](auto zero) {
    using T = decltype(zero);
    map("tanh_forward", stream_of(in), ptr<T>(out), static_cast<int64_t>(in.numel()), Tanh{}, ptr<const T>(in));
  });
}

void tanh_backward(const Tensor& din, const Tensor& dout, const Tensor& out) {
  with_type<accepts::tanh_backward_out.cuda.bits>(out.dtype(), "tanh_backward", [&](auto zero) {
    using T = decltype(zero);
    map("tanh_backward", stream_of(out), ptr<T>(din), static_cast<int64_t>(out.numel()), TanhBackward{}, ptr<const T>(din),
        ptr<const T>(dout), ptr<const T>(out));
  });
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
