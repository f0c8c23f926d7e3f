// How the CPU kernels see tensors of any dtype: they compute in f32 (or f64, for the
// finite-difference checks), and the half types are emulated as DESIGN.md says: stored
// rounded, computed in f32. In<T> is a tensor's elements as const T* (the tensor itself
// when it already holds T, else a widened copy); Out<T> is a tensor's elements as T*
// (itself, or a temporary that commit() rounds back into it; with accumulate, the
// temporary starts from the tensor's values). Undefined tensors give null pointers.
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/tensor/tensor.h"
#include "core/util/error.h"

namespace megabatch::ops::cpu {

namespace detail {
// The widened copies' memory, kept per thread for the next kernel: every kernel call widens
// its half tensors, and allocating the LM head's logits afresh each time (tens of MB) costs
// a page fault per 4 KiB, which made a bf16 step 40x slower than an f32 one.
inline std::vector<std::vector<float>>& scratch_pool() {
  thread_local std::vector<std::vector<float>> pool;
  return pool;
}
// A vector of n elements (values unspecified): the smallest pooled one that holds n, else the
// largest, grown.
inline std::vector<float> take_scratch(size_t n) {
  auto& pool = scratch_pool();
  std::vector<float> v;
  if (!pool.empty()) {
    auto fits = pool.end(), largest = pool.begin();
    for (auto it = pool.begin(); it != pool.end(); ++it) {
      if (it->capacity() >= n && (fits == pool.end() || it->capacity() < fits->capacity())) fits = it;
      if (it->capacity() > largest->capacity()) largest = it;
    }
    const auto pick = fits != pool.end() ? fits : largest;
    v = std::move(*pick);
    pool.erase(pick);
  }
  v.resize(n);
  return v;
}
inline void give_scratch(std::vector<float>&& v) {
  constexpr size_t kKept = 8;  // more than the widened operands of any one kernel
  auto& pool = scratch_pool();
  if (v.capacity() == 0) return;
  if (pool.size() < kKept) {
    pool.push_back(std::move(v));
    return;
  }
  auto smallest = std::min_element(pool.begin(), pool.end(),
                                   [](const auto& a, const auto& b) { return a.capacity() < b.capacity(); });
  if (smallest->capacity() < v.capacity()) *smallest = std::move(v);
}
}  // namespace detail

// Calls fn(T{}) with T = double for f64 activations and float for every other dtype.
template <typename Fn>
void with_compute_type(DType activations, Fn&& fn) {
  if (activations == DType::kF64)
    fn(double{});
  else
    fn(float{});
}

template <typename T>
class In {
 public:
  explicit In(const Tensor& t) {
    if (!t.defined()) return;
    if (t.dtype() == dtype_of<T>()) {
      ptr_ = t.data<T>();
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      copy_ = detail::take_scratch(t.numel());
      cpu_values_f32(t, copy_.data());
      ptr_ = copy_.data();
    } else {
      fail("internal error: f64 kernel given a ", t.describe(), " tensor");
    }
  }
  ~In() { detail::give_scratch(std::move(copy_)); }
  In(const In&) = delete;
  In& operator=(const In&) = delete;
  operator const T*() const { return ptr_; }
  const T* get() const { return ptr_; }

 private:
  const T* ptr_ = nullptr;
  std::vector<float> copy_;
};

template <typename T>
class Out {
 public:
  Out(const Tensor& t, bool accumulate) : t_(t) {
    if (!t.defined()) return;
    if (t.dtype() == dtype_of<T>()) {
      ptr_ = t.data<T>();
      return;
    }
    if (std::is_same_v<T, double> || !is_half(t.dtype()))
      fail("internal error: ", sizeof(T) == 8 ? "f64" : "f32", " kernel output into a ", t.describe(), " tensor");
    if constexpr (std::is_same_v<T, float>) {
      copy_ = detail::take_scratch(t.numel());
      if (accumulate)
        cpu_values_f32(t, copy_.data());
      else
        std::fill(copy_.begin(), copy_.end(), 0.0f);
      ptr_ = copy_.data();
      rounded_ = true;
    }
  }
  ~Out() { detail::give_scratch(std::move(copy_)); }
  Out(const Out&) = delete;
  Out& operator=(const Out&) = delete;
  operator T*() const { return ptr_; }
  T* get() const { return ptr_; }
  // Rounds the f32 results back into a half tensor (nothing to do otherwise).
  void commit() {
    if (!rounded_) return;
    uint16_t* h = t_.data<uint16_t>();
    if (t_.dtype() == DType::kBF16)
      for (size_t i = 0; i < copy_.size(); ++i) h[i] = float_to_bf16(static_cast<float>(copy_[i]));
    else
      for (size_t i = 0; i < copy_.size(); ++i) h[i] = float_to_f16(static_cast<float>(copy_[i]));
  }

 private:
  Tensor t_;
  T* ptr_ = nullptr;
  std::vector<float> copy_;
  bool rounded_ = false;
};

// Rows (all leading dimensions) and columns (the last dimension) of a tensor.
inline int64_t rows_of(const Tensor& t) {
  return t.ndim() == 0 ? 1 : static_cast<int64_t>(t.numel()) / std::max<int64_t>(t.shape().back(), 1);
}
inline int64_t cols_of(const Tensor& t) { return t.ndim() == 0 ? 1 : t.shape().back(); }

}  // namespace megabatch::ops::cpu
