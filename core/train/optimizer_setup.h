// Making the run's optimizer: the plugin's hyperparameters from Megatron's flags and
// --optimizer-params, the distributed optimizer's shards, and --list-optimizers.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/comm/communicator.h"
#include "core/config/config.h"
#include "core/nn/parameters.h"
#include "core/optim/dp_shards.h"
#include "core/optim/optimizer.h"

namespace megabatch::train {

// --list-optimizers: every plugin on the search path with its hyperparameters; a plugin
// that does not load is listed as broken, with why, and the others are still listed.
void list_optimizers(const std::vector<std::filesystem::path>& search, std::ostream& out);

// The optimizer's hyperparameters as given: Megatron's flags that name one (--weight-decay,
// --adam-beta1, ...; refused when the plugin has no such hyperparameter), then
// --optimizer-params, which wins. With a weight-decay schedule, refused for a plugin that
// cannot take one and beside optimizer_params.weight_decay (which it would override); with
// --decoupled-lr, refused for a plugin that cannot take it.
nlohmann::json optimizer_params(const config::Resolved& r, const optim::Plugin& plugin);

// The distributed optimizer (--use-distributed-optimizer): this rank's shards of the
// gradient buckets, said on `console`; null with one data-parallel rank (nothing to shard:
// the optimizer steps everything, as without it).
std::unique_ptr<optim::DpShards> make_dp_shards(nn::ParameterStore& params, comm::Communicator& dp, int64_t bucket_size,
                                                bool overlap_grad_reduce, std::ostream& console);

}  // namespace megabatch::train
