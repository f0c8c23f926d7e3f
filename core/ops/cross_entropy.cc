#include "core/ops/cross_entropy.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

namespace {
// logits (n, V) in a dtype of its row; each per-row tensor (n) in its accumulator dtype.
void check_rows(const Accepts& logits_row, Device d, const Tensor& logits, std::initializer_list<const Tensor*> per_row) {
  const char* op = logits_row.op;
  expect_accepted(logits_row, logits, d);
  if (logits.ndim() != 2) fail(op, ": logits must be 2-D, got ", logits.describe());
  for (const Tensor* t : per_row) {
    expect_dtype(op, "per-row values", *t, acc_type(logits.dtype()));
    expect_numel(op, "per-row values", *t, static_cast<size_t>(logits.dim(0)));
  }
}
void check_targets(const Accepts& targets_row, Device d, const Tensor& targets, int64_t n) {
  expect_accepted(targets_row, targets, d);
  expect_numel(targets_row.op, "targets", targets, static_cast<size_t>(n));
}
}  // namespace

void ce_row_max(const Tensor& rowmax, const Tensor& logits) {
  const Device d = common_device("ce_row_max", {&rowmax, &logits});
  check_rows(accepts::ce_row_max_logits, d, logits, {&rowmax});
  MB_OP_DISPATCH(d, ce_row_max, rowmax, logits);
}

void ce_sum_exp(const Tensor& sumexp, const Tensor& logits, const Tensor& rowmax) {
  const Device d = common_device("ce_sum_exp", {&sumexp, &logits, &rowmax});
  check_rows(accepts::ce_sum_exp_logits, d, logits, {&sumexp, &rowmax});
  MB_OP_DISPATCH(d, ce_sum_exp, sumexp, logits, rowmax);
}

void ce_target_logit(const Tensor& target, const Tensor& logits, const Tensor& targets, int64_t v_begin) {
  const Device d = common_device("ce_target_logit", {&target, &logits, &targets});
  check_rows(accepts::ce_target_logit_logits, d, logits, {&target});
  check_targets(accepts::ce_target_logit_targets, d, targets, logits.dim(0));
  MB_OP_DISPATCH(d, ce_target_logit, target, logits, targets, v_begin);
}

void ce_loss(const Tensor& losses, const Tensor& rowmax, const Tensor& sumexp, const Tensor& target,
             const Tensor& targets, int32_t ignore) {
  const Device d = common_device("ce_loss", {&losses, &rowmax, &sumexp, &target, &targets});
  expect_accepted(accepts::ce_loss_losses, losses, d);
  for (const Tensor* t : {&rowmax, &sumexp, &target}) expect_same("ce_loss", "losses", losses, "per-row values", *t);
  check_targets(accepts::ce_loss_targets, d, targets, static_cast<int64_t>(losses.numel()));
  MB_OP_DISPATCH(d, ce_loss, losses, rowmax, sumexp, target, targets, ignore);
}

void ce_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& rowmax, const Tensor& sumexp,
                 const Tensor& targets, int64_t v_begin, int32_t ignore, float scale, const Tensor& loss_scale) {
  const Device d = common_device("ce_backward", {&dlogits, &logits, &rowmax, &sumexp, &targets, &loss_scale});
  check_rows(accepts::ce_backward_logits, d, logits, {&rowmax, &sumexp});
  expect_same("ce_backward", "logits", logits, "dlogits", dlogits);
  check_targets(accepts::ce_backward_targets, d, targets, logits.dim(0));
  expect_accepted(accepts::ce_backward_loss_scale, loss_scale, d);
  expect_numel("ce_backward", "loss_scale", loss_scale, 1);
  MB_OP_DISPATCH(d, ce_backward, dlogits, logits, rowmax, sumexp, targets, v_begin, ignore, scale, loss_scale);
}

void ce_exps(const Tensor& sumexp, const Tensor& logits, const Tensor& rowmax) {
  const Device d = common_device("ce_exps", {&sumexp, &logits, &rowmax});
  check_rows(accepts::ce_exps_logits, d, logits, {&sumexp, &rowmax});
  MB_OP_DISPATCH(d, ce_exps, sumexp, logits, rowmax);
}

void ce_backward_exps(const Tensor& dlogits, const Tensor& exps, const Tensor& sumexp, const Tensor& targets,
                      int64_t v_begin, int32_t ignore, float scale, const Tensor& loss_scale) {
  const Device d = common_device("ce_backward_exps", {&dlogits, &exps, &sumexp, &targets, &loss_scale});
  check_rows(accepts::ce_backward_exps_exps, d, exps, {&sumexp});
  expect_same("ce_backward_exps", "exps", exps, "dlogits", dlogits);
  check_targets(accepts::ce_backward_exps_targets, d, targets, exps.dim(0));
  expect_accepted(accepts::ce_backward_exps_loss_scale, loss_scale, d);
  expect_numel("ce_backward_exps", "loss_scale", loss_scale, 1);
  MB_OP_DISPATCH(d, ce_backward_exps, dlogits, exps, sumexp, targets, v_begin, ignore, scale, loss_scale);
}

void ce_whole_rows(const Tensor& losses, const Tensor& logits, const Tensor& targets, int32_t ignore, bool grad,
                   float scale, const Tensor& loss_scale) {
  const Device d = common_device("ce_whole_rows", {&losses, &logits, &targets, &loss_scale});
  check_rows(accepts::ce_whole_rows_logits, d, logits, {&losses});
  check_targets(accepts::ce_whole_rows_targets, d, targets, logits.dim(0));
  expect_accepted(accepts::ce_whole_rows_loss_scale, loss_scale, d);
  expect_numel("ce_whole_rows", "loss_scale", loss_scale, 1);
  MB_OP_DISPATCH(d, ce_whole_rows, losses, logits, targets, ignore, grad, scale, loss_scale);
}

}  // namespace megabatch::ops
