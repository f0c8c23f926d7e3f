#include "core/ops/matmul.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

void gemm(const Tensor& C, const Tensor& A, Trans ta, const Tensor& B, Trans tb, float alpha, float beta) {
  const Device d = common_device("gemm", {&C, &A, &B});
  if (!(A.ndim() == 2 && B.ndim() == 2 && C.ndim() == 2))
    fail("gemm: 2-D tensors expected, got ", A.describe(), ", ", B.describe(), ", ", C.describe());
  expect_accepted(accepts::gemm_A, A, d);
  expect_dtype("gemm", "B", B, A.dtype());
  expect_dtype("gemm", "C", C, {A.dtype(), acc_type(A.dtype())});
  const int64_t M = ta == Trans::N ? A.dim(0) : A.dim(1), K = ta == Trans::N ? A.dim(1) : A.dim(0);
  const int64_t Kb = tb == Trans::N ? B.dim(0) : B.dim(1), N = tb == Trans::N ? B.dim(1) : B.dim(0);
  if (!(K == Kb && C.dim(0) == M && C.dim(1) == N))
    fail("gemm: shapes do not agree: op(A) ", M, "x", K, ", op(B) ", Kb, "x", N, ", C ", shape_text(C.shape()));
  MB_OP_DISPATCH(d, gemm, C, A, ta, B, tb, alpha, beta);
}

void linear_forward(const Tensor& out, const Tensor& in, const Tensor& weight, const Tensor& bias) {
  const Device d = common_device("linear_forward", {&out, &in, &weight, &bias});
  expect_accepted(accepts::linear_forward_in, in, d);
  expect_dtype("linear_forward", "weight", weight, in.dtype());
  expect_dtype("linear_forward", "out", out, in.dtype());
  expect_dtype("linear_forward", "bias", bias, in.dtype());
  if (!(weight.ndim() == 2 && cols(in) == weight.dim(1) && cols(out) == weight.dim(0) && rows(out) == rows(in)))
    fail("linear_forward: in ", in.describe(), ", weight ", weight.describe(), ", out ", out.describe(),
         " do not agree");
  expect_numel("linear_forward", "bias", bias, static_cast<size_t>(weight.dim(0)));
  MB_OP_DISPATCH(d, linear_forward, out, in, weight, bias);
}

void linear_backward(const Tensor& din, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& in, const Tensor& weight, Write din_write) {
  const Device d = common_device("linear_backward", {&din, &dweight, &dbias, &dout, &in, &weight});
  expect_accepted(accepts::linear_backward_dout, dout, d);
  expect_dtype("linear_backward", "in", in, dout.dtype());
  expect_dtype("linear_backward", "weight", weight, dout.dtype());
  expect_dtype("linear_backward", "din", din, dout.dtype());
  expect_dtype("linear_backward", "dweight", dweight, acc_type(dout.dtype()));
  expect_dtype("linear_backward", "dbias", dbias, acc_type(dout.dtype()));
  if (!(weight.ndim() == 2 && cols(dout) == weight.dim(0) && rows(dout) == rows(in) && cols(in) == weight.dim(1)))
    fail("linear_backward: dout ", dout.describe(), ", in ", in.describe(), ", weight ", weight.describe(),
         " do not agree");
  expect_numel("linear_backward", "din", din, in.numel());
  expect_numel("linear_backward", "dweight", dweight, weight.numel());
  expect_numel("linear_backward", "dbias", dbias, static_cast<size_t>(weight.dim(0)));
  MB_OP_DISPATCH(d, linear_backward, din, dweight, dbias, dout, in, weight, din_write);
}

void linear_gelu_forward(const Tensor& out, const Tensor& pre, const Tensor& in, const Tensor& weight,
                         const Tensor& bias) {
  const Device d = common_device("linear_gelu_forward", {&out, &pre, &in, &weight, &bias});
  expect_accepted(accepts::linear_gelu_forward_in, in, d);
  expect_dtype("linear_gelu_forward", "weight", weight, in.dtype());
  expect_dtype("linear_gelu_forward", "bias", bias, in.dtype());
  expect_same("linear_gelu_forward", "out", out, "pre", pre);
  expect_dtype("linear_gelu_forward", "out", out, in.dtype());
  if (!(weight.ndim() == 2 && cols(in) == weight.dim(1) && cols(out) == weight.dim(0) && rows(out) == rows(in)))
    fail("linear_gelu_forward: in ", in.describe(), ", weight ", weight.describe(), ", out ", out.describe(),
         " do not agree");
  expect_numel("linear_gelu_forward", "bias", bias, static_cast<size_t>(weight.dim(0)));
  MB_OP_DISPATCH(d, linear_gelu_forward, out, pre, in, weight, bias);
}

void linear_backward_gelu(const Tensor& dpre, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                          const Tensor& in, const Tensor& weight, const Tensor& pre) {
  const Device d = common_device("linear_backward_gelu", {&dpre, &dweight, &dbias, &dout, &in, &weight, &pre});
  expect_accepted(accepts::linear_backward_gelu_dout, dout, d);
  expect_dtype("linear_backward_gelu", "weight", weight, dout.dtype());
  expect_dtype("linear_backward_gelu", "dweight", dweight, acc_type(dout.dtype()));
  expect_dtype("linear_backward_gelu", "dbias", dbias, acc_type(dout.dtype()));
  expect_same("linear_backward_gelu", "in", in, "pre", pre);
  expect_same("linear_backward_gelu", "in", in, "dpre", dpre);
  expect_dtype("linear_backward_gelu", "in", in, dout.dtype());
  if (!(weight.ndim() == 2 && cols(dout) == weight.dim(0) && rows(dout) == rows(in) && cols(in) == weight.dim(1)))
    fail("linear_backward_gelu: dout ", dout.describe(), ", in ", in.describe(), ", weight ", weight.describe(),
         " do not agree");
  expect_numel("linear_backward_gelu", "dweight", dweight, weight.numel());
  expect_numel("linear_backward_gelu", "dbias", dbias, static_cast<size_t>(weight.dim(0)));
  MB_OP_DISPATCH(d, linear_backward_gelu, dpre, dweight, dbias, dout, in, weight, pre);
}

void bias_add(const Tensor& x, const Tensor& bias) {
  const Device d = common_device("bias_add", {&x, &bias});
  expect_accepted(accepts::bias_add_x, x, d);
  expect_dtype("bias_add", "bias", bias, x.dtype());
  expect_numel("bias_add", "bias", bias, static_cast<size_t>(cols(x)));
  MB_OP_DISPATCH(d, bias_add, x, bias);
}

void bias_backward(const Tensor& dbias, const Tensor& dx) {
  const Device d = common_device("bias_backward", {&dbias, &dx});
  expect_accepted(accepts::bias_backward_dx, dx, d);
  expect_dtype("bias_backward", "dbias", dbias, acc_type(dx.dtype()));
  expect_numel("bias_backward", "dbias", dbias, static_cast<size_t>(cols(dx)));
  MB_OP_DISPATCH(d, bias_backward, dbias, dx);
}

}  // namespace megabatch::ops
