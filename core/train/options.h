// What train's options (train_schema.h) mean for a run: its dtype, loss scaler, schedules and
// the training loop's options, with Megatron's refusals of contradictory ones.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/config/config.h"
#include "core/device/dtype.h"
#include "core/ops/loss_scaler.h"
#include "core/train/train_options.h"
#include "core/train/train_schema.h"

namespace megabatch::train {
// The dtype of --bf16 / --fp16 (f32 otherwise); both is an error.
DType run_dtype(const nlohmann::json& values);
// The fp16 loss scaler of Megatron's flags (refused on a run that is not --fp16).
ops::LossScalerConfig loss_scaler(const config::Resolved& r, DType dtype);
// What in a run's learning-rate options would be ignored, or contradicts another, as
// Megatron's validate_args refuses it: a warmup or decay counted in samples in a run counted
// in iterations (or the other way round), a warmup fraction beside a warmup count, a min_lr
// above lr, a reference batch without a scaling rule. "" when nothing is; else what is wrong
// and what to give instead. `values` are the run's options (defaults filled in or not);
// `name` spells a key as its user wrote it (train: the flag; a sweep file: the key);
// `length_from` says where train_iters or train_samples came from when the user did not write it.
std::string schedule_conflict(const nlohmann::json& values, const std::function<std::string(const std::string&)>& name,
                              const std::string& length_from = "");
// The first of a run's schedule keys that counts `unit` ("samples" or "iters"): a non-zero
// lr_warmup_<unit>, a lr_decay_<unit> or a lr_wsd_decay_<unit> (null: unset); "" where none
// does. What makes a sweep point of a sample budget count samples.
std::string schedule_key_counting(const nlohmann::json& values, const std::string& unit);
// The run's batch, iterations, learning-rate schedule, logging, evaluation, checkpoint,
// loss-scaling and divergence options; dp_size: the data-parallel ranks launched;
// padded_vocab: the model's, for the default divergence loss (2 ln V). Tokens per sample
// and FLOPs per iteration depend on the model: the caller fills them in.
TrainOptions train_options(const config::Resolved& r, DType dtype, int64_t dp_size, int64_t padded_vocab);
}  // namespace megabatch::train
