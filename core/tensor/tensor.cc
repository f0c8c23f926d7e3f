#include "core/tensor/tensor.h"

#include <cstring>
#include <numeric>

#include "core/device/allocator.h"
#include "core/device/runtime.h"
#include "core/util/error.h"

namespace megabatch {

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = device_alloc_zeroed(device, bytes);
}

Storage::~Storage() {
  if (owned_) device_free(device_, data_);
}

Tensor Tensor::borrow(void* data, std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t;
  t.numel_ = numel_of(shape);
  t.storage_ = std::make_shared<Storage>(data, t.numel_ * dtype_size(dtype), device);
  t.owner_ = false;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

size_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail("tensor shape ", shape_text(shape), " has a negative dimension");
    n *= d;
  }
  return static_cast<size_t>(n);
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

Tensor::Tensor(std::vector<int64_t> shape, DType dtype, Device device) { resize(std::move(shape), dtype, device); }

void Tensor::resize(std::vector<int64_t> shape) { resize(std::move(shape), dtype_, device_); }

void Tensor::resize(std::vector<int64_t> shape, DType dtype, Device device) {
  const size_t n = numel_of(shape);
  const size_t bytes = n * dtype_size(dtype);
  const bool fits = storage_ && device == device_ && storage_->bytes() - offset_ >= bytes;
  if (!fits) {
    if (!owner_) fail("cannot grow a view (", describe(), ") to ", shape_text(shape));
    storage_ = std::make_shared<Storage>(bytes == 0 ? 64 : bytes, device);
    offset_ = 0;
  }
  shape_ = std::move(shape);
  numel_ = n;
  dtype_ = dtype;
  device_ = device;
}

void Tensor::zero() {
  if (numel_) runtime::fill_zero(raw(), device_, nbytes());
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_text(shape_) + " on " + device_.str();
}

void Tensor::bad_element(size_t size) const {
  fail("internal error: ", size, "-byte element access to a ", describe(), " tensor");
}

Tensor Tensor::view(std::vector<int64_t> shape) const {
  if (numel_of(shape) != numel_) fail("cannot view ", describe(), " as ", shape_text(shape));
  Tensor v = *this;
  v.owner_ = false;
  v.shape_ = std::move(shape);
  return v;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  if (!(!shape_.empty() && begin >= 0 && begin <= end && end <= shape_[0]))
    fail("rows [", begin, ", ", end, ") of ", describe());
  const size_t row = shape_[0] ? numel_ / static_cast<size_t>(shape_[0]) : 0;
  std::vector<int64_t> s = shape_;
  s[0] = end - begin;
  return flat(static_cast<size_t>(begin) * row, static_cast<size_t>(end - begin) * row, s);
}

Tensor Tensor::flat(size_t offset, size_t n, std::vector<int64_t> shape) const {
  if (offset + n > numel_) fail("elements [", offset, ", ", offset + n, ") of ", describe());
  if (shape.empty()) shape = {static_cast<int64_t>(n)};
  if (numel_of(shape) != n) fail("view of ", n, " elements as ", shape_text(shape));
  Tensor v = *this;
  v.owner_ = false;
  v.offset_ = offset_ + offset * dtype_size(dtype_);
  v.shape_ = std::move(shape);
  v.numel_ = n;
  return v;
}

void copy(const Tensor& dst, const Tensor& src) {
  if (!(dst.dtype() == src.dtype() && dst.numel() == src.numel()))
    fail("copy: ", src.describe(), " into ", dst.describe());
  if (dst.numel() == 0 || dst.raw() == src.raw()) return;
  runtime::copy_bytes(dst.raw(), dst.device(), src.raw(), src.device(), src.nbytes());
}

Tensor to_device(const Tensor& t, Device d) {
  if (t.device() == d) return t;
  Tensor out(t.shape(), t.dtype(), d);
  copy(out, t);
  return out;
}

namespace {
// n elements of dtype t at src (host memory) as floats
void widen(const void* src, DType t, size_t n, float* out) {
  switch (t) {
    case DType::kF32:
      std::memcpy(out, src, n * sizeof(float));
      break;
    case DType::kF64:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<const double*>(src)[i]);
      break;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(static_cast<const uint16_t*>(src)[i]);
      break;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) out[i] = f16_to_float(static_cast<const uint16_t*>(src)[i]);
      break;
    default: break;
  }
}
}  // namespace

