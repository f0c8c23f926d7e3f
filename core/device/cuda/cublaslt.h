// cuBLASLt, loaded on the first GEMM on a GPU instead of at program start. Its static
// initializers took about 0.16 s of CPU and 210 MB of memory (a CUDA build's `train --help`:
// 190 ms and 230 MB peak when linked, 33 ms and 21 MB without), paid by every process that
// linked it: CPU-only runs, each `train --check` of a sweep's dry run, each test process. Only matmul.cu calls it,
// through cublaslt() below, with cuBLASLt's own names less the prefix: cublaslt().MatmulDescCreate(...).
#pragma once

#include <cublasLt.h>

// Every cuBLASLt function megabatch calls, as X(name without "cublasLt").
// clang-format off
#define MB_CUBLASLT_FUNCTIONS(X)                                                       \
  X(Create)                                                                            \
  X(MatrixLayoutCreate) X(MatrixLayoutSetAttribute)                                    \
  X(MatmulDescCreate) X(MatmulDescSetAttribute)                                        \
  X(MatmulPreferenceCreate) X(MatmulPreferenceSetAttribute) X(MatmulPreferenceDestroy) \
  X(MatmulAlgoGetHeuristic) X(Matmul)
// clang-format on

namespace megabatch::cuda_rt {

struct CublasLt {
#define MB_CUBLASLT_POINTER(name) decltype(&::cublasLt##name) name = nullptr;
  MB_CUBLASLT_FUNCTIONS(MB_CUBLASLT_POINTER)
#undef MB_CUBLASLT_POINTER
};

// The library (libcublasLt.so.<the major version built against>), loaded and its functions
// found on the first call; a library that is missing or lacks one is an Error naming it.
const CublasLt& cublaslt();

// The file name cublaslt() loads.
const char* cublaslt_library();

}  // namespace megabatch::cuda_rt
