#include "core/ops/activation.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

void gelu_forward(const Tensor& out, const Tensor& in) {
  const Device d = common_device("gelu_forward", {&out, &in});
  expect_accepted(accepts::gelu_forward_in, in, d);
  expect_same("gelu_forward", "in", in, "out", out);
  MB_OP_DISPATCH(d, gelu_forward, out, in);
}

void gelu_backward(const Tensor& din, const Tensor& dout, const Tensor& in, Write w) {
  const Device d = common_device("gelu_backward", {&din, &dout, &in});
  expect_accepted(accepts::gelu_backward_in, in, d);
  expect_same("gelu_backward", "in", in, "dout", dout);
  expect_same("gelu_backward", "in", in, "din", din);
  MB_OP_DISPATCH(d, gelu_backward, din, dout, in, w);
}

void squared_relu_forward(const Tensor& out, const Tensor& in) {
  const Device d = common_device("squared_relu_forward", {&out, &in});
  expect_accepted(accepts::squared_relu_forward_in, in, d);
  expect_same("squared_relu_forward", "in", in, "out", out);
  MB_OP_DISPATCH(d, squared_relu_forward, out, in);
}

void squared_relu_backward(const Tensor& din, const Tensor& dout, const Tensor& in) {
  const Device d = common_device("squared_relu_backward", {&din, &dout, &in});
  expect_accepted(accepts::squared_relu_backward_in, in, d);
  expect_same("squared_relu_backward", "in", in, "dout", dout);
  expect_same("squared_relu_backward", "in", in, "din", din);
  MB_OP_DISPATCH(d, squared_relu_backward, din, dout, in);
}

namespace {
// in and out of swiglu: the same dtype, in twice out's elements, whole rows of pairs
void check_swiglu(const char* op, const char* in_name, const Tensor& in, const char* out_name, const Tensor& out) {
  expect_dtype(op, out_name, out, in.dtype());
  check(in.numel() == 2 * out.numel() && in.ndim() >= 1 && in.shape().back() % 2 == 0, op, ": ", in_name, " (",
        in.numel(), " elements, rows of ", in.ndim() ? in.shape().back() : 0, ") must hold 2 x ", out_name, "'s ",
        out.numel(), " elements in rows of (gate, up) pairs");
}
}  // namespace

void swiglu_forward(const Tensor& out, const Tensor& in) {
  const Device d = common_device("swiglu_forward", {&out, &in});
  expect_accepted(accepts::swiglu_forward_in, in, d);
  check_swiglu("swiglu_forward", "in", in, "out", out);
  MB_OP_DISPATCH(d, swiglu_forward, out, in);
}

void swiglu_backward(const Tensor& din, const Tensor& dout, const Tensor& in) {
  const Device d = common_device("swiglu_backward", {&din, &dout, &in});
  expect_accepted(accepts::swiglu_backward_in, in, d);
  expect_same("swiglu_backward", "in", in, "din", din);
  check_swiglu("swiglu_backward", "in", in, "dout", dout);
  MB_OP_DISPATCH(d, swiglu_backward, din, dout, in);
}

void tanh_forward(const Tensor& out, const Tensor& in) {
  const Device d = common_device("tanh_forward", {&out, &in});
  expect_accepted(accepts::tanh_forward_in, in, d);
  expect_same("tanh_forward", "in", in, "out", out);
  MB_OP_DISPATCH(d, tanh_forward, out, in);
}

void tanh_backward(const Tensor& din, const Tensor& dout, const Tensor& out) {
  const Device d = common_device("tanh_backward", {&din, &dout, &out});
  expect_accepted(accepts::tanh_backward_out, out, d);
  expect_same("tanh_backward", "out", out, "dout", dout);
  expect_same("tanh_backward", "out", out, "din", din);
  MB_OP_DISPATCH(d, tanh_backward, din, dout, out);
}

}  // namespace megabatch::ops
