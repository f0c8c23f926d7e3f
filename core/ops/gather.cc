#include "core/ops/gather.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

void gather_rows(const Tensor& out, const Tensor& in, const Tensor& rows_) {
  const Device d = common_device("gather_rows", {&out, &in, &rows_});
  expect_accepted(accepts::gather_rows_in, in, d);
  expect_dtype("gather_rows", "out", out, in.dtype());
  expect_accepted(accepts::gather_rows_rows, rows_, d);
  if (!(cols(out) == cols(in) && rows(out) == static_cast<int64_t>(rows_.numel())))
    fail("gather_rows: out ", out.describe(), ", in ", in.describe(), ", rows ", rows_.describe(), " do not agree");
  MB_OP_DISPATCH(d, gather_rows, out, in, rows_);
}

void scatter_add_rows(const Tensor& dst, const Tensor& src, const Tensor& rows_) {
  const Device d = common_device("scatter_add_rows", {&dst, &src, &rows_});
  expect_accepted(accepts::scatter_add_rows_src, src, d);
  expect_dtype("scatter_add_rows", "dst", dst, src.dtype());
  expect_accepted(accepts::scatter_add_rows_rows, rows_, d);
  if (!(cols(dst) == cols(src) && rows(src) == static_cast<int64_t>(rows_.numel())))
    fail("scatter_add_rows: dst ", dst.describe(), ", src ", src.describe(), ", rows ", rows_.describe(),
         " do not agree");
  MB_OP_DISPATCH(d, scatter_add_rows, dst, src, rows_);
}

void scatter_rows(const Tensor& dst, const Tensor& src, const Tensor& rows_) {
  const Device d = common_device("scatter_rows", {&dst, &src, &rows_});
  expect_accepted(accepts::scatter_rows_src, src, d);
  expect_dtype("scatter_rows", "dst", dst, src.dtype());
  expect_accepted(accepts::scatter_rows_rows, rows_, d);
  if (!(cols(dst) == cols(src) && rows(src) == static_cast<int64_t>(rows_.numel())))
    fail("scatter_rows: dst ", dst.describe(), ", src ", src.describe(), ", rows ", rows_.describe(), " do not agree");
  MB_OP_DISPATCH(d, scatter_rows, dst, src, rows_);
}

}  // namespace megabatch::ops
