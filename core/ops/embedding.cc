#include "core/ops/embedding.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table, int64_t row_begin, bool accumulate) {
  const Device d = common_device("embedding_forward", {&out, &ids, &table});
  expect_accepted(accepts::embedding_forward_table, table, d);
  expect_dtype("embedding_forward", "out", out, table.dtype());
  expect_accepted(accepts::embedding_forward_ids, ids, d);
  if (!(table.ndim() == 2 && cols(out) == table.dim(1) && rows(out) == static_cast<int64_t>(ids.numel())))
    fail("embedding_forward: out ", out.describe(), ", ids ", ids.describe(), ", table ", table.describe(),
         " do not agree");
  MB_OP_DISPATCH(d, embedding_forward, out, ids, table, row_begin, accumulate);
}

void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids, int64_t row_begin) {
  const Device d = common_device("embedding_backward", {&dtable, &dout, &ids});
  expect_accepted(accepts::embedding_backward_dout, dout, d);
  expect_dtype("embedding_backward", "dtable", dtable, acc_type(dout.dtype()));
  expect_accepted(accepts::embedding_backward_ids, ids, d);
  if (!(dtable.ndim() == 2 && cols(dout) == dtable.dim(1) && rows(dout) == static_cast<int64_t>(ids.numel())))
    fail("embedding_backward: dtable ", dtable.describe(), ", dout ", dout.describe(), ", ids ", ids.describe(),
         " do not agree");
  MB_OP_DISPATCH(d, embedding_backward, dtable, dout, ids, row_begin);
}

}  // namespace megabatch::ops
