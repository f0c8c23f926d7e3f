#include "models/lm_head.h"

#include <algorithm>

#include "core/ops/matmul.h"

namespace megabatch::models {

train::LossOutput TiedLmHead::run(const float* X, const int32_t* labels, int64_t n, int64_t C, const Weights& w,
                                  float grad_scale, float* dX) {
  train::LossOutput out;
  for (int64_t i = 0; i < n; ++i) out.count += labels[i] != train::kIgnoreLabel;
  const bool grads = grad_scale != 0.0f && dX != nullptr;
  losses_.resize({std::max<int64_t>(n, 1)});
  dloss_.resize({std::max<int64_t>(n, 1)});
  const float dl = out.count ? grad_scale / static_cast<float>(out.count) : 0.0f;
  for (int64_t r0 = 0; r0 < n; r0 += chunk_) {
    const int64_t R = std::min(chunk_, n - r0);
    logits_.resize({R, w.Vl});
    ops::gemm<float>(ops::Trans::N, ops::Trans::T, R, w.Vl, C, 1.0f, X + r0 * C, C, w.W, C, 0.0f, logits_.data(), w.Vl);
    if (w.bias)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t v = 0; v < w.Vl; ++v) logits_[static_cast<size_t>(r * w.Vl + v)] += w.bias[v];
    ce_.forward(losses_.data() + r0, logits_.data(), labels + r0, R, w.Vl, w.v0);
    if (!grads) continue;
    for (int64_t i = 0; i < R; ++i) dloss_[static_cast<size_t>(r0 + i)] = dl;
    dlogits_.resize({R, w.Vl});
    dlogits_.zero();
    ce_.backward(dlogits_.data(), logits_.data(), labels + r0, dloss_.data() + r0, R, w.Vl, w.v0);
    ops::gemm<float>(ops::Trans::N, ops::Trans::N, R, C, w.Vl, 1.0f, dlogits_.data(), w.Vl, w.W, C, 0.0f, dX + r0 * C, C);
    tp_->all_reduce(dX + r0 * C, static_cast<size_t>(R * C), comm::ReduceOp::kSum);
    ops::gemm<float>(ops::Trans::T, ops::Trans::N, w.Vl, C, R, 1.0f, dlogits_.data(), w.Vl, X + r0 * C, C, 1.0f, w.dW, C);
    if (w.dbias)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t v = 0; v < w.Vl; ++v) w.dbias[v] += dlogits_[static_cast<size_t>(r * w.Vl + v)];
  }
  for (int64_t i = 0; i < n; ++i) out.loss_sum += losses_[static_cast<size_t>(i)];
  return out;
}

}  // namespace megabatch::models
