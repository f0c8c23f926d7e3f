#include "core/ops/flash_attention.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>

#include "core/device/runtime.h"
#include "core/ops/check.h"
#include "core/ops/op_dispatch.h"

namespace megabatch::ops {
using namespace detail;

namespace {
// The compute capability the flash kernels run as on GPU d, asked once per GPU (the layers ask
// every step): the GPU's, or less where the build has only an older one's code for it.
int flash_capability(Device d) {
  static std::mutex mu;
  static std::map<int, int> capability;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = capability.find(d.index);
  if (it != capability.end()) return it->second;
  const runtime::GpuInfo info = runtime::gpu_info(d.index);
  int code = info.major * 10 + info.minor;
  MB_CUDA(code = std::min(code, cuda::flash_code_arch(d.index)));
  return capability[d.index] = code;
}
}  // namespace

bool flash_attention_supported(Device d, DType t, int64_t head_size) {
  if (d.is_cpu()) return true;
  if (!accepts::flash_attention_forward_qkv.cuda.has(t) || (head_size != 64 && head_size != 128)) return false;
  const int cc = flash_capability(d);
  // sm_80 and later: mma m16n8k16 with bf16/f16 operands. sm_75 (T4): fp16 only, as two
  // m16n8k8 products, and head size 64 only (at 128 the tiles outgrow its 64 KiB of shared
  // memory a block).
  if (cc >= 80) return true;
  return cc >= 75 && t == DType::kF16 && head_size == 64;
}

namespace {
constexpr int kUnset = -1;  // not chosen yet: the environment, else the default, at the first ask
std::atomic<int> g_flash_dq{kUnset};
std::atomic<int64_t> g_ordered_calls{0};
std::atomic<int> g_forward_rows{kUnset};

// The choice `name` names in the environment (one of `values`, its index), else `fallback`.
int chosen(std::atomic<int>& choice, const char* name, std::initializer_list<const char*> values, int fallback) {
  int v = choice.load();
  if (v != kUnset) return v;
  v = fallback;
  if (const char* e = std::getenv(name); e && *e) {
    v = kUnset;
    int i = 0;
    for (const char* value : values) {
      if (std::string(e) == value) v = i;
      ++i;
    }
    if (v == kUnset) {
      std::string all;
      for (const char* value : values) all += std::string(all.empty() ? "" : " or ") + value;
      fail(name, "=", e, ": expected ", all, " (or leave it unset)");
    }
  }
  int expected = kUnset;
  choice.compare_exchange_strong(expected, v);  // a set_...() since wins
  return choice.load();
}
}  // namespace

void set_flash_forward_rows(FlashForwardRows rows) { g_forward_rows = static_cast<int>(rows); }
FlashForwardRows flash_forward_rows() {
  return static_cast<FlashForwardRows>(
      chosen(g_forward_rows, "MEGABATCH_FLASH_FORWARD_ROWS", {"16", "32"}, static_cast<int>(FlashForwardRows::k16)));
}

bool flash_dq_ordered_supported(Device d) { return d.is_cuda() && flash_capability(d) >= 80; }
void set_flash_dq(FlashDq how) { g_flash_dq = static_cast<int>(how); }
FlashDq flash_dq() {
  return static_cast<FlashDq>(
      chosen(g_flash_dq, "MEGABATCH_FLASH_DQ", {"separate", "ordered"}, static_cast<int>(FlashDq::kSeparate)));
}
int64_t flash_dq_ordered_calls() { return g_ordered_calls.load(); }
void count_flash_dq_ordered_call() { ++g_ordered_calls; }

namespace {
// A GPU before sm_80 (T4) runs the kernels in fp16 at head size 64 only.
void check_gpu(const char* op, const Tensor& x, int64_t head_size) {
  if (!(x.device().is_cpu() || flash_attention_supported(x.device(), x.dtype(), head_size)))
    fail(op, ": ", x.device().str(), " runs the flash kernels in fp16 at head size 64 only (sm_75), not ",
         dtype_name(x.dtype()), " at head size ", head_size,
         " (flash_attention_supported says which; the explicit attention takes any)");
}

void check_shapes(const char* op, const Tensor& qkv, const Tensor& lse, const Tensor& key_mask, const AttentionShape& s,
                  const DropoutKey* dropout) {
  check_groups(op, s, {});
  expect_numel(op, "qkv", qkv, static_cast<size_t>(s.B * s.T * qkv_width(s)));
  expect_numel(op, "lse", lse, static_cast<size_t>(s.B * s.H * s.T));
  expect_numel(op, "key_mask", key_mask, static_cast<size_t>(s.B * s.T));
  check(!dropout || (dropout->p >= 0 && dropout->p < 1), op, ": dropout probability outside [0, 1)");
  check(qkv.device().is_cpu() || s.D == 64 || s.D == 128, op, ": the CUDA kernels take head size 64 or 128, not ", s.D,
        " (flash_attention_supported says which; the explicit attention takes any)");
  check_gpu(op, qkv, s.D);
}
void check_cross_shapes(const char* op, const Tensor& q, const Tensor& kv, const Tensor& lse, const Tensor& key_mask,
                        const CrossAttentionShape& s, const DropoutKey* dropout) {
  expect_numel(op, "q", q, static_cast<size_t>(s.B * s.Tq * s.H * s.D));
  expect_numel(op, "kv", kv, static_cast<size_t>(s.B * s.Tk * s.H * 2 * s.D));
  expect_dtype(op, "kv", kv, q.dtype());
  expect_numel(op, "lse", lse, static_cast<size_t>(s.B * s.H * s.Tq));
  expect_numel(op, "key_mask", key_mask, static_cast<size_t>(s.B * s.Tk));
  check(!dropout || (dropout->p >= 0 && dropout->p < 1), op, ": dropout probability outside [0, 1)");
  check(q.device().is_cpu() || s.D == 64 || s.D == 128, op, ": the CUDA kernels take head size 64 or 128, not ", s.D,
        " (flash_attention_supported says which; the explicit attention takes any)");
  check_gpu(op, q, s.D);
}

// The position bias (H, T, T) in qkv's dtype, and its gradient in the accumulation type.
void check_bias(const char* op, const Tensor& qkv, const AttentionShape& s, const Tensor& bias, const Tensor& dbias) {
  expect_dtype(op, "bias", bias, qkv.dtype());
  expect_numel(op, "bias", bias, static_cast<size_t>(s.H * s.T * s.T));
  check_groups(op, s, bias.defined() ? bias : dbias);
  check(!dbias.defined() || bias.defined(), op, ": dbias without the bias it is the gradient of");
  expect_dtype(op, "dbias", dbias, acc_type(qkv.dtype()));
  expect_numel(op, "dbias", dbias, static_cast<size_t>(s.H * s.T * s.T));
}
}  // namespace

void flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& key_mask,
                             const AttentionShape& s, const DropoutKey* dropout, const Tensor& bias,
                             const Tensor& documents) {
  const Device d = common_device("flash_attention_forward", {&out, &lse, &qkv, &key_mask, &bias, &documents});
  expect_accepted(accepts::flash_attention_forward_qkv, qkv, d);
  expect_accepted(accepts::flash_attention_forward_lse, lse, d);
  expect_accepted(accepts::flash_attention_forward_key_mask, key_mask, d);
  check_shapes("flash_attention_forward", qkv, lse, key_mask, s, dropout);
  expect_dtype("flash_attention_forward", "out", out, qkv.dtype());
  expect_numel("flash_attention_forward", "out", out, static_cast<size_t>(s.B * s.T * s.H * s.D));
  check_bias("flash_attention_forward", qkv, s, bias, {});
  check_documents("flash_attention_forward", accepts::flash_attention_forward_documents, documents, s, d);
  MB_OP_DISPATCH(d, flash_attention_forward, out, lse, qkv, key_mask, s, dropout, bias, documents);
}

