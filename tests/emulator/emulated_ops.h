// The op API as test_ops_devices.cc and test_attention_devices.cc call it, in their
// warp-emulator build (test_ops_emulated, MB_TEST_DEVICE_EMULATED): `ops::` there is this
// namespace. A call whose tensors live on the
// emulated GPU (emulated_device(): host memory standing for the GPU's) runs the CUDA backend's
// own code, core/ops/cuda/*.cu compiled as C++ for the warp emulator (ops::emulated); a call
// on the reference's CPU tensors runs the public op. The emulated calls go straight to the
// backend: the public op's argument checks are tested in the CPU and GPU programs.
//
// Every op the test bodies name is here. Those whose CUDA code the emulator cannot run
// (cuBLASLt's GEMMs) refuse an emulated tensor, so that a test never passes by
// running the CPU's code where the GPU's was meant; the tests that need them skip
// (MB_SKIP_ON_EMULATOR in tests/unit/op_harness.h).
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/ops/backends.h"  // ops::emulated
#include "core/tensor/tensor.h"

namespace megabatch::testing {

// Where the emulated program's device tensors live: host memory, told apart from the
// reference's CPU tensors (cpu:0) by its index.
constexpr Device emulated_device() { return Device{DeviceType::kCpu, 1}; }

namespace emulated_ops {

using ops::AttentionShape;
using ops::CrossAttentionShape;
using ops::DropoutKey;
using ops::flash_dq;
using ops::flash_dq_ordered_calls;
using ops::flash_dq_ordered_supported;
using ops::flash_forward_rows;
using ops::FlashDq;
using ops::FlashForwardRows;
using ops::relative_position_bucket;
using ops::RotaryShape;
using ops::set_flash_dq;
using ops::set_flash_forward_rows;
using ops::ShardLayout;
using ops::Trans;
using ops::Write;

// On the emulated GPU, what the CUDA flash kernels take there (sm_80 code): bf16 and fp16 at
// head size 64 or 128; elsewhere the op's own answer.
inline bool flash_attention_supported(Device d, DType t, int64_t head_size) {
  if (d != emulated_device()) return ops::flash_attention_supported(d, t, head_size);
  return (t == DType::kBF16 || t == DType::kF16) && (head_size == 64 || head_size == 128);
}

namespace detail {
inline bool on_emulator(const Tensor& t) { return t.defined() && t.device() == emulated_device(); }
template <typename T>
bool on_emulator(const T&) {
  return false;
}
inline bool elsewhere(const Tensor& t) { return t.defined() && t.device() != emulated_device(); }
template <typename T>
bool elsewhere(const T&) {
  return false;
}
// Whether the call is the emulated program's (a tensor on the emulated device), which then
// has every tensor there.
template <typename... A>
bool emulated(const char* op, const A&... a) {
  if (!(on_emulator(a) || ...)) return false;
  if ((elsewhere(a) || ...))
    throw std::logic_error(std::string(op) + ": tensors on the emulated GPU and elsewhere in one call");
  return true;
}
}  // namespace detail

#define MB_UNPACK(...) __VA_ARGS__
// fn with the public signature `params`, called with `args`
#define MB_EMULATED_OP(fn, params, args)       \
  inline void fn params {                      \
    if (detail::emulated(#fn, MB_UNPACK args)) \
      ::megabatch::ops::emulated::fn args;     \
    else                                       \
      ::megabatch::ops::fn args;               \
  }
#define MB_NOT_EMULATED(fn, what, params, args)                                                   \
  inline void fn params {                                                                         \
    if (detail::emulated(#fn, MB_UNPACK args))                                                    \
      throw std::logic_error(#fn ": its CUDA code (" what ") does not run on the warp emulator"); \
    ::megabatch::ops::fn args;                                                                    \
  }

// layernorm.h
MB_EMULATED_OP(layernorm_forward,
               (const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in, const Tensor& weight,
                const Tensor& bias, double eps),
               (out, mean, rstd, in, weight, bias, eps))
MB_EMULATED_OP(layernorm_backward,
               (const Tensor& din, const Tensor& dweight, const Tensor& dbias, const Tensor& dout, const Tensor& in,
                const Tensor& weight, const Tensor& mean, const Tensor& rstd),
               (din, dweight, dbias, dout, in, weight, mean, rstd))
MB_EMULATED_OP(rmsnorm_forward,
               (const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& weight, double eps),
               (out, rstd, in, weight, eps))
MB_EMULATED_OP(layernorm_residual_forward,
               (const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& a,
                const Tensor& b, const Tensor& weight, const Tensor& bias, double eps),
               (sum, out, mean, rstd, a, b, weight, bias, eps))
MB_EMULATED_OP(rmsnorm_residual_forward,
               (const Tensor& sum, const Tensor& out, const Tensor& rstd, const Tensor& a, const Tensor& b,
                const Tensor& weight, double eps),
               (sum, out, rstd, a, b, weight, eps))
MB_EMULATED_OP(rmsnorm_backward,
               (const Tensor& din, const Tensor& dweight, const Tensor& dout, const Tensor& in, const Tensor& weight,
                const Tensor& rstd),
               (din, dweight, dout, in, weight, rstd))
// activation.h
MB_EMULATED_OP(gelu_forward, (const Tensor& out, const Tensor& in), (out, in))
MB_EMULATED_OP(gelu_backward, (const Tensor& din, const Tensor& dout, const Tensor& in, Write w = Write::kAdd),
               (din, dout, in, w))
MB_EMULATED_OP(rope_forward, (const Tensor& qkv, const RotaryShape& s), (qkv, s))
MB_EMULATED_OP(rope_backward, (const Tensor& dqkv, const RotaryShape& s), (dqkv, s))
MB_EMULATED_OP(squared_relu_forward, (const Tensor& out, const Tensor& in), (out, in))
MB_EMULATED_OP(squared_relu_backward, (const Tensor& din, const Tensor& dout, const Tensor& in), (din, dout, in))
MB_EMULATED_OP(swiglu_forward, (const Tensor& out, const Tensor& in), (out, in))
MB_EMULATED_OP(swiglu_backward, (const Tensor& din, const Tensor& dout, const Tensor& in), (din, dout, in))
MB_EMULATED_OP(tanh_forward, (const Tensor& out, const Tensor& in), (out, in))
MB_EMULATED_OP(tanh_backward, (const Tensor& din, const Tensor& dout, const Tensor& out), (din, dout, out))
// residual.h
MB_EMULATED_OP(residual_forward, (const Tensor& out, const Tensor& a, const Tensor& b), (out, a, b))
MB_EMULATED_OP(residual_backward, (const Tensor& da, const Tensor& db, const Tensor& dout), (da, db, dout))
// dropout.h
MB_EMULATED_OP(dropout_forward, (const Tensor& out, const Tensor& in, uint64_t offset, const DropoutKey& k),
               (out, in, offset, k))
MB_EMULATED_OP(dropout_backward,
               (const Tensor& din, const Tensor& dout, uint64_t offset, const DropoutKey& k, Write w = Write::kAdd),
               (din, dout, offset, k, w))
// elementwise.h
MB_EMULATED_OP(cast, (const Tensor& dst, const Tensor& src), (dst, src))
MB_EMULATED_OP(scale, (const Tensor& x, float s), (x, s))
// gather.h
MB_EMULATED_OP(gather_rows, (const Tensor& out, const Tensor& in, const Tensor& rows), (out, in, rows))
MB_EMULATED_OP(scatter_add_rows, (const Tensor& dst, const Tensor& src, const Tensor& rows), (dst, src, rows))
MB_EMULATED_OP(scatter_rows, (const Tensor& dst, const Tensor& src, const Tensor& rows), (dst, src, rows))
// random.h
MB_EMULATED_OP(normal_fill, (const Tensor& out, uint64_t key, const ShardLayout& layout), (out, key, layout))
// relative_position.h
MB_EMULATED_OP(relative_bias_forward, (const Tensor& out, const Tensor& table, const Tensor& buckets),
               (out, table, buckets))
MB_EMULATED_OP(relative_bias_backward, (const Tensor& dtable, const Tensor& dout, const Tensor& buckets),
               (dtable, dout, buckets))
// cross_entropy.h
MB_EMULATED_OP(ce_row_max, (const Tensor& rowmax, const Tensor& logits), (rowmax, logits))
MB_EMULATED_OP(ce_sum_exp, (const Tensor& sumexp, const Tensor& logits, const Tensor& rowmax), (sumexp, logits, rowmax))
MB_EMULATED_OP(ce_target_logit, (const Tensor& target, const Tensor& logits, const Tensor& targets, int64_t v_begin),
               (target, logits, targets, v_begin))
MB_EMULATED_OP(ce_loss,
               (const Tensor& losses, const Tensor& rowmax, const Tensor& sumexp, const Tensor& target,
                const Tensor& targets, int32_t ignore),
               (losses, rowmax, sumexp, target, targets, ignore))
MB_EMULATED_OP(ce_backward,
               (const Tensor& dlogits, const Tensor& logits, const Tensor& rowmax, const Tensor& sumexp,
                const Tensor& targets, int64_t v_begin, int32_t ignore, float scale, const Tensor& loss_scale),
               (dlogits, logits, rowmax, sumexp, targets, v_begin, ignore, scale, loss_scale))
MB_EMULATED_OP(ce_exps, (const Tensor& sumexp, const Tensor& logits, const Tensor& rowmax), (sumexp, logits, rowmax))
MB_EMULATED_OP(ce_backward_exps,
               (const Tensor& dlogits, const Tensor& exps, const Tensor& sumexp, const Tensor& targets, int64_t v_begin,
                int32_t ignore, float scale, const Tensor& loss_scale),
               (dlogits, exps, sumexp, targets, v_begin, ignore, scale, loss_scale))
MB_EMULATED_OP(ce_whole_rows,
               (const Tensor& losses, const Tensor& logits, const Tensor& targets, int32_t ignore, bool grad,
                float scale, const Tensor& loss_scale),
               (losses, logits, targets, ignore, grad, scale, loss_scale))
// reduce.h
MB_EMULATED_OP(sum, (const Tensor& out, const Tensor& x, bool accumulate = false), (out, x, accumulate))
MB_EMULATED_OP(weighted_accumulate, (const Tensor& out, const Tensor& x, const std::vector<double>& weights),
               (out, x, weights))
MB_EMULATED_OP(segment_sum_squares,
               (const Tensor& out, const Tensor& x, const std::vector<std::pair<size_t, size_t>>& segments),
               (out, x, segments))
MB_EMULATED_OP(segment_sum_squares_of_growth,
               (const Tensor& out, const Tensor& x, const Tensor& prev,
                const std::vector<std::pair<size_t, size_t>>& segments),
               (out, x, prev, segments))
// gradients.h
MB_EMULATED_OP(unscale_and_check, (const Tensor& grads, const Tensor& found_inf, const Tensor& scaler),
               (grads, found_inf, scaler))
MB_EMULATED_OP(loss_scaler_update, (const Tensor& scaler, const Tensor& found_inf, const ops::LossScalerConfig& config),
               (scaler, found_inf, config))
MB_EMULATED_OP(split_sum_squares,
               (const Tensor& out, const Tensor& x, const std::vector<std::pair<size_t, size_t>>& sharded,
                const std::vector<std::pair<size_t, size_t>>& replicated),
               (out, x, sharded, replicated))
MB_EMULATED_OP(split_sum_squares_of_growth,
               (const Tensor& out, const Tensor& x, const Tensor& prev,
                const std::vector<std::pair<size_t, size_t>>& sharded,
                const std::vector<std::pair<size_t, size_t>>& replicated),
               (out, x, prev, sharded, replicated))
MB_EMULATED_OP(clip_coefficient, (const Tensor& norm, const Tensor& sums, double max_norm), (norm, sums, max_norm))
MB_EMULATED_OP(scale_by, (const Tensor& x, const Tensor& factor, size_t index), (x, factor, index))
// flash_attention.h
MB_EMULATED_OP(flash_attention_forward,
               (const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& key_mask,
                const AttentionShape& s, const DropoutKey* dropout, const Tensor& bias = {},
                const Tensor& documents = {}),
               (out, lse, qkv, key_mask, s, dropout, bias, documents))
MB_EMULATED_OP(flash_attention_backward,
               (const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                const Tensor& key_mask, const AttentionShape& s, const DropoutKey* dropout, Write w = Write::kAdd,
                const Tensor& bias = {}, const Tensor& dbias = {}, const Tensor& documents = {}),
               (dqkv, dout, qkv, out, lse, key_mask, s, dropout, w, bias, dbias, documents))
MB_EMULATED_OP(flash_cross_attention_forward,
               (const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& kv, const Tensor& key_mask,
                const CrossAttentionShape& s, const DropoutKey* dropout),
               (out, lse, q, kv, key_mask, s, dropout))
MB_EMULATED_OP(flash_cross_attention_backward,
               (const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& q, const Tensor& kv,
                const Tensor& out, const Tensor& lse, const Tensor& key_mask, const CrossAttentionShape& s,
                const DropoutKey* dropout, Write w = Write::kAdd),
               (dq, dkv, dout, q, kv, out, lse, key_mask, s, dropout, w))

// what the emulator cannot run: cuBLASLt's products (matmul.h, attention.h)
MB_NOT_EMULATED(gemm, "cuBLASLt",
                (const Tensor& C, const Tensor& A, Trans ta, const Tensor& B, Trans tb, float alpha = 1.0f,
                 float beta = 0.0f),
                (C, A, ta, B, tb, alpha, beta))
MB_NOT_EMULATED(linear_forward, "cuBLASLt",
                (const Tensor& out, const Tensor& in, const Tensor& weight, const Tensor& bias),
                (out, in, weight, bias))
MB_NOT_EMULATED(linear_backward, "cuBLASLt",
                (const Tensor& din, const Tensor& dweight, const Tensor& dbias, const Tensor& dout, const Tensor& in,
                 const Tensor& weight, Write din_write = Write::kAdd),
                (din, dweight, dbias, dout, in, weight, din_write))
MB_NOT_EMULATED(linear_gelu_forward, "cuBLASLt",
                (const Tensor& out, const Tensor& pre, const Tensor& in, const Tensor& weight, const Tensor& bias),
                (out, pre, in, weight, bias))
MB_NOT_EMULATED(linear_backward_gelu, "cuBLASLt",
                (const Tensor& dpre, const Tensor& dweight, const Tensor& dbias, const Tensor& dout, const Tensor& in,
                 const Tensor& weight, const Tensor& pre),
                (dpre, dweight, dbias, dout, in, weight, pre))
MB_NOT_EMULATED(bias_add, "cuBLASLt", (const Tensor& x, const Tensor& bias), (x, bias))
MB_NOT_EMULATED(bias_backward, "cuBLASLt", (const Tensor& dbias, const Tensor& dx), (dbias, dx))
MB_NOT_EMULATED(attention_forward, "cuBLASLt",
                (const Tensor& out, const Tensor& probs, const Tensor& qkv, const Tensor& key_mask,
                 const AttentionShape& s, const DropoutKey* dropout, const Tensor& bias = {},
                 const Tensor& documents = {}),
                (out, probs, qkv, key_mask, s, dropout, bias, documents))
MB_NOT_EMULATED(attention_backward, "cuBLASLt",
                (const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& probs, const Tensor& key_mask,
                 const AttentionShape& s, const DropoutKey* dropout, const Tensor& dbias = {}),
                (dqkv, dout, qkv, probs, key_mask, s, dropout, dbias))
MB_NOT_EMULATED(cross_attention_forward, "cuBLASLt",
                (const Tensor& out, const Tensor& probs, const Tensor& q, const Tensor& kv, const Tensor& key_mask,
                 const CrossAttentionShape& s, const DropoutKey* dropout),
                (out, probs, q, kv, key_mask, s, dropout))
MB_NOT_EMULATED(cross_attention_backward, "cuBLASLt",
                (const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& q, const Tensor& kv,
                 const Tensor& probs, const Tensor& key_mask, const CrossAttentionShape& s, const DropoutKey* dropout),
                (dq, dkv, dout, q, kv, probs, key_mask, s, dropout))
MB_EMULATED_OP(embedding_forward,
                (const Tensor& out, const Tensor& ids, const Tensor& table, int64_t row_begin, bool accumulate = false),
                (out, ids, table, row_begin, accumulate))
MB_EMULATED_OP(embedding_backward,
                (const Tensor& dtable, const Tensor& dout, const Tensor& ids, int64_t row_begin),
                (dtable, dout, ids, row_begin))

#undef MB_NOT_EMULATED
#undef MB_EMULATED_OP
#undef MB_UNPACK

}  // namespace emulated_ops
}  // namespace megabatch::testing
