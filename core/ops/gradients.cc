#include "core/ops/gradients.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

void unscale_and_check(const Tensor& grads, const Tensor& found_inf, const Tensor& scaler) {
  const Device d = common_device("unscale_and_check", {&grads, &found_inf, &scaler});
  expect_accepted(accepts::unscale_and_check_grads, grads, d);
  expect_accepted(accepts::unscale_and_check_found_inf, found_inf, d);
  expect_numel("unscale_and_check", "found_inf", found_inf, 1);
  expect_accepted(accepts::unscale_and_check_scaler, scaler, d);
  expect_numel("unscale_and_check", "scaler", scaler, 3);
  MB_OP_DISPATCH(d, unscale_and_check, grads, found_inf, scaler);
}

void loss_scaler_update(const Tensor& scaler, const Tensor& found_inf, const ops::LossScalerConfig& config) {
  const Device d = common_device("loss_scaler_update", {&scaler, &found_inf});
  expect_accepted(accepts::loss_scaler_update_scaler, scaler, d);
  expect_numel("loss_scaler_update", "scaler", scaler, 3);
  expect_accepted(accepts::loss_scaler_update_found_inf, found_inf, d);
  expect_numel("loss_scaler_update", "found_inf", found_inf, 1);
  MB_OP_DISPATCH(d, loss_scaler_update, scaler, found_inf, config);
}

namespace {
// What both split sums of squares take: x f32, both segment lists within it, out f64 (2).
void expect_split_sums(const Accepts& x_row, const Accepts& out_row, Device d, const Tensor& out, const Tensor& x,
                       const std::vector<std::pair<size_t, size_t>>& sharded,
                       const std::vector<std::pair<size_t, size_t>>& replicated) {
  const char* op = x_row.op;
  expect_accepted(x_row, x, d);
  expect_accepted(out_row, out, d);
  expect_numel(op, "out", out, 2);
  expect_segments(op, x, sharded);
  expect_segments(op, x, replicated);
}
}  // namespace

void split_sum_squares(const Tensor& out, const Tensor& x, const std::vector<std::pair<size_t, size_t>>& sharded,
                       const std::vector<std::pair<size_t, size_t>>& replicated) {
  const Device d = common_device("split_sum_squares", {&out, &x});
  expect_split_sums(accepts::split_sum_squares_x, accepts::split_sum_squares_out, d, out, x, sharded, replicated);
  MB_OP_DISPATCH(d, split_sum_squares, out, x, sharded, replicated);
}

void split_sum_squares_of_growth(const Tensor& out, const Tensor& x, const Tensor& prev,
                                 const std::vector<std::pair<size_t, size_t>>& sharded,
                                 const std::vector<std::pair<size_t, size_t>>& replicated) {
  const Device d = common_device("split_sum_squares_of_growth", {&out, &x, &prev});
  expect_split_sums(accepts::split_sum_squares_of_growth_x, accepts::split_sum_squares_of_growth_out, d, out, x, sharded,
                    replicated);
  expect_growth_base("split_sum_squares_of_growth", x, prev);
  MB_OP_DISPATCH(d, split_sum_squares_of_growth, out, x, prev, sharded, replicated);
}

void clip_coefficient(const Tensor& norm, const Tensor& sums, double max_norm) {
  const Device d = common_device("clip_coefficient", {&norm, &sums});
  expect_accepted(accepts::clip_coefficient_norm, norm, d);
  expect_numel("clip_coefficient", "norm", norm, 3);
  expect_accepted(accepts::clip_coefficient_sums, sums, d);
  expect_numel("clip_coefficient", "sums", sums, 2);
  check(max_norm >= 0, "clip_coefficient: max_norm ", max_norm, " < 0");
  MB_OP_DISPATCH(d, clip_coefficient, norm, sums, max_norm);
}

void scale_by(const Tensor& x, const Tensor& factor, size_t index) {
  const Device d = common_device("scale_by", {&x, &factor});
  expect_accepted(accepts::scale_by_x, x, d);
  expect_accepted(accepts::scale_by_factor, factor, d);
  if (index >= factor.numel()) fail("scale_by: index ", index, " outside ", factor.describe());
  MB_OP_DISPATCH(d, scale_by, x, factor, index);
}

}  // namespace megabatch::ops
