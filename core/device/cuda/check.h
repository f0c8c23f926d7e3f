// Checked CUDA and cuBLASLt calls (CUDA sources only): a failure becomes a megabatch::Error
// naming the call, file and line. After each kernel launch, MB_CUDA_LAUNCHED() checks the
// launch and, with MEGABATCH_CUDA_SYNC=1 in the environment, waits for the kernel so that a
// fault is reported at the kernel that caused it.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/util/error.h"

namespace megabatch::cuda_rt {

[[noreturn]] void fail_call(const char* what, const char* error, const char* file, int line);
bool sync_after_launch();  // MEGABATCH_CUDA_SYNC=1
void check_launch(const char* kernel, const char* file, int line);

}  // namespace megabatch::cuda_rt

#define MB_CUDA_CHECK(call)                                                                   \
  do {                                                                                        \
    const cudaError_t mb_err_ = (call);                                                       \
    if (mb_err_ != cudaSuccess)                                                               \
      ::megabatch::cuda_rt::fail_call(#call, cudaGetErrorString(mb_err_), __FILE__, __LINE__); \
  } while (0)

#define MB_CUBLAS_CHECK(call)                                                                            \
  do {                                                                                                   \
    const cublasStatus_t mb_st_ = (call);                                                                \
    if (mb_st_ != CUBLAS_STATUS_SUCCESS)                                                                 \
      ::megabatch::cuda_rt::fail_call(#call, cublasLt_status_name(mb_st_), __FILE__, __LINE__);        \
  } while (0)

#define MB_CUDA_LAUNCHED(kernel) ::megabatch::cuda_rt::check_launch(kernel, __FILE__, __LINE__)

inline const char* cublasLt_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
  }
}
