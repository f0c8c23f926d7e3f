// Matrix multiply on a GPU: cuBLASLt for the products, small kernels for the bias.
#include <cublasLt.h>

#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/device/allocator.h"
#include "core/device/cuda/cublaslt.h"
#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"
#include "core/ops/cuda/gemm.h"

namespace megabatch::ops::cuda {
namespace {

using cuda_rt::cublaslt;

constexpr size_t kWorkspace = size_t{32} << 20;

// cuBLASLt's type of each dtype the GEMM rows of core/ops/accepts.inc give CUDA (and a
// failure here for any other would be a bug: the public op refused it)
static_assert(accepts::gemm_A.cuda == accepts::kDeviceActivations && accepts::linear_forward_in.cuda == accepts::kDeviceActivations &&
              accepts::linear_backward_dout.cuda == accepts::kDeviceActivations &&
              accepts::linear_gelu_forward_in.cuda == accepts::kDeviceActivations &&
              accepts::linear_backward_gelu_dout.cuda == accepts::kDeviceActivations);
cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: fail("internal error: gemm: a ", dtype_name(d), " tensor reached cuBLASLt");
  }
}

int alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && a % static_cast<uintptr_t>(al) != 0) al /= 2;
  return al;
}

// Everything that decides the descriptors and the algorithm (not the pointers' values).
using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int64_t, int64_t,
                       int64_t, int64_t, bool, int, int, int, int, int, int>;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLAS's A (our B), B (our A), C
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // an algorithm for it (else lt_gemm fails, naming the product)
};

struct Context {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<Key, Plan> plans;
};

std::mutex g_mu;
Context& context(Device d) {
  static auto* contexts = new std::map<int, Context>();  // lives until exit
  Context& c = (*contexts)[d.index];
  if (!c.handle) {
    MB_CUBLAS_CHECK(cublaslt().Create(&c.handle));
    c.workspace = allocator(d).allocate(kWorkspace);
  }
  return c;
}

