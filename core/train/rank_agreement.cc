#include "core/train/rank_agreement.h"

#include <iostream>
#include <string>

#include "core/comm/mpi_communicator.h"
#include "core/util/error.h"

namespace megabatch::train {

namespace {
// The first option whose value differs between two resolved configurations, as text.
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b) {
  for (const auto& [k, x] : a.items())
    if (!b.contains(k) || b[k] != x) return k + " is " + (b.contains(k) ? b[k].dump() : "unset") + " here, " + x.dump() + " on rank 0";
  for (const auto& [k, x] : b.items())
    if (!a.contains(k)) return k + " is " + x.dump() + " here, unset on rank 0";
  return "(no single option)";
}

}  // namespace

void check_ranks_agree(const comm::ParallelState& parallel, const nlohmann::json& resolved) {
  if (parallel.world_size <= 1) return;
  auto& world = static_cast<comm::MpiCommunicator&>(*parallel.world);
  const std::string mine = resolved.dump(), first = world.broadcast_string(mine, 0);
  double differs = mine == first ? 0.0 : 1.0;
  if (differs != 0.0)  // said before any rank stops the job, so the message is not lost in the abort
    std::cerr << "train (rank " << parallel.world_rank << "): error: rank " << parallel.world_rank
              << " was started with a configuration that differs from rank 0's: "
              << first_difference(nlohmann::json::parse(first), resolved) << "; start every rank with the same options"
              << std::endl;
  world.all_reduce(&differs, 1, comm::ReduceOp::kMax);
  check(differs == 0.0, mine == first ? "another rank was started with a different configuration (see its error)"
                                          : "this rank's configuration differs from rank 0's (see above)");
}

}  // namespace megabatch::train
