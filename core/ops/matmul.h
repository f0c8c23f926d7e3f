// Matrix multiply (OpenBLAS GEMM underneath) and the linear layer built on it.
// All matrices are row-major. Backward functions accumulate (+=) into their outputs;
// a null output pointer skips that gradient.
#pragma once

#include <cstdint>

namespace megabatch::ops {

enum class Trans { N, T };

// C(M, N) = alpha * op(A)(M, K) * op(B)(K, N) + beta * C, with leading dimensions.
template <typename T>
void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc);

// out(n, O) = in(n, I) * weight(O, I)^T + bias(O); bias may be null.
template <typename T>
void linear_forward(T* out, const T* in, const T* weight, const T* bias, int64_t n, int64_t in_features,
                    int64_t out_features);

// din(n, I) += dout * weight; dweight(O, I) += dout^T * in; dbias(O) += column sums of dout.
template <typename T>
void linear_backward(T* din, T* dweight, T* dbias, const T* dout, const T* in, const T* weight, int64_t n,
                     int64_t in_features, int64_t out_features);

}  // namespace megabatch::ops
