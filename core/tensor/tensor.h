// Tensor: a contiguous, row-major array with a shape, an element type (DType) and a
// device. Memory is zero-filled when allocated, 64-byte aligned on the CPU and 256-byte
// aligned on a GPU (from the device's caching allocator).
//
// Copies are shallow (they share memory, as views do): activations, scratch, parameters
// (views into nn::ParameterStore's flat buffers) and optimizer state are all Tensors.
// A tensor made by the constructor or resize() owns its memory and may grow; a view
// (view(), rows(), flat()) shares its owner's and keeps it alive.
//
// Host code touches elements only of CPU tensors (data(), operator[]); a GPU tensor's
// data() is a device pointer for kernels, and host code reads it through copy() or
// to_host(), explicit and synchronous.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/device/dtype.h"

namespace megabatch {

// A block of zero-filled memory on one device.
class Storage {
 public:
  Storage(size_t bytes, Device device);
  // Memory someone else owns (not freed here).
  Storage(void* external, size_t bytes, Device device) : data_(external), bytes_(bytes), device_(device), owned_(false) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  bool owned_ = true;
};

class Tensor {
 public:
  Tensor() = default;  // empty (undefined): f32 on the CPU, no elements
  explicit Tensor(std::vector<int64_t> shape, DType dtype = DType::kF32, Device device = Device::cpu());
  Tensor(std::initializer_list<int64_t> shape) : Tensor(std::vector<int64_t>(shape)) {}

  // Sets the shape, keeping dtype and device; reallocates (zero-filled) only when the
  // bytes needed exceed the capacity. Views cannot grow.
  void resize(std::vector<int64_t> shape);
  // Sets shape, dtype and device; reallocates when the dtype or device changes or the
  // capacity is too small.
  void resize(std::vector<int64_t> shape, DType dtype, Device device);
  void zero();  // every element 0 (on the tensor's device)

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t ndim() const { return shape_.size(); }
  size_t numel() const { return numel_; }
  size_t nbytes() const { return numel_ * dtype_size(dtype_); }
  std::string describe() const;  // "bf16[8, 128] on cuda:0"

  void* raw() const { return storage_ ? static_cast<char*>(storage_->data()) + offset_ : nullptr; }
  // Typed element pointer; T must match the dtype (uint16_t for bf16 and f16). On a GPU
  // this is a device pointer.
  template <typename T = float>
  T* data() const {
    check_element<T>();
    return static_cast<T*>(raw());
  }
  // Host element access (CPU f32 tensors).
  float& operator[](size_t i) const {
    assert(device_.is_cpu() && dtype_ == DType::kF32 && i < numel_);
    return static_cast<float*>(raw())[i];
  }

  // A view of memory the caller owns and keeps alive longer than the tensor (a plugin's).
  static Tensor borrow(void* data, std::vector<int64_t> shape, DType dtype, Device device);

  // Views sharing this tensor's memory.
  Tensor view(std::vector<int64_t> shape) const;              // same number of elements
  Tensor rows(int64_t begin, int64_t end) const;              // [begin, end) of dimension 0
  Tensor flat(size_t offset, size_t n, std::vector<int64_t> shape = {}) const;  // elements [offset, offset + n)

 private:
  template <typename T>
  void check_element() const {
    if constexpr (sizeof(T) == 2) {
      if (!is_half(dtype_)) bad_element(2);
    } else {
      if (dtype_of<T>() != dtype_) bad_element(sizeof(T));
    }
  }
  [[noreturn]] void bad_element(size_t size) const;

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes into storage_
  bool owner_ = true;  // false for views: they cannot grow
  std::vector<int64_t> shape_;
  size_t numel_ = 0;
  DType dtype_ = DType::kF32;
  Device device_;
};

size_t numel_of(const std::vector<int64_t>& shape);
std::string shape_text(const std::vector<int64_t>& shape);  // "[8, 128]"

// dst = src for tensors of the same dtype and number of elements, across devices.
void copy(const Tensor& dst, const Tensor& src);
// A copy of t on device d (t itself, shared, when it is already there).
Tensor to_device(const Tensor& t, Device d);
// The elements of a floating tensor of any dtype and device, as host floats (halves
// widened exactly; f64 rounded): host code reading a run's tensors. Synchronous, and counted
// as reads of device values (runtime::read_back), on the CPU too.
std::vector<float> to_host_f32(const Tensor& t);
void to_host_f32(const Tensor& t, float* out);  // into out (numel elements)
std::vector<double> to_host_f64(const Tensor& t);
// The same for a CPU tensor, read in place: how the CPU kernels widen their operands.
void cpu_values_f32(const Tensor& t, float* out);
std::vector<double> cpu_values_f64(const Tensor& t);
// A tensor of dtype `dtype` on `device` holding `values` (rounded to nearest even for the
// half types).
Tensor from_host(const std::vector<float>& values, std::vector<int64_t> shape, DType dtype = DType::kF32,
                 Device device = Device::cpu());
Tensor from_host(const std::vector<double>& values, std::vector<int64_t> shape);  // f64, CPU
Tensor from_host(const std::vector<int32_t>& values, std::vector<int64_t> shape, Device device = Device::cpu());
Tensor from_host(const std::vector<uint8_t>& values, std::vector<int64_t> shape, Device device = Device::cpu());
// dst = values with `shape` on `device`, reusing dst's memory when it fits (token ids and
// masks of each micro-batch).
void upload(Tensor& dst, const std::vector<int32_t>& values, std::vector<int64_t> shape, Device device);
void upload(Tensor& dst, const std::vector<uint8_t>& values, std::vector<int64_t> shape, Device device);

}  // namespace megabatch
