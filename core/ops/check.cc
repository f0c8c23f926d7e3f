#include "core/ops/check.h"

namespace megabatch::ops::detail {

Device common_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (!first) {
      first = t;
      continue;
    }
    if (t->device() != first->device())
      fail(op, ": tensors on different devices (", first->describe(), " and ", t->describe(), ")");
  }
  return first ? first->device() : Device::cpu();
}

void expect_accepted(const Accepts& row, const Tensor& t, Device d) {
  if (!t.defined()) return;
  const DTypes allowed = row.on_cuda(d.is_cuda());
  if (allowed.has(t.dtype())) return;
  if (d.is_cuda() && row.cpu.has(t.dtype()))
    fail(row.op, ": ", row.arg, " is ", dtype_name(t.dtype()), ", which the CUDA kernels do not take (", allowed.names(),
         "): ", row.narrowed);
  fail(row.op, ": ", row.arg, " must be ", allowed.names(), ", got ", t.describe());
}

void expect_dtype(const char* op, const char* name, const Tensor& t, DType d) {
  if (t.defined() && t.dtype() != d) fail(op, ": ", name, " must be ", dtype_name(d), ", got ", t.describe());
}

void expect_dtype(const char* op, const char* name, const Tensor& t, std::initializer_list<DType> allowed) {
  if (!t.defined()) return;
  std::string names;
  for (DType d : allowed) {
    if (t.dtype() == d) return;
    names += (names.empty() ? "" : " or ") + std::string(dtype_name(d));
  }
  fail(op, ": ", name, " must be ", names, ", got ", t.describe());
}

void expect_numel(const char* op, const char* name, const Tensor& t, size_t n) {
  if (t.defined() && t.numel() != n) fail(op, ": ", name, " must have ", n, " elements, got ", t.describe());
}

void expect_segments(const char* op, const Tensor& x, const std::vector<std::pair<size_t, size_t>>& segments) {
  for (const auto& [b, e] : segments)
    if (b > e || e > x.numel()) fail(op, ": segment [", b, ", ", e, ") outside ", x.describe());
}

void expect_growth_base(const char* op, const Tensor& x, const Tensor& prev) {
  expect_dtype(op, "prev", prev, DType::kF32);
  expect_numel(op, "prev", prev, x.numel());
  check(prev.raw() != x.raw(), op, ": prev and x are one buffer");
}

void expect_same(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  if (!a.defined() || !b.defined()) return;
  if (!(a.dtype() == b.dtype() && a.numel() == b.numel()))
    fail(op, ": ", a_name, " (", a.describe(), ") and ", b_name, " (", b.describe(),
         ") must have the same dtype and size");
}

int64_t rows(const Tensor& t) {
  if (t.ndim() == 0) return 1;
  const int64_t c = t.shape().back();
  return c ? static_cast<int64_t>(t.numel()) / c : 0;
}
int64_t cols(const Tensor& t) { return t.ndim() == 0 ? 1 : t.shape().back(); }

}  // namespace megabatch::ops::detail
