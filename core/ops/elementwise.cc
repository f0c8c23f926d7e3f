#include "core/ops/elementwise.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

void cast(const Tensor& dst, const Tensor& src) {
  const Device d = common_device("cast", {&dst, &src});
  expect_accepted(accepts::cast_src, src, d);
  expect_accepted(accepts::cast_dst, dst, d);
  expect_numel("cast", "dst", dst, src.numel());
  if (dst.dtype() == src.dtype()) {
    copy(dst, src);
    return;
  }
  MB_OP_DISPATCH(d, cast, dst, src);
}

void scale(const Tensor& x, float s) {
  const Device d = common_device("scale", {&x});
  expect_accepted(accepts::scale_x, x, d);
  MB_OP_DISPATCH(d, scale, x, s);
}

}  // namespace megabatch::ops