void to_host_f32(const Tensor& t, float* out) {
  if (!is_floating(t.dtype())) fail("to_host_f32 of ", t.describe());
  if (t.numel() == 0) return;  // out may be null (an empty vector's data())
  if (t.dtype() == DType::kF32) {
    runtime::read_back(out, t.raw(), t.device(), t.nbytes());
    return;
  }
  if (t.dtype() == DType::kF64) {  // a host copy in the tensor's own type, widened
    std::vector<double> h(t.numel());
    runtime::read_back(h.data(), t.raw(), t.device(), t.nbytes());
    widen(h.data(), t.dtype(), t.numel(), out);
  } else {
    std::vector<uint16_t> h(t.numel());
    runtime::read_back(h.data(), t.raw(), t.device(), t.nbytes());
    widen(h.data(), t.dtype(), t.numel(), out);
  }
}

void cpu_values_f32(const Tensor& t, float* out) {
  if (!(is_floating(t.dtype()) && t.device().is_cpu())) fail("cpu_values_f32 of ", t.describe());
  if (t.numel() > 0) widen(t.raw(), t.dtype(), t.numel(), out);
}

std::vector<double> cpu_values_f64(const Tensor& t) {
  if (!(is_floating(t.dtype()) && t.device().is_cpu())) fail("cpu_values_f64 of ", t.describe());
  if (t.dtype() == DType::kF64) return std::vector<double>(t.data<double>(), t.data<double>() + t.numel());
  std::vector<float> f(t.numel());
  cpu_values_f32(t, f.data());
  return std::vector<double>(f.begin(), f.end());
}

std::vector<float> to_host_f32(const Tensor& t) {
  std::vector<float> out(t.numel());
  to_host_f32(t, out.data());
  return out;
}

std::vector<double> to_host_f64(const Tensor& t) {
  if (t.dtype() == DType::kF64) {
    std::vector<double> out(t.numel());
    runtime::read_back(out.data(), t.raw(), t.device(), t.nbytes());
    return out;
  }
  const auto f = to_host_f32(t);
  return std::vector<double>(f.begin(), f.end());
}

Tensor from_host(const std::vector<float>& values, std::vector<int64_t> shape, DType dtype, Device device) {
  if (numel_of(shape) != values.size()) fail("from_host: ", values.size(), " values for shape ", shape_text(shape));
  Tensor h(std::move(shape), dtype, Device::cpu());
  switch (dtype) {
    case DType::kF32: std::memcpy(h.raw(), values.data(), h.nbytes()); break;
    case DType::kBF16:
      for (size_t i = 0; i < values.size(); ++i) h.data<uint16_t>()[i] = float_to_bf16(values[i]);
      break;
    case DType::kF16:
      for (size_t i = 0; i < values.size(); ++i) h.data<uint16_t>()[i] = float_to_f16(values[i]);
      break;
    case DType::kF64:
      for (size_t i = 0; i < values.size(); ++i) h.data<double>()[i] = values[i];
      break;
    default: fail("from_host: floats into a ", dtype_name(dtype), " tensor");
  }
  return to_device(h, device);
}

Tensor from_host(const std::vector<double>& values, std::vector<int64_t> shape) {
  if (numel_of(shape) != values.size()) fail("from_host: ", values.size(), " values for shape ", shape_text(shape));
  Tensor h(std::move(shape), DType::kF64);
  std::memcpy(h.raw(), values.data(), h.nbytes());
  return h;
}

namespace {
template <typename T>
Tensor from_host_raw(const std::vector<T>& values, std::vector<int64_t> shape, Device device) {
  if (numel_of(shape) != values.size()) fail("from_host: ", values.size(), " values for shape ", shape_text(shape));
  Tensor t(std::move(shape), dtype_of<T>(), device);
  if (!values.empty()) runtime::copy_bytes(t.raw(), device, values.data(), Device::cpu(), t.nbytes());
  return t;
}
}  // namespace

Tensor from_host(const std::vector<int32_t>& values, std::vector<int64_t> shape, Device device) {
  return from_host_raw(values, std::move(shape), device);
}
Tensor from_host(const std::vector<uint8_t>& values, std::vector<int64_t> shape, Device device) {
  return from_host_raw(values, std::move(shape), device);
}

namespace {
template <typename T>
void upload_raw(Tensor& dst, const std::vector<T>& values, std::vector<int64_t> shape, Device device) {
  if (numel_of(shape) != values.size()) fail("upload: ", values.size(), " values for shape ", shape_text(shape));
  dst.resize(std::move(shape), dtype_of<T>(), device);
  if (!values.empty()) runtime::copy_bytes(dst.raw(), device, values.data(), Device::cpu(), dst.nbytes());
}
}  // namespace

void upload(Tensor& dst, const std::vector<int32_t>& values, std::vector<int64_t> shape, Device device) {
  upload_raw(dst, values, std::move(shape), device);
}
void upload(Tensor& dst, const std::vector<uint8_t>& values, std::vector<int64_t> shape, Device device) {
  upload_raw(dst, values, std::move(shape), device);
}

}  // namespace megabatch
