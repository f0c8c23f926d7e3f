// The options `train` accepts (and a sweep file's base and axes): Megatron-LM's names and
// meanings, plus megabatch's own, each with its type, default, range and help.
#pragma once

#include "core/config/config.h"

namespace megabatch::train {
const config::Schema& train_schema();
}  // namespace megabatch::train
