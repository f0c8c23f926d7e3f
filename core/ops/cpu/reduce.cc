// Reductions on the CPU, in a fixed order.
#include <algorithm>
#include <vector>

#include "core/ops/backends.h"
#include "core/ops/cpu/f32.h"

namespace megabatch::ops::cpu {

void sum(const Tensor& out, const Tensor& x, bool accumulate) {
  double s = 0;
  with_compute_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> v(x);
    for (size_t i = 0; i < x.numel(); ++i) s += static_cast<double>(v.get()[i]);
  });
  if (out.dtype() == DType::kF64)
    out.data<double>()[0] = (accumulate ? out.data<double>()[0] : 0.0) + s;
  else
    out.data<float>()[0] = static_cast<float>((accumulate ? static_cast<double>(out.data<float>()[0]) : 0.0) + s);
}

void weighted_accumulate(const Tensor& out, const Tensor& x, const std::vector<double>& weights) {
  for (size_t k = 0; k < weights.size(); ++k) {
    const double v = weights[k] * (x.dtype() == DType::kF64 ? x.data<double>()[k] : static_cast<double>(x.data<float>()[k]));
    if (out.dtype() == DType::kF64)
      out.data<double>()[k] += v;
    else
      out.data<float>()[k] = static_cast<float>(static_cast<double>(out.data<float>()[k]) + v);
  }
}

namespace {

// out[s] = the sum over segment s of chunk_sum(begin, end) over fixed chunks of it, the
// chunks' partials added in order: the result does not depend on the thread count.
template <typename ChunkSum>
void segment_sums(const Tensor& out, const std::vector<std::pair<size_t, size_t>>& segments, ChunkSum chunk_sum) {
  constexpr int64_t kChunk = 16384;
  struct Piece {
    size_t segment;
    int64_t begin, end;
  };
  std::vector<Piece> pieces;
  for (size_t s = 0; s < segments.size(); ++s)
    for (int64_t b = static_cast<int64_t>(segments[s].first); b < static_cast<int64_t>(segments[s].second); b += kChunk)
      pieces.push_back({s, b, std::min<int64_t>(b + kChunk, static_cast<int64_t>(segments[s].second))});
  std::vector<double> partial(pieces.size());
  const int64_t count = static_cast<int64_t>(pieces.size());
#pragma omp parallel for schedule(static) if (count > 1)
  for (int64_t p = 0; p < count; ++p) partial[p] = chunk_sum(pieces[p].begin, pieces[p].end);
  double* o = out.data<double>();
  for (size_t s = 0; s < segments.size(); ++s) o[s] = 0;
  for (size_t p = 0; p < pieces.size(); ++p) o[pieces[p].segment] += partial[p];
}

// The chunks' loops, out of the lambdas: written inside them, GCC reloaded the captured
// pointers from the closure on every element (the reduction's private copy is zeroed by a
// memset that "clobbers memory") and ran them one scalar double FMA at a time, a latency
// chain at about 1 ns per element.
double sum_squares(const float* x, int64_t n) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t j = 0; j < n; ++j) acc += static_cast<double>(x[j]) * x[j];
  return acc;
}

double growth_sum_squares(const float* x, float* before, int64_t n) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t j = 0; j < n; ++j) {
    const float d = x[j] - before[j];
    acc += static_cast<double>(d) * d;
    before[j] = x[j];
  }
  return acc;
}

}  // namespace

void segment_sum_squares(const Tensor& out, const Tensor& x, const std::vector<std::pair<size_t, size_t>>& segments) {
  const float* g = x.data<float>();
  segment_sums(out, segments, [g](int64_t begin, int64_t end) { return sum_squares(g + begin, end - begin); });
}

void segment_sum_squares_of_growth(const Tensor& out, const Tensor& x, const Tensor& prev,
                                   const std::vector<std::pair<size_t, size_t>>& segments) {
  const float* g = x.data<float>();
  float* before = prev.data<float>();
  segment_sums(out, segments,
               [g, before](int64_t begin, int64_t end) { return growth_sum_squares(g + begin, before + begin, end - begin); });
}

}  // namespace megabatch::ops::cpu
