// Cross entropy fused with log-softmax, split into the pieces a vocabulary-parallel
// version needs (nn::VocabParallelCrossEntropy all-reduces between them). Logits (n, V)
// hold vocabulary columns [v_begin, v_begin + V) of the full vocabulary. Rows whose
// target equals `ignore` contribute no loss and no gradient.
//
//   loss_i = log(sum_j exp(l_ij - m_i)) + m_i - l_i,target
#pragma once

#include <cstdint>

namespace megabatch::ops {

// rowmax(n) = max over local columns
template <typename T>
void ce_row_max(T* rowmax, const T* logits, int64_t n, int64_t V);

// sumexp(n) = sum_j exp(l_ij - rowmax_i) over local columns (rowmax is the global max)
template <typename T>
void ce_sum_exp(T* sumexp, const T* logits, const T* rowmax, int64_t n, int64_t V);

// target_logit(n) = l_i,target when the target is a local column, else 0
template <typename T>
void ce_target_logit(T* target_logit, const T* logits, const int32_t* targets, int64_t n, int64_t V,
                     int64_t v_begin);

// losses(n) from the global pieces; ignored rows get 0.
template <typename T>
void ce_loss(T* losses, const T* rowmax, const T* sumexp, const T* target_logit, const int32_t* targets, int64_t n,
             int32_t ignore);

// dlogits += dloss_i * (softmax_ij - [j == target_i]); ignored rows untouched.
template <typename T>
void ce_backward(T* dlogits, const T* logits, const T* rowmax, const T* sumexp, const int32_t* targets,
                 const T* dloss, int64_t n, int64_t V, int64_t v_begin, int32_t ignore);

// Single-shard convenience: losses(n) for full-vocabulary logits.
template <typename T>
void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int64_t n, int64_t V, int32_t ignore);

// Single-shard convenience: dlogits += dloss_i * (softmax - onehot).
template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, const T* dloss, int64_t n,
                            int64_t V, int32_t ignore);

}  // namespace megabatch::ops
