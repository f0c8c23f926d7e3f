// Reductions on a GPU in a fixed order: a block per piece of a fixed size, then the pieces
// added in order (no atomics), accumulated in double.
#include <vector>

#include "core/ops/backends.h"
#include "core/ops/cuda/common.cuh"

namespace megabatch::ops::MB_CUDA_BACKEND {
namespace {

constexpr int kThreads = 512;
constexpr int64_t kPiece = 65536;

template <typename O, typename T>
__global__ void sum_kernel(O* out, const T* x, int64_t n, bool accumulate) {
  MB_SHARED_ARRAY(double, scratch, 32);
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(to_f32(x[i]));
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) out[0] = static_cast<O>((accumulate ? static_cast<double>(out[0]) : 0.0) + s);
}

struct Weights {
  double w[8];
};

template <typename O, typename I>
__global__ void weighted_accumulate_kernel(O* out, const I* x, Weights w, int n) {
  const int k = threadIdx.x;
  if (k < n) out[k] = static_cast<O>(static_cast<double>(out[k]) + w.w[k] * static_cast<double>(x[k]));
}

// partial[p] = sum of x[begin_p, end_p)^2; with prev, of (x - prev)^2, and prev = x there
__global__ void square_partials_kernel(double* partial, const float* x, float* prev, const int64_t* begin,
                                       const int64_t* end) {
  MB_SHARED_ARRAY(double, scratch, 32);
  const int64_t p = blockIdx.x;
  double s = 0;
  for (int64_t i = begin[p] + threadIdx.x; i < end[p]; i += blockDim.x) {
    float v = x[i];
    if (prev) {
      const float d = v - prev[i];
      prev[i] = v;
      v = d;
    }
    s += static_cast<double>(v) * v;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[p] = s;
}

// out[s] = sum of the partials of segment s (pieces [first_s, first_{s+1})), in order
__global__ void segment_totals_kernel(double* out, const double* partial, const int64_t* first, int64_t segments) {
  const int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (s >= segments) return;
  double t = 0;
  for (int64_t p = first[s]; p < first[s + 1]; ++p) t += partial[p];
  out[s] = t;
}

// out[s] = the sum over segment s of x^2 or, with prev, of (x - prev)^2 (then prev = x)
void sum_squares_over(const Tensor& out, const Tensor& x, float* prev,
                      const std::vector<std::pair<size_t, size_t>>& segments) {
  std::vector<int64_t> begin, end, first{0};
  for (const auto& [b, e] : segments) {
    for (int64_t p = static_cast<int64_t>(b); p < static_cast<int64_t>(e); p += kPiece) {
      begin.push_back(p);
      end.push_back(std::min<int64_t>(p + kPiece, static_cast<int64_t>(e)));
    }
    first.push_back(static_cast<int64_t>(begin.size()));
  }
  const Device dev = x.device();
  const cudaStream_t s = stream_of(x);
  const int64_t pieces = static_cast<int64_t>(begin.size());
  Tensor partial({std::max<int64_t>(pieces, 1)}, DType::kF64, dev);
  Tensor bt({std::max<int64_t>(pieces, 1)}, DType::kF64, dev), et(bt.shape(), DType::kF64, dev),
      ft({static_cast<int64_t>(first.size())}, DType::kF64, dev);  // int64 payloads in 8-byte tensors
  if (pieces > 0) {
    runtime::copy_bytes(bt.raw(), dev, begin.data(), Device::cpu(), begin.size() * 8);
    runtime::copy_bytes(et.raw(), dev, end.data(), Device::cpu(), end.size() * 8);
    launch(square_partials_kernel, dim3(static_cast<unsigned>(pieces)), kThreads, 0, s, "square_partials_kernel",
           ptr<double>(partial), ptr<float>(x), prev, static_cast<const int64_t*>(bt.raw()),
           static_cast<const int64_t*>(et.raw()));
  }
  runtime::copy_bytes(ft.raw(), dev, first.data(), Device::cpu(), first.size() * 8);
  const int64_t S = static_cast<int64_t>(segments.size());
  if (S == 0) return;
  launch(segment_totals_kernel, dim3(blocks_for(S, 128)), 128, 0, s, "segment_totals_kernel", ptr<double>(out),
         ptr<double>(partial), static_cast<const int64_t*>(ft.raw()), S);
}

}  // namespace

void sum(const Tensor& out, const Tensor& x, bool accumulate) {
  // into an f32 or f64 result, as the dispatcher allows
  with_type<accepts::sum_x.cuda.bits>(x.dtype(), "sum", [&](auto zero) {
    using T = decltype(zero);
    with_type<accepts::sum_out.cuda.bits>(out.dtype(), "sum", [&](auto out_zero) {
      using O = decltype(out_zero);
      launch(sum_kernel<O, T>, dim3(1), 1024, 0, stream_of(x), "sum_kernel", ptr<O>(out), ptr<T>(x),
             static_cast<int64_t>(x.numel()), accumulate);
    });
  });
}

void weighted_accumulate(const Tensor& out, const Tensor& x, const std::vector<double>& weights) {
  Weights w{};
  for (size_t k = 0; k < weights.size(); ++k) w.w[k] = weights[k];
  const int n = static_cast<int>(weights.size());
  // f32 or f64 terms (a loss's sums, the noise scale's f64 norms) into f32 or f64 slots
  with_type<accepts::weighted_accumulate_out.cuda.bits>(out.dtype(), "weighted_accumulate", [&](auto out_zero) {
    using O = decltype(out_zero);
    with_type<accepts::weighted_accumulate_x.cuda.bits>(x.dtype(), "weighted_accumulate", [&](auto x_zero) {
      using X = decltype(x_zero);
      launch(weighted_accumulate_kernel<O, X>, dim3(1), 32, 0, stream_of(x), "weighted_accumulate_kernel", ptr<O>(out),
             ptr<X>(x), w, n);
    });
  });
}

// sum_squares_over reads x as f32 and writes f64 sums
static_assert(takes_only<accepts::segment_sum_squares_x.cuda.bits, float>() &&
              takes_only<accepts::segment_sum_squares_out.cuda.bits, double>() &&
              takes_only<accepts::segment_sum_squares_of_growth_x.cuda.bits, float>() &&
              takes_only<accepts::segment_sum_squares_of_growth_out.cuda.bits, double>());

void segment_sum_squares(const Tensor& out, const Tensor& x, const std::vector<std::pair<size_t, size_t>>& segments) {
  sum_squares_over(out, x, nullptr, segments);
}

void segment_sum_squares_of_growth(const Tensor& out, const Tensor& x, const Tensor& prev,
                                   const std::vector<std::pair<size_t, size_t>>& segments) {
  sum_squares_over(out, x, ptr<float>(prev), segments);
}

}  // namespace megabatch::ops::MB_CUDA_BACKEND
