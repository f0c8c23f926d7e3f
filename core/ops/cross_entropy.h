// Cross entropy fused with log-softmax, split into the pieces a vocabulary-parallel
// version needs (nn::VocabParallelCrossEntropy all-reduces between them). Logits (n, V)
// hold vocabulary columns [v_begin, v_begin + V) of the full vocabulary, in the activation
// dtype; the per-row pieces and losses are in its accumulator dtype (f32 for the half
// types). Rows whose target equals `ignore` contribute no loss and no gradient.
//
//   loss_i = log(sum_j exp(l_ij - m_i)) + m_i - l_i,target
#pragma once

#include <cstdint>

#include "core/tensor/tensor.h"

namespace megabatch::ops {

// rowmax(n) = max over the local columns
void ce_row_max(const Tensor& rowmax, const Tensor& logits);
// sumexp(n) = sum_j exp(l_ij - rowmax_i) over the local columns (rowmax is the global max)
void ce_sum_exp(const Tensor& sumexp, const Tensor& logits, const Tensor& rowmax);
// target(n) = l_i,target when the target is a local column, else 0. targets: i32 (n).
void ce_target_logit(const Tensor& target, const Tensor& logits, const Tensor& targets, int64_t v_begin);
// losses(n) from the global pieces; ignored rows get 0.
void ce_loss(const Tensor& losses, const Tensor& rowmax, const Tensor& sumexp, const Tensor& target,
             const Tensor& targets, int32_t ignore);
// dlogits += d (softmax - onehot) on every counted row, where d = scale * loss_scale[0]
// (loss_scale: a one-element f32 tensor on the device, the fp16 loss scale; undefined: 1).
void ce_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& rowmax, const Tensor& sumexp,
                 const Tensor& targets, int64_t v_begin, int32_t ignore, float scale, const Tensor& loss_scale);

// The same two steps keeping the exponentials, as Megatron's vocab-parallel cross entropy
// does: the backward pass then needs no second exp over the vocabulary and writes its
// gradient over them, so one (n, V) buffer serves logits, exps and dlogits.
// logits <- exp(l_ij - rowmax_i) in place; sumexp(n) = their sums over the local columns
// (rowmax is the global max; take ce_target_logit first, the logits are gone after this).
void ce_exps(const Tensor& sumexp, const Tensor& logits, const Tensor& rowmax);
// dlogits = d (exps / sumexp - onehot) on every counted row and 0 on ignored rows (d as in
// ce_backward; sumexp: the global sums); dlogits may be exps itself.
void ce_backward_exps(const Tensor& dlogits, const Tensor& exps, const Tensor& sumexp, const Tensor& targets,
                      int64_t v_begin, int32_t ignore, float scale, const Tensor& loss_scale);

// Rows that hold the whole vocabulary (no tensor parallelism: v_begin 0, nothing to reduce
// between the pieces): the five steps above for one row at a time, while it is in cache.
// losses(n) as ce_loss gives them; with `grad`, logits <- d (softmax - onehot) as
// ce_row_max, ce_target_logit, ce_exps and ce_backward_exps leave them (0 on ignored rows;
// d as in ce_backward), else the logits are only read. The arithmetic is theirs, element
// for element (for the half types, without rounding the exps to the half type between
// the steps); the memory traffic is a row read and written once, where the pieces pass
// over all n rows four times (a GEMM's 256 x 32,768 logits are 32 MiB, beyond any cache).
// On a GPU one kernel takes a row per block through the same steps (core/ops/cuda/cross_entropy.cu).
void ce_whole_rows(const Tensor& losses, const Tensor& logits, const Tensor& targets, int32_t ignore, bool grad,
                   float scale, const Tensor& loss_scale);

}  // namespace megabatch::ops
