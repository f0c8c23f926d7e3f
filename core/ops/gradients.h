// The trainer's chores on the flat fp32 gradients between backward and the optimizer step,
// in Megatron's order (unscale and inf check, global norm, clip), all on the gradients'
// device so that no step waits for the host. Results land in small device tensors that
// the host reads when it logs.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "core/ops/loss_scaler.h"
#include "core/tensor/tensor.h"

namespace megabatch::ops {

// fp16: grads *= 1 / scaler[0] (the loss scale, a LossScalerState as f32 (3)) and
// found_inf[0] = 1 when any gradient is not finite (else 0); f32 (1).
void unscale_and_check(const Tensor& grads, const Tensor& found_inf, const Tensor& scaler);

// The loss scaler's update from found_inf (LossScalerState as f32 (3), in place).
void loss_scaler_update(const Tensor& scaler, const Tensor& found_inf, const ops::LossScalerConfig& config);

// out f64 (2) = (sum of x^2 over the `sharded` segments, over the `replicated` ones) of
// the flat f32 buffer x: the two parts of a global norm under tensor parallelism (the
// sharded part is then summed over the group).
void split_sum_squares(const Tensor& out, const Tensor& x, const std::vector<std::pair<size_t, size_t>>& sharded,
                       const std::vector<std::pair<size_t, size_t>>& replicated);

// As split_sum_squares, of x - prev, then prev = x within the segments, in one pass
// (segment_sum_squares_of_growth): a micro-batch's own gradient norm as the growth of the
// accumulated gradients x since prev was taken, without a copy of the difference.
void split_sum_squares_of_growth(const Tensor& out, const Tensor& x, const Tensor& prev,
                                 const std::vector<std::pair<size_t, size_t>>& sharded,
                                 const std::vector<std::pair<size_t, size_t>>& replicated);

// From out f64 (2) of split_sum_squares (already reduced over the group), norm f64 (3) =
// (global norm, clip coefficient, norm after clipping) with Megatron's coefficient
// max_norm / (norm + 1e-6) when it is below 1 (max_norm 0: no clipping, coefficient 1).
void clip_coefficient(const Tensor& norm, const Tensor& sums, double max_norm);

// x *= factor[index] (factor f64 on the device: the clip coefficient).
void scale_by(const Tensor& x, const Tensor& factor, size_t index);

}  // namespace megabatch::ops
