#include "core/ops/relative_position.h"

#include <algorithm>
#include <cmath>

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

int relative_position_bucket(int64_t i, int64_t j, bool bidirectional, int num_buckets, int max_distance) {
  int64_t n = i - j;  // how far back the key is
  int bucket = 0;
  if (bidirectional) {
    num_buckets /= 2;
    if (n < 0) bucket += num_buckets;  // keys after the query use the upper half
    n = n < 0 ? -n : n;
  } else if (n < 0) {
    n = 0;  // later keys (masked in a causal decoder anyway)
  }
  const int exact = num_buckets / 2;
  if (n < exact) return bucket + static_cast<int>(n);
  const double wide = std::log(static_cast<double>(n) / exact) / std::log(static_cast<double>(max_distance) / exact) *
                      (num_buckets - exact);
  const int large = exact + static_cast<int>(wide);
  return bucket + std::min(large, num_buckets - 1);
}

void relative_bias_forward(const Tensor& out, const Tensor& table, const Tensor& buckets) {
  const Device d = common_device("relative_bias_forward", {&out, &table, &buckets});
  expect_accepted(accepts::relative_bias_forward_table, table, d);
  expect_dtype("relative_bias_forward", "out", out, table.dtype());
  expect_accepted(accepts::relative_bias_forward_buckets, buckets, d);
  if (!(table.ndim() == 2 && out.numel() == static_cast<size_t>(table.dim(1)) * buckets.numel()))
    fail("relative_bias_forward: out ", out.describe(), ", table ", table.describe(), ", buckets ", buckets.describe(),
         " do not agree");
  MB_OP_DISPATCH(d, relative_bias_forward, out, table, buckets);
}

void relative_bias_backward(const Tensor& dtable, const Tensor& dout, const Tensor& buckets) {
  const Device d = common_device("relative_bias_backward", {&dtable, &dout, &buckets});
  expect_accepted(accepts::relative_bias_backward_dout, dout, d);
  expect_dtype("relative_bias_backward", "dtable", dtable, acc_type(dout.dtype()));
  expect_accepted(accepts::relative_bias_backward_buckets, buckets, d);
  if (!(dtable.ndim() == 2 && dout.numel() == static_cast<size_t>(dtable.dim(1)) * buckets.numel()))
    fail("relative_bias_backward: dtable ", dtable.describe(), ", dout ", dout.describe(), ", buckets ",
         buckets.describe(), " do not agree");
  MB_OP_DISPATCH(d, relative_bias_backward, dtable, dout, buckets);
}

}  // namespace megabatch::ops
