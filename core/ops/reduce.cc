#include "core/ops/reduce.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

void sum(const Tensor& out, const Tensor& x, bool accumulate) {
  const Device d = common_device("sum", {&out, &x});
  expect_accepted(accepts::sum_x, x, d);
  expect_accepted(accepts::sum_out, out, d);
  expect_numel("sum", "out", out, 1);
  MB_OP_DISPATCH(d, sum, out, x, accumulate);
}

void weighted_accumulate(const Tensor& out, const Tensor& x, const std::vector<double>& weights) {
  const Device d = common_device("weighted_accumulate", {&out, &x});
  expect_accepted(accepts::weighted_accumulate_x, x, d);
  expect_accepted(accepts::weighted_accumulate_out, out, d);
  if (!(weights.size() == x.numel() && out.numel() >= x.numel() && weights.size() <= 8))
    fail("weighted_accumulate: ", weights.size(), " weights for x ", x.describe(), " into ", out.describe(),
         " (at most 8 terms)");
  MB_OP_DISPATCH(d, weighted_accumulate, out, x, weights);
}

namespace {
// What both segment sums of squares take: x (f32), segments within it, out (f64, S).
void expect_segment_sums(const Accepts& x_row, const Accepts& out_row, Device d, const Tensor& out, const Tensor& x,
                         const std::vector<std::pair<size_t, size_t>>& segments) {
  expect_accepted(x_row, x, d);
  expect_accepted(out_row, out, d);
  expect_numel(x_row.op, "out", out, segments.size());
  expect_segments(x_row.op, x, segments);
}
}  // namespace

void segment_sum_squares(const Tensor& out, const Tensor& x, const std::vector<std::pair<size_t, size_t>>& segments) {
  const Device d = common_device("segment_sum_squares", {&out, &x});
  expect_segment_sums(accepts::segment_sum_squares_x, accepts::segment_sum_squares_out, d, out, x, segments);
  MB_OP_DISPATCH(d, segment_sum_squares, out, x, segments);
}

void segment_sum_squares_of_growth(const Tensor& out, const Tensor& x, const Tensor& prev,
                                   const std::vector<std::pair<size_t, size_t>>& segments) {
  const Device d = common_device("segment_sum_squares_of_growth", {&out, &x, &prev});
  expect_segment_sums(accepts::segment_sum_squares_of_growth_x, accepts::segment_sum_squares_of_growth_out, d, out, x,
                      segments);
  expect_growth_base("segment_sum_squares_of_growth", x, prev);
  MB_OP_DISPATCH(d, segment_sum_squares_of_growth, out, x, prev, segments);
}

}  // namespace megabatch::ops
