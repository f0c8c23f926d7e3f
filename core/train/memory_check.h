// The memory a run will need on its device, estimated before anything is allocated:
// parameters (in the run's dtype), fp32 gradients, fp32 master weights (bf16/fp16), two fp32
// optimizer states (Adam, LAMB: the most the shipped plugins keep), activations for one
// micro-batch (Korthikanti et al.'s count, doubled in fp32) and one chunk of the LM head's
// logits. With the distributed optimizer
// over D ranks (`shards` D > 1) a rank keeps 1/D of the masters and of the state, and its
// 1/D of the reduced gradients beside the whole gradient buffer. More than is available
// stops the run at once, with the figures, instead of the kernel killing it later.
#pragma once

#include <cstdint>

#include "core/device/device.h"
#include "core/device/dtype.h"

namespace megabatch::train {

// What the model needs per rank (models::size_report), and whether its attention keeps no
// (T, T) probabilities (the flash kernels).
struct ModelMemory {
  int64_t parameters_per_rank = 0;
  double activation_bytes = 0;       // per sample, 16-bit
  double attention_score_bytes = 0;  // of those, the attention probabilities
  bool flash_attention = false;
  // the language-model head's logits: per sample, and the most one chunk holds
  double head_logits_per_sample = 0;
  double head_logits_most = 0;
};

// Says the estimate on the console (`logger`), and refuses a run that needs more than
// `device` has, unless `skip` (--skip-memory-check).
void check_memory(const ModelMemory& model, DType dtype, Device device, int64_t micro_batch, int64_t shards,
                  bool noise_scale, bool skip, bool logger);

}  // namespace megabatch::train