void flash_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, const Tensor& key_mask, const AttentionShape& s,
                              const DropoutKey* dropout, Write w, const Tensor& bias, const Tensor& dbias,
                              const Tensor& documents) {
  const Device d =
      common_device("flash_attention_backward", {&dqkv, &dout, &qkv, &out, &lse, &key_mask, &bias, &dbias, &documents});
  expect_accepted(accepts::flash_attention_backward_qkv, qkv, d);
  expect_accepted(accepts::flash_attention_backward_lse, lse, d);
  expect_accepted(accepts::flash_attention_backward_key_mask, key_mask, d);
  check_shapes("flash_attention_backward", qkv, lse, key_mask, s, dropout);
  expect_same("flash_attention_backward", "qkv", qkv, "dqkv", dqkv);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"dout", &dout}, {"out", &out}}) {
    expect_dtype("flash_attention_backward", name, *t, qkv.dtype());
    expect_numel("flash_attention_backward", name, *t, static_cast<size_t>(s.B * s.T * s.H * s.D));
  }
  check_bias("flash_attention_backward", qkv, s, bias, dbias);
  check_documents("flash_attention_backward", accepts::flash_attention_backward_documents, documents, s, d);
  MB_OP_DISPATCH(d, flash_attention_backward, dqkv, dout, qkv, out, lse, key_mask, s, dropout, w, bias, dbias,
                 documents);
}

void flash_cross_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& kv,
                                   const Tensor& key_mask, const CrossAttentionShape& s, const DropoutKey* dropout) {
  const char* op = "flash_cross_attention_forward";
  const Device d = common_device(op, {&out, &lse, &q, &kv, &key_mask});
  expect_accepted(accepts::flash_cross_attention_forward_q, q, d);
  expect_accepted(accepts::flash_cross_attention_forward_lse, lse, d);
  expect_accepted(accepts::flash_cross_attention_forward_key_mask, key_mask, d);
  check_cross_shapes(op, q, kv, lse, key_mask, s, dropout);
  expect_dtype(op, "out", out, q.dtype());
  expect_numel(op, "out", out, static_cast<size_t>(s.B * s.Tq * s.H * s.D));
  MB_OP_DISPATCH(d, flash_cross_attention_forward, out, lse, q, kv, key_mask, s, dropout);
}

void flash_cross_attention_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& q,
                                    const Tensor& kv, const Tensor& out, const Tensor& lse, const Tensor& key_mask,
                                    const CrossAttentionShape& s, const DropoutKey* dropout, Write w) {
  const char* op = "flash_cross_attention_backward";
  const Device d = common_device(op, {&dq, &dkv, &dout, &q, &kv, &out, &lse, &key_mask});
  expect_accepted(accepts::flash_cross_attention_backward_q, q, d);
  expect_accepted(accepts::flash_cross_attention_backward_lse, lse, d);
  expect_accepted(accepts::flash_cross_attention_backward_key_mask, key_mask, d);
  check_cross_shapes(op, q, kv, lse, key_mask, s, dropout);
  expect_same(op, "q", q, "dq", dq);
  expect_same(op, "kv", kv, "dkv", dkv);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"dout", &dout}, {"out", &out}}) {
    expect_dtype(op, name, *t, q.dtype());
    expect_numel(op, name, *t, static_cast<size_t>(s.B * s.Tq * s.H * s.D));
  }
  MB_OP_DISPATCH(d, flash_cross_attention_backward, dq, dkv, dout, q, kv, out, lse, key_mask, s, dropout, w);
}

}  // namespace megabatch::ops
