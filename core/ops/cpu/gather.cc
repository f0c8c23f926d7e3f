// Row gathers on the CPU.
#include <cstring>

#include "core/ops/backends.h"
#include "core/ops/cpu/f32.h"

namespace megabatch::ops::cpu {

void gather_rows(const Tensor& out, const Tensor& in, const Tensor& rows) {
  const size_t row_bytes = static_cast<size_t>(in.shape().back()) * dtype_size(in.dtype());
  const int32_t* r = rows.data<int32_t>();
  const char* src = static_cast<const char*>(in.raw());
  char* dst = static_cast<char*>(out.raw());
  for (size_t i = 0; i < rows.numel(); ++i) std::memcpy(dst + i * row_bytes, src + static_cast<size_t>(r[i]) * row_bytes, row_bytes);
}

void scatter_rows(const Tensor& dst, const Tensor& src, const Tensor& rows) {
  const size_t row_bytes = static_cast<size_t>(src.shape().back()) * dtype_size(src.dtype());
  const int32_t* r = rows.data<int32_t>();
  const char* from = static_cast<const char*>(src.raw());
  char* to = static_cast<char*>(dst.raw());
  for (size_t i = 0; i < rows.numel(); ++i)
    std::memcpy(to + static_cast<size_t>(r[i]) * row_bytes, from + i * row_bytes, row_bytes);
}

void scatter_add_rows(const Tensor& dst, const Tensor& src, const Tensor& rows) {
  with_compute_type(src.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> s(src);
    Out<T> d(dst, true);
    const int32_t* r = rows.data<int32_t>();
    const int64_t C = src.shape().back();
    for (size_t i = 0; i < rows.numel(); ++i)
      for (int64_t c = 0; c < C; ++c) d.get()[r[i] * C + c] += s.get()[static_cast<int64_t>(i) * C + c];
    d.commit();
  });
}

}  // namespace megabatch::ops::cpu
