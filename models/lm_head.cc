#include "models/lm_head.h"

#include <algorithm>

#include "core/comm/collectives.h"
#include "core/device/profile.h"
#include "core/ops/matmul.h"
#include "core/ops/reduce.h"

namespace megabatch::models {

int64_t head_chunk_limit(int64_t vocab, DType dtype, Device device) {
  if (device.is_cpu()) return 256;
  const int64_t row_bytes = std::max<int64_t>(vocab, 1) * static_cast<int64_t>(dtype_size(dtype));
  return std::max<int64_t>(kGpuLogitsBudget / row_bytes, 256);
}

int64_t head_chunk_rows(int64_t n, int64_t vocab, DType dtype, Device device) {
  const int64_t most = head_chunk_limit(vocab, dtype, device);
  if (device.is_cpu()) return most;  // fixed chunks, the last one shorter
  const int64_t chunks = std::max<int64_t>((n + most - 1) / most, 1);
  return std::max<int64_t>((n + chunks - 1) / chunks, 1);
}

void TiedLmHead::run(const Tensor& X, const Tensor& labels, double divisor, const Weights& w, float grad_scale,
                     const Tensor& loss_scale, const Tensor& dX, const Tensor& loss_sum) {
  const profile::Region mark(profile::Family::kLmHeadLoss);
  const int64_t n = X.dim(0), Vl = w.W.dim(0);
  const bool grads = grad_scale != 0.0f && dX.defined();
  losses_.resize({std::max<int64_t>(n, 1)}, DType::kF32, X.device());
  losses_.zero();
  const float dl = divisor > 0 ? grad_scale / static_cast<float>(divisor) : 0.0f;
  const int64_t chunk = chunk_ > 0 ? chunk_ : head_chunk_rows(n, Vl, X.dtype(), X.device());
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t R = std::min(chunk, n - r0);
    const Tensor x = X.rows(r0, r0 + R), y = labels.flat(static_cast<size_t>(r0), static_cast<size_t>(R));
    logits_.resize({R, Vl}, X.dtype(), X.device());
    ops::gemm(logits_, x, ops::Trans::N, w.W, ops::Trans::T);
    if (w.bias.defined()) ops::bias_add(logits_, w.bias);
    // logits -> dlogits in place (without grads: logits -> exps, or read only)
    ce_.forward_backward(losses_.flat(static_cast<size_t>(r0), static_cast<size_t>(R)), logits_, y, w.v0, grads, dl,
                         loss_scale);
    if (!grads) continue;
    const Tensor& dlogits = logits_;
    const Tensor dx = dX.rows(r0, r0 + R);
    ops::gemm(dx, dlogits, ops::Trans::N, w.W, ops::Trans::N);
    comm::all_reduce(*tp_, dx, comm::ReduceOp::kSum);
    ops::gemm(w.dW, dlogits, ops::Trans::T, x, ops::Trans::N, 1.0f, 1.0f);
    if (w.dbias.defined()) ops::bias_backward(w.dbias, dlogits);
  }
  ops::sum(loss_sum, losses_.flat(0, static_cast<size_t>(n)));
}

}  // namespace megabatch::models
