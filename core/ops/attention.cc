#include "core/ops/attention.h"

#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

namespace {
void check_common(const Accepts& input, const Accepts& mask, Device d, const Tensor& x, const Tensor& probs,
                  const Tensor& key_mask, int64_t B, int64_t H, int64_t Tq, int64_t Tk, const DropoutKey* dropout) {
  const char* op = input.op;
  expect_accepted(input, x, d);
  expect_dtype(op, "probs", probs, x.dtype());
  expect_numel(op, "probs", probs, static_cast<size_t>(B * H * Tq * Tk));
  expect_accepted(mask, key_mask, d);
  expect_numel(op, "key_mask", key_mask, static_cast<size_t>(B * Tk));
  check(!dropout || (dropout->p >= 0 && dropout->p < 1), op, ": dropout probability outside [0, 1)");
}
}  // namespace

namespace detail {
void check_groups(const char* op, const AttentionShape& s, const Tensor& bias) {
  const int64_t G = kv_heads(s);
  check(G >= 1 && s.H % G == 0, op, ": ", s.groups, " key/value groups do not divide ", s.H,
        " heads (groups: 0 for one a head, or a divisor of the heads)");
  check(G == s.H || !bias.defined(), op, ": a position bias with grouped-query attention (", G, " groups of ", s.H,
        " heads) is not taken: T5, the one model with a bias, has no groups");
}

void check_documents(const char* op, const Accepts& row, const Tensor& documents, const AttentionShape& s, Device d) {
  if (!documents.defined()) return;
  expect_accepted(row, documents, d);
  expect_numel(op, "documents", documents, static_cast<size_t>(s.B * s.T));
  if (!documents.device().is_cpu()) return;
  const int32_t* ids = documents.data<int32_t>();
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 1; t < s.T; ++t)
      check(ids[b * s.T + t] >= ids[b * s.T + t - 1], op, ": documents of row ", b, " go from ", ids[b * s.T + t - 1],
            " to ", ids[b * s.T + t], " at position ", t,
            "; a document is a run of positions, its ids nondecreasing along a row");
}
}  // namespace detail

void attention_forward(const Tensor& out, const Tensor& probs, const Tensor& qkv, const Tensor& key_mask,
                       const AttentionShape& s, const DropoutKey* dropout, const Tensor& bias,
                       const Tensor& documents) {
  const Device d = common_device("attention_forward", {&out, &probs, &qkv, &key_mask, &bias, &documents});
  check_common(accepts::attention_forward_qkv, accepts::attention_forward_key_mask, d, qkv, probs, key_mask, s.B, s.H,
               s.T, s.T, dropout);
  check_groups("attention_forward", s, bias);
  expect_numel("attention_forward", "qkv", qkv, static_cast<size_t>(s.B * s.T * qkv_width(s)));
  expect_dtype("attention_forward", "out", out, qkv.dtype());
  expect_numel("attention_forward", "out", out, static_cast<size_t>(s.B * s.T * s.H * s.D));
  expect_dtype("attention_forward", "bias", bias, qkv.dtype());
  expect_numel("attention_forward", "bias", bias, static_cast<size_t>(s.H * s.T * s.T));
  check_documents("attention_forward", accepts::attention_forward_documents, documents, s, d);
  MB_OP_DISPATCH(d, attention_forward, out, probs, qkv, key_mask, s, dropout, bias, documents);
}

void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                        const Tensor& key_mask, const AttentionShape& s, const DropoutKey* dropout,
                        const Tensor& dbias) {
  const Device d = common_device("attention_backward", {&dqkv, &dout, &qkv, &probs, &key_mask, &dbias});
  check_common(accepts::attention_backward_qkv, accepts::attention_backward_key_mask, d, qkv, probs, key_mask, s.B, s.H,
               s.T, s.T, dropout);
  check_groups("attention_backward", s, dbias);
  expect_numel("attention_backward", "qkv", qkv, static_cast<size_t>(s.B * s.T * qkv_width(s)));
  expect_same("attention_backward", "qkv", qkv, "dqkv", dqkv);
  expect_dtype("attention_backward", "dout", dout, qkv.dtype());
  expect_numel("attention_backward", "dout", dout, static_cast<size_t>(s.B * s.T * s.H * s.D));
  expect_dtype("attention_backward", "dbias", dbias, acc_type(qkv.dtype()));
  expect_numel("attention_backward", "dbias", dbias, static_cast<size_t>(s.H * s.T * s.T));
  MB_OP_DISPATCH(d, attention_backward, dqkv, dout, qkv, probs, key_mask, s, dropout, dbias);
}

void cross_attention_forward(const Tensor& out, const Tensor& probs, const Tensor& q, const Tensor& kv,
                             const Tensor& key_mask, const CrossAttentionShape& s, const DropoutKey* dropout) {
  const Device d = common_device("cross_attention_forward", {&out, &probs, &q, &kv, &key_mask});
  check_common(accepts::cross_attention_forward_q, accepts::cross_attention_forward_key_mask, d, q, probs, key_mask, s.B,
               s.H, s.Tq, s.Tk, dropout);
  expect_numel("cross_attention_forward", "q", q, static_cast<size_t>(s.B * s.Tq * s.H * s.D));
  expect_dtype("cross_attention_forward", "kv", kv, q.dtype());
  expect_numel("cross_attention_forward", "kv", kv, static_cast<size_t>(s.B * s.Tk * s.H * 2 * s.D));
  expect_same("cross_attention_forward", "q", q, "out", out);
  MB_OP_DISPATCH(d, cross_attention_forward, out, probs, q, kv, key_mask, s, dropout);
}

void cross_attention_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& q,
                              const Tensor& kv, const Tensor& probs, const Tensor& key_mask,
                              const CrossAttentionShape& s, const DropoutKey* dropout) {
  const Device d = common_device("cross_attention_backward", {&dq, &dkv, &dout, &q, &kv, &probs, &key_mask});
  check_common(accepts::cross_attention_backward_q, accepts::cross_attention_backward_key_mask, d, q, probs, key_mask,
               s.B, s.H, s.Tq, s.Tk, dropout);
  expect_numel("cross_attention_backward", "q", q, static_cast<size_t>(s.B * s.Tq * s.H * s.D));
  expect_dtype("cross_attention_backward", "kv", kv, q.dtype());
  expect_numel("cross_attention_backward", "kv", kv, static_cast<size_t>(s.B * s.Tk * s.H * 2 * s.D));
  expect_same("cross_attention_backward", "q", q, "dq", dq);
  expect_same("cross_attention_backward", "kv", kv, "dkv", dkv);
  expect_same("cross_attention_backward", "q", q, "dout", dout);
  MB_OP_DISPATCH(d, cross_attention_backward, dq, dkv, dout, q, kv, probs, key_mask, s, dropout);
}

}  // namespace megabatch::ops
