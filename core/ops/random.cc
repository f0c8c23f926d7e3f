#include "core/ops/random.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

void normal_fill(const Tensor& out, uint64_t key, const ShardLayout& layout) {
  const Device d = common_device("normal_fill", {&out});
  expect_accepted(accepts::normal_fill_out, out, d);
  if (!(out.numel() <= static_cast<size_t>(layout.rows * layout.cols)))
    fail("normal_fill: ", out.describe(), " is larger than its shard (", layout.rows, " x ", layout.cols, ")");
  MB_OP_DISPATCH(d, normal_fill, out, key, layout);
}

}  // namespace megabatch::ops
