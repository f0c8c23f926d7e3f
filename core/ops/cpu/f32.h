// How the CPU kernels see tensors of any dtype: they compute in f32 (or f64, for the
// finite-difference checks), and the half types are emulated as DESIGN.md says: stored
// rounded, computed in f32. In<T> is a tensor's elements as const T* (the tensor itself
// when it already holds T, else a widened copy); Out<T> is a tensor's elements as T*
// (itself, or a temporary that commit() rounds back into it; with accumulate, the
// temporary starts from the tensor's values). Undefined tensors give null pointers.
#pragma once

#include <vector>

#include "core/tensor/tensor.h"
#include "core/util/error.h"

namespace megabatch::ops::cpu {

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
    check(!std::is_same_v<T, double>, "internal error: f64 kernel given a ", t.describe(), " tensor");
    const std::vector<float> f = to_host_f32(t);
    copy_.assign(f.begin(), f.end());
    ptr_ = copy_.data();
  }
  operator const T*() const { return ptr_; }
  const T* get() const { return ptr_; }

 private:
  const T* ptr_ = nullptr;
  std::vector<T> copy_;
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
    check(!std::is_same_v<T, double> && is_half(t.dtype()), "internal error: ", sizeof(T) == 8 ? "f64" : "f32",
          " kernel output into a ", t.describe(), " tensor");
    if (accumulate) {
      const std::vector<float> f = to_host_f32(t);
      copy_.assign(f.begin(), f.end());
    } else {
      copy_.assign(t.numel(), T(0));
    }
    ptr_ = copy_.data();
    rounded_ = true;
  }
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
  std::vector<T> copy_;
  bool rounded_ = false;
};

// Rows (all leading dimensions) and columns (the last dimension) of a tensor.
inline int64_t rows_of(const Tensor& t) {
  return t.ndim() == 0 ? 1 : static_cast<int64_t>(t.numel()) / std::max<int64_t>(t.shape().back(), 1);
}
inline int64_t cols_of(const Tensor& t) { return t.ndim() == 0 ? 1 : t.shape().back(); }

}  // namespace megabatch::ops::cpu
