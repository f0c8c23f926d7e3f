// The pieces of the vocabulary-parallel cross entropy on the CPU.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/ops/backends.h"
#include "core/ops/cpu/f32.h"
#include "core/ops/cpu/vecmath.h"

namespace megabatch::ops::cpu {

namespace {
// One row's steps, shared by the pieces and ce_whole_rows so that both compute the same.
// The largest logit, as std::max(m, l[j]) (a NaN logit is passed over here and poisons
// the sum of exps).
template <typename T>
T row_max(const T* l, int64_t V) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < V; ++j) m = l[j] > m ? l[j] : m;
  return m;
}

// sum_j exp(l_j - m); with kKeep the logits become those exps.
template <bool kKeep, typename T>
T row_sum_exps(T* l, int64_t V, T m) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < V; ++j) {
    const T e = vexp(l[j] - m);
    if constexpr (kKeep) l[j] = e;
    s += e;
  }
  return s;
}

// d = g e (d may be e), then the target column, when the row is counted and holds it, less dloss.
template <typename T>
void row_gradient(T* d, const T* e, int64_t V, T g, int64_t target, bool counted, T dloss) {
#pragma omp simd
  for (int64_t j = 0; j < V; ++j) d[j] = g * e[j];
  if (counted && target >= 0 && target < V) d[target] -= dloss;
}

// The loss's gradient scale: scale times the loss scaler's value (1 without one).
template <typename T>
T dloss_of(float scale, const Tensor& loss_scale) {
  return static_cast<T>(scale) * static_cast<T>(loss_scale.defined() ? loss_scale.data<float>()[0] : 1.0f);
}

// sumexp(n) = sum_j exp(l_ij - rowmax_i); with kKeep the logits become those exps.
template <bool kKeep>
void sum_exps(const Tensor& sumexp, const Tensor& logits, const Tensor& rowmax) {
  with_compute_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    Out<T> ls(logits, true);  // read, and written back only when the exps are kept
    In<T> ms(rowmax);
    Out<T> ss(sumexp, false);
    const int64_t n = logits.dim(0), V = logits.dim(1);
#pragma omp parallel for schedule(static) if (n * V > 65536)
    for (int64_t i = 0; i < n; ++i) ss.get()[i] = row_sum_exps<kKeep>(ls.get() + i * V, V, ms.get()[i]);
    if constexpr (kKeep) ls.commit();
  });
}
}  // namespace

void ce_row_max(const Tensor& rowmax, const Tensor& logits) {
  with_compute_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> ls(logits);
    Out<T> ms(rowmax, false);
    const int64_t n = logits.dim(0), V = logits.dim(1);
#pragma omp parallel for schedule(static) if (n * V > 65536)
    for (int64_t i = 0; i < n; ++i) ms.get()[i] = row_max(ls.get() + i * V, V);
  });
}

void ce_sum_exp(const Tensor& sumexp, const Tensor& logits, const Tensor& rowmax) {
  sum_exps<false>(sumexp, logits, rowmax);
}

void ce_target_logit(const Tensor& target, const Tensor& logits, const Tensor& targets, int64_t v_begin) {
  with_compute_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> ls(logits);
    Out<T> ts(target, false);
    const int32_t* tg = targets.data<int32_t>();
    const int64_t n = logits.dim(0), V = logits.dim(1);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = static_cast<int64_t>(tg[i]) - v_begin;
      ts.get()[i] = (t >= 0 && t < V) ? ls.get()[i * V + t] : T(0);
    }
  });
}

void ce_loss(const Tensor& losses, const Tensor& rowmax, const Tensor& sumexp, const Tensor& target,
             const Tensor& targets, int32_t ignore) {
  with_compute_type(losses.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> ms(rowmax), ss(sumexp), ts(target);
    Out<T> out(losses, false);
    const int32_t* tg = targets.data<int32_t>();
    for (size_t i = 0; i < losses.numel(); ++i)
      out.get()[i] = tg[i] == ignore ? T(0) : std::log(ss.get()[i]) + ms.get()[i] - ts.get()[i];
  });
}

void ce_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& rowmax, const Tensor& sumexp,
                 const Tensor& targets, int64_t v_begin, int32_t ignore, float scale, const Tensor& loss_scale) {
  with_compute_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> ls(logits), ms(rowmax), ss(sumexp);
    Out<T> ds(dlogits, true);
    const int32_t* tg = targets.data<int32_t>();
    const int64_t n = logits.dim(0), V = logits.dim(1);
    const T dloss = dloss_of<T>(scale, loss_scale);
#pragma omp parallel for schedule(static) if (n * V > 65536)
    for (int64_t i = 0; i < n; ++i) {
      if (tg[i] == ignore) continue;
      const T* l = ls.get() + i * V;
      T* d = ds.get() + i * V;
      const T m = ms.get()[i], g = dloss / ss.get()[i];
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) d[j] += g * vexp(l[j] - m);
      const int64_t t = static_cast<int64_t>(tg[i]) - v_begin;
      if (t >= 0 && t < V) d[t] -= dloss;
    }
    ds.commit();
  });
}

void ce_exps(const Tensor& sumexp, const Tensor& logits, const Tensor& rowmax) {
  sum_exps<true>(sumexp, logits, rowmax);
}

void ce_backward_exps(const Tensor& dlogits, const Tensor& exps, const Tensor& sumexp, const Tensor& targets,
                      int64_t v_begin, int32_t ignore, float scale, const Tensor& loss_scale) {
  with_compute_type(exps.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> es(exps), ss(sumexp);
    Out<T> ds(dlogits, false);  // a half dlogits that is exps: In copied them first
    const int32_t* tg = targets.data<int32_t>();
    const int64_t n = exps.dim(0), V = exps.dim(1);
    const T dloss = dloss_of<T>(scale, loss_scale);
#pragma omp parallel for schedule(static) if (n * V > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const bool counted = tg[i] != ignore;
      row_gradient(ds.get() + i * V, es.get() + i * V, V, counted ? dloss / ss.get()[i] : T(0),
                   static_cast<int64_t>(tg[i]) - v_begin, counted, dloss);
    }
    ds.commit();
  });
}

// Each row through ce_row_max, ce_target_logit, ce_exps (or ce_sum_exp), ce_loss and
// ce_backward_exps's steps, one after another while the row (V floats: 128 KiB at
// 32,768) stays in cache.
void ce_whole_rows(const Tensor& losses, const Tensor& logits, const Tensor& targets, int32_t ignore, bool grad,
                   float scale, const Tensor& loss_scale) {
  with_compute_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    Out<T> ls(logits, true);  // read, and written back only with the gradient
    Out<T> out(losses, false);
    const int32_t* tg = targets.data<int32_t>();
    const int64_t n = logits.dim(0), V = logits.dim(1);
    const T dloss = dloss_of<T>(scale, loss_scale);
#pragma omp parallel for schedule(static) if (n * V > 65536)
    for (int64_t i = 0; i < n; ++i) {
      T* l = ls.get() + i * V;
      const T m = row_max(l, V);
      const int64_t t = tg[i];
      const bool counted = tg[i] != ignore;
      const T target = t >= 0 && t < V ? l[t] : T(0);
      const T s = grad ? row_sum_exps<true>(l, V, m) : row_sum_exps<false>(l, V, m);
      out.get()[i] = counted ? std::log(s) + m - target : T(0);
      if (grad) row_gradient(l, l, V, counted ? dloss / s : T(0), t, counted, dloss);
    }
    if (grad) ls.commit();
  });
}

}  // namespace megabatch::ops::cpu
