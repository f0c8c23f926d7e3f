#include "core/ops/layernorm.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

namespace {
void check_norm(const Accepts& input, Device d, const Tensor& x, const Tensor& y, const Tensor& weight,
                const Tensor& bias, const Tensor& mean, const Tensor& rstd) {
  const char* op = input.op;
  expect_accepted(input, x, d);
  expect_same(op, "input", x, "output", y);
  expect_dtype(op, "weight", weight, x.dtype());
  expect_numel(op, "weight", weight, static_cast<size_t>(cols(x)));
  expect_dtype(op, "bias", bias, x.dtype());
  expect_numel(op, "bias", bias, static_cast<size_t>(cols(x)));
  for (const Tensor* s : {&mean, &rstd}) {
    expect_dtype(op, "statistics", *s, acc_type(x.dtype()));
    expect_numel(op, "statistics", *s, static_cast<size_t>(rows(x)));
  }
}
void check_grads(const char* op, const Tensor& x, const Tensor& dweight, const Tensor& dbias) {
  for (const Tensor* g : {&dweight, &dbias}) {
    expect_dtype(op, "parameter gradient", *g, acc_type(x.dtype()));
    expect_numel(op, "parameter gradient", *g, static_cast<size_t>(cols(x)));
  }
}
}  // namespace

void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in,
                       const Tensor& weight, const Tensor& bias, double eps) {
  const Device d = common_device("layernorm_forward", {&out, &mean, &rstd, &in, &weight, &bias});
  check(mean.defined() && rstd.defined() && weight.defined() && bias.defined(), "layernorm_forward: missing argument");
  check_norm(accepts::layernorm_forward_in, d, in, out, weight, bias, mean, rstd);
  MB_OP_DISPATCH(d, layernorm_forward, out, mean, rstd, in, weight, bias, eps);
}

void layernorm_backward(const Tensor& din, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& in, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  const Device d = common_device("layernorm_backward", {&din, &dweight, &dbias, &dout, &in, &weight, &mean, &rstd});
  check_norm(accepts::layernorm_backward_in, d, in, dout, weight, Tensor(), mean, rstd);
  expect_same("layernorm_backward", "input", in, "din", din);
  check_grads("layernorm_backward", in, dweight, dbias);
  MB_OP_DISPATCH(d, layernorm_backward, din, dweight, dbias, dout, in, weight, mean, rstd);
}

void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& weight, double eps) {
  const Device d = common_device("rmsnorm_forward", {&out, &rstd, &in, &weight});
  check(rstd.defined() && weight.defined(), "rmsnorm_forward: missing argument");
  check_norm(accepts::rmsnorm_forward_in, d, in, out, weight, Tensor(), Tensor(), rstd);
  MB_OP_DISPATCH(d, rmsnorm_forward, out, rstd, in, weight, eps);
}

void layernorm_residual_forward(const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias, double eps) {
  const Device d = common_device("layernorm_residual_forward", {&sum, &out, &mean, &rstd, &a, &b, &weight, &bias});
  check(mean.defined() && rstd.defined() && weight.defined() && bias.defined(),
        "layernorm_residual_forward: missing argument");
  check_norm(accepts::layernorm_residual_forward_a, d, a, out, weight, bias, mean, rstd);
  expect_same("layernorm_residual_forward", "a", a, "b", b);
  expect_same("layernorm_residual_forward", "a", a, "sum", sum);
  MB_OP_DISPATCH(d, layernorm_residual_forward, sum, out, mean, rstd, a, b, weight, bias, eps);
}

void rmsnorm_residual_forward(const Tensor& sum, const Tensor& out, const Tensor& rstd, const Tensor& a,
                              const Tensor& b, const Tensor& weight, double eps) {
  const Device d = common_device("rmsnorm_residual_forward", {&sum, &out, &rstd, &a, &b, &weight});
  check(rstd.defined() && weight.defined(), "rmsnorm_residual_forward: missing argument");
  check_norm(accepts::rmsnorm_residual_forward_a, d, a, out, weight, Tensor(), Tensor(), rstd);
  expect_same("rmsnorm_residual_forward", "a", a, "b", b);
  expect_same("rmsnorm_residual_forward", "a", a, "sum", sum);
  MB_OP_DISPATCH(d, rmsnorm_residual_forward, sum, out, rstd, a, b, weight, eps);
}

void rmsnorm_backward(const Tensor& din, const Tensor& dweight, const Tensor& dout, const Tensor& in,
                      const Tensor& weight, const Tensor& rstd) {
  const Device d = common_device("rmsnorm_backward", {&din, &dweight, &dout, &in, &weight, &rstd});
  check_norm(accepts::rmsnorm_backward_in, d, in, dout, weight, Tensor(), Tensor(), rstd);
  expect_same("rmsnorm_backward", "input", in, "din", din);
  check_grads("rmsnorm_backward", in, dweight, Tensor());
  MB_OP_DISPATCH(d, rmsnorm_backward, din, dweight, dout, in, weight, rstd);
}

}  // namespace megabatch::ops
