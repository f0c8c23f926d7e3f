#include "core/ops/rotary.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

namespace {
void check_rotary(const char* op, const Tensor& qkv, const RotaryShape& s) {
  check(s.T >= 1 && s.heads >= 1 && s.head_dim >= 1 && s.rotary_dim >= 2 && s.rotary_dim % 2 == 0 &&
            s.rotary_dim <= s.head_dim && s.base > 0 && s.position_scale > 0,
        op, ": T ", s.T, ", heads ", s.heads, ", head dim ", s.head_dim, ", rotary dim ", s.rotary_dim, ", base ",
        s.base, ", position scale ", s.position_scale,
        ": the rotary dim must be even, 2 or more and at most the head dim, the base and the position scale above 0");
  const int64_t G = kv_heads(s);
  check(G >= 1 && s.heads % G == 0, op, ": ", s.groups, " key/value groups do not divide ", s.heads, " heads");
  const size_t row = static_cast<size_t>((s.heads + 2 * G) * s.head_dim);
  if (!(qkv.numel() % row == 0 && (qkv.numel() / row) % static_cast<size_t>(s.T) == 0))
    fail(op, ": qkv ", qkv.describe(), " is not rows of ", G, " groups of [", s.heads / G, " q, k, v] x ", s.head_dim,
         " in sequences of ", s.T);
}
}  // namespace

void rope_forward(const Tensor& qkv, const RotaryShape& s) {
  const Device d = common_device("rope_forward", {&qkv});
  expect_accepted(accepts::rope_forward_qkv, qkv, d);
  check_rotary("rope_forward", qkv, s);
  MB_OP_DISPATCH(d, rope_forward, qkv, s);
}

void rope_backward(const Tensor& dqkv, const RotaryShape& s) {
  const Device d = common_device("rope_backward", {&dqkv});
  expect_accepted(accepts::rope_backward_dqkv, dqkv, d);
  check_rotary("rope_backward", dqkv, s);
  MB_OP_DISPATCH(d, rope_backward, dqkv, s);
}

}  // namespace megabatch::ops
