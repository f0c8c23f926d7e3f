// Tensor: a contiguous, 64-byte aligned, owning array with a shape (row-major, no strides).
// Activations and scratch live in Tensors; parameters and gradients live in the flat
// buffers of nn::ParameterStore and are handed to ops as raw pointers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <numeric>
#include <string>
#include <vector>

namespace megabatch {

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

// n elements of T, 64-byte aligned, zero-filled.
template <typename T>
std::unique_ptr<T[], AlignedFree> aligned_zeros(size_t n) {
  size_t bytes = ((n * sizeof(T) + 63) / 64) * 64;
  if (bytes == 0) bytes = 64;
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return std::unique_ptr<T[], AlignedFree>(static_cast<T*>(p));
}

template <typename T = float>
class TensorT {
 public:
  TensorT() = default;
  explicit TensorT(std::vector<int64_t> shape) { resize(std::move(shape)); }
  TensorT(std::initializer_list<int64_t> shape) : TensorT(std::vector<int64_t>(shape)) {}

  // Reallocates (zero-filled) only when the element count grows.
  void resize(std::vector<int64_t> shape) {
    shape_ = std::move(shape);
    size_t n = static_cast<size_t>(std::accumulate(shape_.begin(), shape_.end(), int64_t{1}, std::multiplies<>()));
    if (n > capacity_) {
      data_ = aligned_zeros<T>(n);
      capacity_ = n;
    }
    numel_ = n;
  }
  void zero() { if (numel_) std::memset(data_.get(), 0, numel_ * sizeof(T)); }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t numel() const { return numel_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  std::vector<int64_t> shape_;
  std::unique_ptr<T[], AlignedFree> data_;
  size_t numel_ = 0, capacity_ = 0;
};

using Tensor = TensorT<float>;

}  // namespace megabatch
