// The run's device (--device, or the GPU of this rank's local rank where one is visible),
// said at start-up with what runs there, and the refusals that depend on it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/device/device.h"
#include "core/device/dtype.h"

namespace megabatch::train {

Device run_device(const nlohmann::json& values, DType dtype, int local_rank);

}  // namespace megabatch::train
