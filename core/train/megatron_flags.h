// Megatron-LM's flags that train takes with nothing to do, or refuses with the reason, so a
// Megatron script runs as it is or is told in one message everything it must change.
#pragma once

#include <vector>

#include "core/config/config.h"

namespace megabatch::train {

// The flags of Megatron-LM's pretrain_gpt.py, pretrain_bert.py and pretrain_t5.py that are no
// option of train (config::ForeignFlag): kernel fusions, overlaps, recomputation and the like,
// which change how a step runs but not what it computes, taken with a note of why nothing is to
// be done; features megabatch does not have (architectures, fp8, pipeline parallelism, other
// loggers), refused with what to do instead.
const std::vector<config::ForeignFlag>& megatron_flags();

}  // namespace megabatch::train
