#include "core/ops/residual.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) {
  const Device d = common_device("residual_forward", {&out, &a, &b});
  expect_accepted(accepts::residual_forward_a, a, d);
  expect_same("residual_forward", "a", a, "b", b);
  expect_same("residual_forward", "a", a, "out", out);
  MB_OP_DISPATCH(d, residual_forward, out, a, b);
}

void residual_backward(const Tensor& da, const Tensor& db, const Tensor& dout) {
  const Device d = common_device("residual_backward", {&da, &db, &dout});
  expect_accepted(accepts::residual_backward_dout, dout, d);
  expect_same("residual_backward", "dout", dout, "da", da);
  expect_same("residual_backward", "dout", dout, "db", db);
  MB_OP_DISPATCH(d, residual_backward, da, db, dout);
}

}  // namespace megabatch::ops
