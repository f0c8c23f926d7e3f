// Before a checkpoint is written: do the weights hold only finite values? A step can overflow
// the weights while its own loss and gradient norm were finite (they were computed before the
// update), and a checkpoint of such weights is no point to rewind or resume to.
#pragma once

#include <string>

#include "core/comm/communicator.h"
#include "core/nn/parameters.h"

namespace megabatch::train {

// Every rank of `world` reads its own weights (the ones the forward pass uses) and the ranks
// agree: "" when every value on every rank is finite, else the same description on every rank,
// naming the first parameter (in the store's order) that holds a NaN or an infinity on any rank
// and how many of the parameters do. A collective: every rank calls it at the same point.
std::string nonfinite_weights(const nn::ParameterStore& params, comm::Communicator& world);

}  // namespace megabatch::train
