#include "core/ops/elementwise.h"

#include "core/ops/check.h"

namespace megabatch::ops {
using namespace detail;

void cast(const Tensor& dst, const Tensor& src) {
  const Device d = common_device("cast", {&dst, &src});
  expect_activation("cast", "src", src);
  expect_activation("cast", "dst", dst);
  expect_numel("cast", "dst", dst, src.numel());
  if (dst.dtype() == src.dtype()) {
    copy(dst, src);
    return;
  }
  MB_OP_DISPATCH(d, cast, dst, src);
}

void scale(const Tensor& x, float s) {
  const Device d = common_device("scale", {&x});
  expect_activation("scale", "x", x);
  MB_OP_DISPATCH(d, scale, x, s);
}

}  // namespace megabatch::ops
