// Every rank of a job must run the same configuration: each compares its resolved
// configuration with rank 0's, and all stop together when one differs (the one that differs
// says how, naming the first option that does).
#pragma once

#include <nlohmann/json.hpp>

#include "core/comm/mpi_communicator.h"

namespace megabatch::train {

void check_ranks_agree(const comm::ParallelState& parallel, const nlohmann::json& resolved);

}  // namespace megabatch::train
