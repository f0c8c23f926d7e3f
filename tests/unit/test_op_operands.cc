// Operands that do not agree are refused before any kernel runs, by an error that names the op
// and shows each operand (dtype, shape, device): the ops' shared checks (core/ops/check.cc), the
// shape checks of the GEMMs, gathers, embeddings and the loss, and the tensor's own views and
// copies. These checks run at every op call, so their messages are built only when one fails.
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "core/ops/cross_entropy.h"
#include "core/ops/embedding.h"
#include "core/ops/gather.h"
#include "core/ops/gradients.h"
#include "core/ops/matmul.h"
#include "core/ops/reduce.h"
#include "core/ops/residual.h"
#include "core/tensor/tensor.h"
#include "tests/unit/test_util.h"

namespace megabatch {
namespace {
using testing::expect_error;

TEST(OpOperands, OpsRefuseOperandsThatDoNotAgreeNamingEach) {
  const Tensor x({2, 4}, DType::kF32), y({2, 3}, DType::kF32), half({2, 4}, DType::kBF16);
  const Tensor ids = from_host(std::vector<int32_t>{0, 1}, {2});
  // the same dtype and size
  expect_error([&] { ops::residual_forward(x, x, y); },
               "residual_forward: a (f32[2, 4] on cpu) and b (f32[2, 3] on cpu) must have the same dtype and size");
  expect_error([&] { ops::residual_forward(half, x, x); },
               "residual_forward: a (f32[2, 4] on cpu) and out (bf16[2, 4] on cpu) must have the same dtype");
  // a dtype, an element count, segments
  expect_error([&] { ops::gather_rows(half, x, ids); }, "gather_rows: out must be f32, got bf16[2, 4] on cpu");
  expect_error([&] { ops::ce_row_max(Tensor({3}, DType::kF32), x); },
               "ce_row_max: per-row values must have 2 elements, got f32[3] on cpu");
  expect_error(
      [&] {
        ops::segment_sum_squares(Tensor({1}, DType::kF64), x, {{0, 9}});
      },
      "segment_sum_squares: segment [0, 9) outside f32[2, 4] on cpu");
  expect_error([&] { ops::segment_sum_squares(Tensor({1}, DType::kF64), x, {{5, 4}}); }, "segment [5, 4) outside");
  // shapes
  expect_error([&] { ops::ce_row_max(Tensor({8}, DType::kF32), x.view({8})); },
               "ce_row_max: logits must be 2-D, got f32[8] on cpu");
  expect_error(
      [&] {
        ops::linear_forward(x, x, Tensor({4, 3}, DType::kF32), Tensor());
      },
      "linear_forward: in f32[2, 4] on cpu, weight f32[4, 3] on cpu, out f32[2, 4] on cpu do not agree");
  expect_error(
      [&] {
        ops::gemm(x, x, ops::Trans::N, Tensor({3, 4}, DType::kF32), ops::Trans::N);
      },
      "gemm: shapes do not agree: op(A) 2x4, op(B) 3x4, C [2, 4]");
  expect_error([&] { ops::gemm(x, x.view({8}), ops::Trans::N, x, ops::Trans::T); },
               "gemm: 2-D tensors expected, got f32[8] on cpu, f32[2, 4] on cpu, f32[2, 4] on cpu");
  expect_error(
      [&] {
        ops::gather_rows(x, x, from_host(std::vector<int32_t>{0, 1, 1}, {3}));
      },
      "gather_rows: out f32[2, 4] on cpu, in f32[2, 4] on cpu, rows i32[3] on cpu do not agree");
  expect_error([&] { ops::embedding_forward(x, ids, y, 0); },
               "embedding_forward: out f32[2, 4] on cpu, ids i32[2] on cpu, table f32[2, 3] on cpu do not agree");
  expect_error([&] { ops::scale_by(x, Tensor({2}, DType::kF64), 2); }, "scale_by: index 2 outside f64[2] on cpu");
  // operands that agree pass every check
  EXPECT_NO_THROW(ops::residual_forward(Tensor({2, 4}, DType::kF32), x, x));
  EXPECT_NO_THROW(ops::segment_sum_squares(Tensor({2}, DType::kF64), x, {{0, 3}, {3, 8}}));
}

TEST(OpOperands, TensorsRefuseViewsAndCopiesOfWhatTheyDoNotHold) {
  Tensor x({2, 4}, DType::kF32);
  expect_error([&] { (void)x.flat(6, 4); }, "elements [6, 10) of f32[2, 4] on cpu");
  expect_error([&] { (void)x.flat(0, 4, {3}); }, "view of 4 elements as [3]");
  expect_error([&] { (void)x.view({3, 3}); }, "cannot view f32[2, 4] on cpu as [3, 3]");
  expect_error([&] { (void)x.rows(1, 3); }, "rows [1, 3) of f32[2, 4] on cpu");
  expect_error([&] { copy(x, Tensor({2, 3}, DType::kF32)); }, "copy: f32[2, 3] on cpu into f32[2, 4] on cpu");
  expect_error([&] { (void)from_host(std::vector<float>{1, 2, 3}, {2, 2}); }, "from_host: 3 values for shape [2, 2]");
  expect_error([&] { (void)Tensor({2, -1}, DType::kF32); }, "tensor shape [2, -1] has a negative dimension");
  Tensor row = x.rows(0, 1);
  expect_error([&] { row.resize({100}); }, "cannot grow a view (f32[1, 4] on cpu) to [100]");
  EXPECT_EQ(x.flat(4, 4, {2, 2}).numel(), 4u);
  EXPECT_EQ(x.rows(1, 2).numel(), 4u);
}

}  // namespace
}  // namespace megabatch