cublasLtMatrixLayout_t layout(DType t, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  MB_CUBLAS_CHECK(
      cublaslt().MatrixLayoutCreate(&l, cuda_type(t), static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    MB_CUBLAS_CHECK(cublaslt().MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    MB_CUBLAS_CHECK(
        cublaslt().MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return l;
}

Plan make_plan(Context& ctx, const GemmArgs& g) {
  // Row-major C (M x N) = op(A) op(B) is column-major C^T (N x M) = op(B)^T op(A)^T: cuBLAS's
  // first operand is our B, its second our A. A row-major (r x c) matrix with leading
  // dimension ld is a column-major (c x r) one with the same ld.
  const int64_t rows_a = g.ta == Trans::N ? g.M : g.K, cols_a = g.ta == Trans::N ? g.K : g.M;
  const int64_t rows_b = g.tb == Trans::N ? g.K : g.N, cols_b = g.tb == Trans::N ? g.N : g.K;
  Plan p;
  MB_CUBLAS_CHECK(cublaslt().MatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_first = g.tb == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t op_second = g.ta == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T;
  MB_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
  MB_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
  if (g.gelu != GemmArgs::Gelu::kNone) {
    // cuBLAS's D is our C transposed, so the aux matrix (our M x N, row-major) is its N x M
    // with C's leading dimension; the bias runs along cuBLAS's rows, our columns.
    const cublasLtEpilogue_t epi = g.gelu == GemmArgs::Gelu::kBackward ? CUBLASLT_EPILOGUE_DGELU
                                   : g.bias                            ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                       : CUBLASLT_EPILOGUE_GELU_AUX;
    MB_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    const int64_t aux_ld = g.ldc;
    MB_CUBLAS_CHECK(
        cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
    MB_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.gelu_aux,
                                                      sizeof g.gelu_aux));
    if (g.bias)
      MB_CUBLAS_CHECK(
          cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  } else if (g.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    MB_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    MB_CUBLAS_CHECK(
        cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  }
  p.a = layout(g.ab, cols_b, rows_b, g.ldb, g.batch, g.stride_b);
  p.b = layout(g.ab, cols_a, rows_a, g.lda, g.batch, g.stride_a);
  p.c = layout(g.c, g.N, g.M, g.ldc, g.batch, g.stride_c);
  cublasLtMatmulPreference_t pref = nullptr;
  MB_CUBLAS_CHECK(cublaslt().MatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspace;
  MB_CUBLAS_CHECK(
      cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  const uint32_t al_a = static_cast<uint32_t>(alignment(g.B)), al_b = static_cast<uint32_t>(alignment(g.A)),
                 al_c = static_cast<uint32_t>(alignment(g.C));
  MB_CUBLAS_CHECK(
      cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
  MB_CUBLAS_CHECK(
      cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
  MB_CUBLAS_CHECK(
      cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
  MB_CUBLAS_CHECK(
      cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublaslt().MatmulAlgoGetHeuristic(ctx.handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublaslt().MatmulPreferenceDestroy(pref);
  p.found = st == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p.found) p.algo = result.algo;
  return p;
}

// The plan of g's shapes, made on first use (the caller holds g_mu).
Plan& plan_for(Context& ctx, const GemmArgs& g) {
  const Key key{static_cast<int>(g.ta), static_cast<int>(g.tb), g.M, g.N, g.K, g.lda, g.ldb, g.ldc,
                static_cast<int>(g.ab), static_cast<int>(g.c), g.batch, g.stride_a, g.stride_b, g.stride_c,
                g.bias != nullptr, alignment(g.A), alignment(g.B), alignment(g.C), alignment(g.bias),
                static_cast<int>(g.gelu), alignment(g.gelu_aux)};
  auto it = ctx.plans.find(key);
  if (it == ctx.plans.end()) it = ctx.plans.emplace(key, make_plan(ctx, g)).first;
  return it->second;
}

// What a GELU epilogue needs before cuBLASLt is asked: no accumulation, one batch, the aux
// matrix 16-byte aligned with a leading dimension of whole 16-byte vectors.
bool gelu_epilogue_fits(const GemmArgs& g) {
  return g.beta == 0.0f && g.batch == 1 && alignment(g.gelu_aux) >= 16 && (g.ldc * dtype_size(g.c)) % 16 == 0;
}

}  // namespace

bool lt_gemm_if_found(Device device, cudaStream_t stream, const GemmArgs& g) {
  if (g.M == 0 || g.N == 0 || g.batch == 0) return true;
  check(!g.bias || g.beta == 0.0f, "internal error: gemm bias epilogue with beta != 0");
  if (g.gelu != GemmArgs::Gelu::kNone && !gelu_epilogue_fits(g)) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  Context& ctx = context(device);
  Plan& p = plan_for(ctx, g);
  if (!p.found) return false;
  if (g.bias)
    MB_CUBLAS_CHECK(
        cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  if (g.gelu != GemmArgs::Gelu::kNone)
    MB_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.gelu_aux,
                                                      sizeof g.gelu_aux));
  MB_CUBLAS_CHECK(cublaslt().Matmul(ctx.handle, p.desc, &g.alpha, g.B, p.a, g.A, p.b, &g.beta, g.C, p.c, g.C, p.c,
                                    &p.algo, ctx.workspace, kWorkspace, stream));
  return true;
}

void lt_gemm(Device device, cudaStream_t stream, const GemmArgs& g) {
  if (!lt_gemm_if_found(device, stream, g))
    fail("cuBLASLt has no algorithm for a ", dtype_name(g.ab), " -> ", dtype_name(g.c), " product of ", g.M, "x", g.K,
         " by ", g.K, "x", g.N, " (batch ", g.batch, g.gelu != GemmArgs::Gelu::kNone ? ", GELU epilogue" : "", ")");
}

namespace {

// x(n, O) += bias(O)
template <typename T>
__global__ void bias_add_kernel(T* x, const T* bias, int64_t n, int64_t O) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * O;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = from_f32<T>(to_f32(x[i]) + to_f32(bias[i % O]));
}

// Column sums in two fixed-order passes: partial[k][c] = sum of rows [k R, (k + 1) R) of
// column c, then out[c] += sum over k in order. Deterministic, and parallel over rows too.
constexpr int64_t kSumRows = 64;

template <typename T>
__global__ void column_partials_kernel(float* partial, const T* x, int64_t n, int64_t O) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= O) return;
  const int64_t r0 = blockIdx.y * kSumRows, r1 = min(n, r0 + kSumRows);
  float s = 0;
  for (int64_t i = r0; i < r1; ++i) s += to_f32(x[i * O + c]);
  partial[blockIdx.y * O + c] = s;
}

__global__ void add_partials_kernel(float* out, const float* partial, int64_t chunks, int64_t O) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= O) return;
  float s = 0;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * O + c];
  out[c] += s;
}

int64_t rows(const Tensor& t) { return t.shape().back() ? static_cast<int64_t>(t.numel()) / t.shape().back() : 0; }

// out (n, O) = in (n, I) W (O, I)^T (+ bias)
GemmArgs forward_args(const Tensor& out, const Tensor& in, const Tensor& weight, const Tensor& bias) {
  GemmArgs g;
  g.ta = Trans::N;
  g.tb = Trans::T;
  g.M = rows(in);
  g.N = weight.dim(0);
  g.K = weight.dim(1);
  g.A = in.raw();
  g.B = weight.raw();
  g.C = out.raw();
  g.lda = g.K;
  g.ldb = g.K;
  g.ldc = g.N;
  g.ab = g.c = in.dtype();
  g.bias = bias.defined() ? bias.raw() : nullptr;
  return g;
}

// din (n, I) = dout (n, O) W (O, I) + beta din
GemmArgs din_args(const Tensor& din, const Tensor& dout, const Tensor& weight, float beta) {
  GemmArgs g;
  g.M = rows(dout), g.N = weight.dim(1), g.K = weight.dim(0);
  g.A = dout.raw(), g.B = weight.raw(), g.C = din.raw();
  g.lda = g.K, g.ldb = g.N, g.ldc = g.N;
  g.ab = g.c = dout.dtype();
  g.beta = beta;
  return g;
}

// dW (O, I) += dout^T (O, n) in (n, I), accumulated in fp32
void add_dweight(const Tensor& dweight, const Tensor& dout, const Tensor& in, const Tensor& weight) {
  GemmArgs g;
  g.ta = Trans::T;
  g.M = weight.dim(0), g.N = weight.dim(1), g.K = rows(in);
  g.A = dout.raw(), g.B = in.raw(), g.C = dweight.raw();
  g.lda = g.M, g.ldb = g.N, g.ldc = g.N;
  g.ab = dout.dtype();
  g.c = DType::kF32;
  g.beta = 1.0f;
  lt_gemm(dweight.device(), stream_of(dweight), g);
}

}  // namespace

void gemm(const Tensor& C, const Tensor& A, Trans ta, const Tensor& B, Trans tb, float alpha, float beta) {
  GemmArgs g;
  g.ta = ta;
  g.tb = tb;
  g.M = C.dim(0);
  g.N = C.dim(1);
  g.K = ta == Trans::N ? A.dim(1) : A.dim(0);
  g.A = A.raw();
  g.B = B.raw();
  g.C = C.raw();
  g.lda = A.dim(1);
  g.ldb = B.dim(1);
  g.ldc = C.dim(1);
  g.ab = A.dtype();
  g.c = C.dtype();
  g.alpha = alpha;
  g.beta = beta;
  lt_gemm(C.device(), stream_of(C), g);
}

void linear_forward(const Tensor& out, const Tensor& in, const Tensor& weight, const Tensor& bias) {
  lt_gemm(out.device(), stream_of(out), forward_args(out, in, weight, bias));
}

void linear_backward(const Tensor& din, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& in, const Tensor& weight, Write din_write) {
  if (din.defined())
    lt_gemm(din.device(), stream_of(din), din_args(din, dout, weight, din_write == Write::kAdd ? 1.0f : 0.0f));
  if (dweight.defined()) add_dweight(dweight, dout, in, weight);
  if (dbias.defined()) bias_backward(dbias, dout);
}

void linear_gelu_forward(const Tensor& out, const Tensor& pre, const Tensor& in, const Tensor& weight,
                         const Tensor& bias) {
  GemmArgs g = forward_args(out, in, weight, bias);
  g.gelu = GemmArgs::Gelu::kForward;
  g.gelu_aux = pre.raw();
  if (lt_gemm_if_found(out.device(), stream_of(out), g)) return;
  cuda::linear_forward(pre, in, weight, bias);
  cuda::gelu_forward(out, pre);
}

void linear_backward_gelu(const Tensor& dpre, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                          const Tensor& in, const Tensor& weight, const Tensor& pre) {
  GemmArgs g = din_args(dpre, dout, weight, 0.0f);
  g.gelu = GemmArgs::Gelu::kBackward;
  g.gelu_aux = pre.raw();  // read: DGELU's input
  if (!lt_gemm_if_found(dpre.device(), stream_of(dpre), g)) {
    g.gelu = GemmArgs::Gelu::kNone;
    g.gelu_aux = nullptr;
    lt_gemm(dpre.device(), stream_of(dpre), g);
    cuda::gelu_backward(dpre, dpre, pre, Write::kSet);
  }
  if (dweight.defined()) add_dweight(dweight, dout, in, weight);
  if (dbias.defined()) bias_backward(dbias, dout);
}

void bias_add(const Tensor& x, const Tensor& bias) {
  const int64_t O = bias.numel(), n = rows(x);
  with_type<accepts::bias_add_x.cuda.bits>(x.dtype(), "bias_add", [&](auto zero) {
    using T = decltype(zero);
    bias_add_kernel<T><<<blocks_for(n * O, 256), 256, 0, stream_of(x)>>>(ptr<T>(x), ptr<T>(bias), n, O);
    MB_CUDA_LAUNCHED("bias_add_kernel");
  });
}

void bias_backward(const Tensor& dbias, const Tensor& dx) {
  const int64_t O = dbias.numel(), n = rows(dx), chunks = (n + kSumRows - 1) / kSumRows;
  if (n == 0) return;
  Tensor partial({chunks, O}, DType::kF32, dx.device());
  with_type<accepts::bias_backward_dx.cuda.bits>(dx.dtype(), "bias_backward", [&](auto zero) {
    using T = decltype(zero);
    const dim3 grid(static_cast<unsigned>((O + 127) / 128), static_cast<unsigned>(chunks));
    column_partials_kernel<T><<<grid, 128, 0, stream_of(dx)>>>(ptr<float>(partial), ptr<T>(dx), n, O);
    MB_CUDA_LAUNCHED("column_partials_kernel");
  });
  add_partials_kernel<<<blocks_for(O, 128), 128, 0, stream_of(dx)>>>(ptr<float>(dbias), ptr<float>(partial), chunks, O);
  MB_CUDA_LAUNCHED("add_partials_kernel");
}

}  // namespace megabatch::ops::cuda
