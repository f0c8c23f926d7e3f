// cuBLASLt is loaded at the first GEMM on a GPU, not at program start
// (core/device/cuda/cublaslt.h): `train`, which holds every op, starts without loading it;
// the first cublaslt() loads the library of the version megabatch was built against and finds
// every function megabatch calls, which then work (descriptors need no GPU).
#include <gtest/gtest.h>

#include <string>

#include "core/device/cuda/cublaslt.h"
#include "core/util/files.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;

namespace {

namespace rt = mb::cuda_rt;

bool mapped(const std::string& library) {
  return mb::read_file("/proc/self/maps", "memory map").find(library) != std::string::npos;
}

TEST(CublasLt, TrainStartsWithoutLoadingIt) {
  // the dynamic loader names every library it loads (LD_DEBUG=files)
  const auto r = mb::testing::run_command("LD_DEBUG=files " + mb::testing::bin_dir() + "/train --help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_NE(r.output.find("libmpi"), std::string::npos) << "the loader named no libraries:\n" << r.output;
  EXPECT_EQ(r.output.find("libcublasLt"), std::string::npos) << "train loaded cuBLASLt at start:\n" << r.output;
}

TEST(CublasLt, IsLoadedAtTheFirstUseWithEveryFunctionMegabatchCalls) {
  const std::string library = rt::cublaslt_library();
  EXPECT_EQ(library, "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR));
  const rt::CublasLt& f = rt::cublaslt();
  EXPECT_TRUE(mapped(library)) << library << " is not mapped after cublaslt()";
#define MB_EXPECT_FOUND(name) EXPECT_NE(f.name, nullptr) << "cublasLt" #name;
  MB_CUBLASLT_FUNCTIONS(MB_EXPECT_FOUND)
#undef MB_EXPECT_FOUND
  EXPECT_EQ(&rt::cublaslt(), &f) << "loaded once";

  // Called through the table: a matmul descriptor and a layout, set, and a preference freed
  cublasLtMatmulDesc_t desc = nullptr;
  ASSERT_EQ(f.MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t t = CUBLAS_OP_T;
  EXPECT_EQ(f.MatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(f.MatrixLayoutCreate(&layout, CUDA_R_32F, 4, 8, 4), CUBLAS_STATUS_SUCCESS);
  const int32_t count = 3;
  EXPECT_EQ(f.MatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(f.MatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(f.MatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
  // desc and layout live until exit, as matmul.cu's plans do (freeing them directly would link cuBLASLt)
}

}  // namespace
