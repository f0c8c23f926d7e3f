// Megatron's --check-weight-hash-across-dp-replicas-interval: the data-parallel replicas step
// the same averaged gradients, so they hold the same weights, bit for bit. A plugin that draws
// noise from a generator of its own, or a gradient that misses the reduction, makes them drift
// apart without a sign in the loss; this check says so.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <vector>

#include "core/comm/communicator.h"
#include "core/nn/parameters.h"

namespace megabatch::train {

// A 64-bit hash (FNV-1a) of each parameter's values as this rank stores them (halves widened
// exactly, so equal hashes are equal weights but for a collision).
std::vector<uint64_t> parameter_hashes(const nn::ParameterStore& params);

// Every rank of `dp` hashes its parameters and the group gathers the hashes; all ranks then
// agree: "> weights: the N data-parallel replicas hold the same weights at iteration I" on
// `console`, or the same Error on every rank naming the first parameter that differs, which
// ranks hold which, and how many parameters differ. A group of one compares nothing and says
// nothing.
void check_replicas_agree(const nn::ParameterStore& params, comm::Communicator& dp, int64_t iteration,
                          std::ostream& console);

}  // namespace megabatch::train
