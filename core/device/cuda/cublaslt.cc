#include "core/device/cuda/cublaslt.h"

#include <dlfcn.h>

#include "core/util/error.h"

namespace megabatch::cuda_rt {

namespace {

#define MB_STRINGIFY_(x) #x
#define MB_STRINGIFY(x) MB_STRINGIFY_(x)
constexpr const char* kLibrary = "libcublasLt.so." MB_STRINGIFY(CUBLAS_VER_MAJOR);

CublasLt load() {
  // RTLD_LOCAL: its symbols are for these pointers only, not for resolving other libraries'
  void* lib = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    fail("cannot load cuBLASLt (", dlerror(), "), which a GEMM on a GPU needs: install CUDA's cuBLAS ",
         CUBLAS_VER_MAJOR, ".x, or put the directory that holds ", kLibrary, " in LD_LIBRARY_PATH");
  CublasLt f;
  // dlsym gives a void*; POSIX guarantees it converts to a function pointer
#define MB_CUBLASLT_FIND(name)                                                                                    \
  f.name = reinterpret_cast<decltype(f.name)>(dlsym(lib, "cublasLt" #name));                                      \
  check(f.name != nullptr, kLibrary, " has no cublasLt" #name ": it is older than the cuBLAS ", CUBLAS_VER_MAJOR, \
        ".x megabatch was built against; install that version");
  MB_CUBLASLT_FUNCTIONS(MB_CUBLASLT_FIND)
#undef MB_CUBLASLT_FIND
  return f;  // the library stays loaded until exit
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt functions = load();  // a thread-safe first load; an Error is retried on the next call
  return functions;
}

const char* cublaslt_library() { return kLibrary; }

}  // namespace megabatch::cuda_rt
