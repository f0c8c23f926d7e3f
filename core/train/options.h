// The options `train` accepts: Megatron-LM's names and meanings, plus megabatch's own.
#pragma once

#include "core/config/config.h"

namespace megabatch::train {
const config::Schema& train_schema();
}
