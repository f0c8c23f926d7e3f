// Embedding lookup and the fused log-softmax cross entropy.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/ops/cpu/vecmath.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/embedding.h"

namespace megabatch::ops {

template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int64_t n, int64_t C, int64_t row_begin,
                       int64_t rows) {
#pragma omp parallel for schedule(static) if (n * C > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = static_cast<int64_t>(ids[i]) - row_begin;
    if (r >= 0 && r < rows)
      std::memcpy(out + i * C, table + r * C, sizeof(T) * C);
    else
      std::memset(out + i * C, 0, sizeof(T) * C);
  }
}

template <typename T>
void embedding_backward(T* dtable, const T* dout, const int32_t* ids, int64_t n, int64_t C, int64_t row_begin,
                        int64_t rows) {
  constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static) if (n * C > 65536)
  for (int64_t c0 = 0; c0 < C; c0 += kCols) {
    const int64_t c1 = std::min(C, c0 + kCols);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = static_cast<int64_t>(ids[i]) - row_begin;
      if (r < 0 || r >= rows) continue;
      T* dst = dtable + r * C;
      const T* src = dout + i * C;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

template <typename T>
void ce_row_max(T* rowmax, const T* logits, int64_t n, int64_t V) {
#pragma omp parallel for schedule(static) if (n * V > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const T* l = logits + i * V;
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < V; ++j) m = std::max(m, l[j]);
    rowmax[i] = m;
  }
}

template <typename T>
void ce_sum_exp(T* sumexp, const T* logits, const T* rowmax, int64_t n, int64_t V) {
#pragma omp parallel for schedule(static) if (n * V > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const T* l = logits + i * V;
    const T m = rowmax[i];
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < V; ++j) s += cpu::vexp(l[j] - m);
    sumexp[i] = s;
  }
}

template <typename T>
void ce_target_logit(T* target_logit, const T* logits, const int32_t* targets, int64_t n, int64_t V,
                     int64_t v_begin) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = static_cast<int64_t>(targets[i]) - v_begin;
    target_logit[i] = (t >= 0 && t < V) ? logits[i * V + t] : T(0);
  }
}

template <typename T>
void ce_loss(T* losses, const T* rowmax, const T* sumexp, const T* target_logit, const int32_t* targets, int64_t n,
             int32_t ignore) {
  for (int64_t i = 0; i < n; ++i)
    losses[i] = targets[i] == ignore ? T(0) : std::log(sumexp[i]) + rowmax[i] - target_logit[i];
}

template <typename T>
void ce_backward(T* dlogits, const T* logits, const T* rowmax, const T* sumexp, const int32_t* targets,
                 const T* dloss, int64_t n, int64_t V, int64_t v_begin, int32_t ignore) {
#pragma omp parallel for schedule(static) if (n * V > 65536)
  for (int64_t i = 0; i < n; ++i) {
    if (targets[i] == ignore) continue;
    const T* l = logits + i * V;
    T* d = dlogits + i * V;
    const T m = rowmax[i], g = dloss[i] / sumexp[i];
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) d[j] += g * cpu::vexp(l[j] - m);
    const int64_t t = static_cast<int64_t>(targets[i]) - v_begin;
    if (t >= 0 && t < V) d[t] -= dloss[i];
  }
}

template <typename T>
void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int64_t n, int64_t V,
                           int32_t ignore) {
  std::vector<T> m(n), s(n), tl(n);
  ce_row_max(m.data(), logits, n, V);
  ce_sum_exp(s.data(), logits, m.data(), n, V);
  ce_target_logit(tl.data(), logits, targets, n, V, 0);
  ce_loss(losses, m.data(), s.data(), tl.data(), targets, n, ignore);
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, const T* dloss, int64_t n,
                            int64_t V, int32_t ignore) {
  std::vector<T> m(n), s(n);
  ce_row_max(m.data(), logits, n, V);
  ce_sum_exp(s.data(), logits, m.data(), n, V);
  ce_backward(dlogits, logits, m.data(), s.data(), targets, dloss, n, V, 0, ignore);
}

#define MB_INSTANTIATE(T)                                                                                        \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t, int64_t, int64_t);          \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t);         \
  template void ce_row_max<T>(T*, const T*, int64_t, int64_t);                                                   \
  template void ce_sum_exp<T>(T*, const T*, const T*, int64_t, int64_t);                                         \
  template void ce_target_logit<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);                     \
  template void ce_loss<T>(T*, const T*, const T*, const T*, const int32_t*, int64_t, int32_t);                  \
  template void ce_backward<T>(T*, const T*, const T*, const T*, const int32_t*, const T*, int64_t, int64_t,     \
                               int64_t, int32_t);                                                                \
  template void cross_entropy_forward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int32_t);               \
  template void cross_entropy_backward<T>(T*, const T*, const int32_t*, const T*, int64_t, int64_t, int32_t);
MB_INSTANTIATE(float)
MB_INSTANTIATE(double)
#undef MB_INSTANTIATE

}  // namespace megabatch::ops
