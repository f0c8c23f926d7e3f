// The one cuBLASLt entry of the CUDA ops (matmul.cu): every matrix product of the GPU
// path goes through it, row-major, with f32 compute (no TF32), cached descriptors and
// algorithm per shape, one workspace per device, and optional bias and GELU epilogues. CUDA
// sources only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/device/device.h"
#include "core/device/dtype.h"
#include "core/ops/matmul.h"

namespace megabatch::ops::cuda {

struct GemmArgs {
  Trans ta = Trans::N, tb = Trans::N;
  int64_t M = 0, N = 0, K = 0;           // C (M, N) = op(A) (M, K) op(B) (K, N)
  const void* A = nullptr;
  const void* B = nullptr;
  void* C = nullptr;
  int64_t lda = 0, ldb = 0, ldc = 0;     // row-major leading dimensions (elements)
  DType ab = DType::kF32, c = DType::kF32;  // A and B dtype; C dtype (that, or f32)
  float alpha = 1.0f, beta = 0.0f;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;  // strided batches (elements)
  const void* bias = nullptr;            // (N) of C's dtype, added to every row (beta must be 0)
  // A GELU epilogue (beta 0, one batch), with gelu_aux (M, N) of C's dtype, leading dimension
  // ldc: kForward: gelu_aux = the product (+ bias), C = gelu(gelu_aux); kBackward: C = the
  // product * gelu'(gelu_aux).
  enum class Gelu { kNone, kForward, kBackward } gelu = Gelu::kNone;
  void* gelu_aux = nullptr;
};

// Runs g; an Error naming the product where cuBLASLt has no algorithm for it.
void lt_gemm(Device device, cudaStream_t stream, const GemmArgs& g);
// Runs g where cuBLASLt has an algorithm for it at g's shapes and alignments (asked once per
// shape), and returns false, having run nothing, where it has none (or a GELU epilogue does
// not fit): the caller then runs the unfused form.
bool lt_gemm_if_found(Device device, cudaStream_t stream, const GemmArgs& g);

}  // namespace megabatch::ops::cuda
