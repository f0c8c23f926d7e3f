// The options `train` accepts: Megatron-LM's names and meanings, plus megabatch's own;
// and what they mean for the training loop.
#pragma once

#include <cstdint>

#include "core/config/config.h"
#include "core/device/dtype.h"
#include "core/ops/loss_scaler.h"
#include "core/train/train_options.h"

namespace megabatch::train {
const config::Schema& train_schema();

// The dtype of --bf16 / --fp16 (f32 otherwise); both is an error.
DType run_dtype(const nlohmann::json& values);
// The fp16 loss scaler of Megatron's flags (refused on a run that is not --fp16).
ops::LossScalerConfig loss_scaler(const config::Resolved& r, DType dtype);
// The run's batch, iterations, learning-rate schedule, logging, evaluation, checkpoint,
// loss-scaling and divergence options; dp_size: the data-parallel ranks launched;
// padded_vocab: the model's, for the default divergence loss (2 ln V). Tokens per sample
// and FLOPs per iteration depend on the model: the caller fills them in.
TrainOptions train_options(const config::Resolved& r, DType dtype, int64_t dp_size, int64_t padded_vocab);
}  // namespace megabatch::train
