#include "core/ops/query_groups.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

namespace {
// qkv and grouped of the same dtype, rows of H x 3 x D and G x (H/G + 2) x D, as many rows
void check_groups(const char* op, const char* qkv_name, const Tensor& qkv, const char* grouped_name,
                  const Tensor& grouped, const QueryGroupShape& s) {
  check(s.heads >= 1 && s.groups >= 1 && s.head_dim >= 1 && s.heads % s.groups == 0, op, ": ", s.heads, " heads in ",
        s.groups, " groups of head dim ", s.head_dim, ": the groups must divide the heads");
  expect_dtype(op, grouped_name, grouped, qkv.dtype());
  const size_t row = static_cast<size_t>(3 * s.heads * s.head_dim),
               grouped_row = static_cast<size_t>((s.heads + 2 * s.groups) * s.head_dim);
  check(qkv.numel() % row == 0 && grouped.numel() == qkv.numel() / row * grouped_row, op, ": ", qkv_name, " ",
        qkv.describe(), " and ", grouped_name, " ", grouped.describe(), " are not as many rows of ", s.heads,
        " heads x [q, k, v] x ", s.head_dim, " and of ", s.groups, " groups x [", s.heads / s.groups,
        " q, k, v] x ", s.head_dim);
}
}  // namespace

void expand_query_groups(const Tensor& qkv, const Tensor& grouped, const QueryGroupShape& s) {
  const Device d = common_device("expand_query_groups", {&qkv, &grouped});
  expect_accepted(accepts::expand_query_groups_grouped, grouped, d);
  check_groups("expand_query_groups", "qkv", qkv, "grouped", grouped, s);
  MB_OP_DISPATCH(d, expand_query_groups, qkv, grouped, s);
}

void reduce_query_groups(const Tensor& dgrouped, const Tensor& dqkv, const QueryGroupShape& s) {
  const Device d = common_device("reduce_query_groups", {&dgrouped, &dqkv});
  expect_accepted(accepts::reduce_query_groups_dqkv, dqkv, d);
  check_groups("reduce_query_groups", "dqkv", dqkv, "dgrouped", dgrouped, s);
  MB_OP_DISPATCH(d, reduce_query_groups, dgrouped, dqkv, s);
}

}  // namespace megabatch::ops
