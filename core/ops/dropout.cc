#include "core/ops/dropout.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

void dropout_forward(const Tensor& out, const Tensor& in, uint64_t offset, const DropoutKey& k) {
  const Device d = common_device("dropout_forward", {&out, &in});
  expect_accepted(accepts::dropout_forward_in, in, d);
  expect_same("dropout_forward", "in", in, "out", out);
  check(k.p >= 0 && k.p < 1, "dropout_forward: probability ", k.p, " is outside [0, 1)");
  MB_OP_DISPATCH(d, dropout_forward, out, in, offset, k);
}

void dropout_backward(const Tensor& din, const Tensor& dout, uint64_t offset, const DropoutKey& k, Write w) {
  const Device d = common_device("dropout_backward", {&din, &dout});
  expect_accepted(accepts::dropout_backward_dout, dout, d);
  expect_same("dropout_backward", "dout", dout, "din", din);
  check(k.p >= 0 && k.p < 1, "dropout_backward: probability ", k.p, " is outside [0, 1)");
  MB_OP_DISPATCH(d, dropout_backward, din, dout, offset, k, w);
}

}  // namespace megabatch::ops
