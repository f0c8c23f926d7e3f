#include "core/train/replica_check.h"

#include <cstring>
#include <ostream>
#include <string>

#include "core/util/error.h"

namespace megabatch::train {

std::vector<uint64_t> parameter_hashes(const nn::ParameterStore& params) {
  const std::vector<float> values = to_host_f32(params.params());  // one read of the flat buffer
  std::vector<uint64_t> hashes;
  hashes.reserve(params.count());
  for (const nn::ParamInfo& info : params.infos()) {
    uint64_t h = 14695981039346656037ull;  // FNV-1a over the values' bytes
    const auto* bytes = reinterpret_cast<const unsigned char*>(values.data() + info.offset);
    for (size_t i = 0; i < info.numel * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
    hashes.push_back(h);
  }
  return hashes;
}

void check_replicas_agree(const nn::ParameterStore& params, comm::Communicator& dp, int64_t iteration,
                          std::ostream& console) {
  if (dp.size() <= 1) return;
  const std::vector<uint64_t> mine = parameter_hashes(params);
  const size_t n = mine.size();
  std::vector<uint64_t> all(n * static_cast<size_t>(dp.size()));
  dp.all_gather_bytes(mine.data(), all.data(), n * sizeof(uint64_t));
  // the same verdict on every rank: each reads the whole table
  size_t differing = 0, first = n;
  int other = 0;
  for (size_t i = 0; i < n; ++i)
    for (int r = 1; r < dp.size(); ++r)
      if (all[static_cast<size_t>(r) * n + i] != all[i]) {
        if (first == n) first = i, other = r;
        ++differing;
        break;
      }
  check(differing == 0, "the ", dp.size(), " data-parallel replicas hold different weights at iteration ", iteration,
        " (--check-weight-hash-across-dp-replicas-interval): ",
        first < n ? params.info(static_cast<int>(first)).name : std::string(), " differs between data-parallel ranks 0 and ",
        other, differing > 1 ? " (and " + std::to_string(differing - 1) + " more of the " + std::to_string(n) +
                                   " parameters)"
                             : std::string(),
        ". Each replica steps the same averaged gradients, so something of a rank's own moved them apart: an "
        "optimizer plugin that draws noise from a generator of its own instead of the host's Philox streams, or "
        "sums with float atomics, whose order varies; or ranks that run different builds of megabatch or the plugin");
  console << "> weights: the " << dp.size() << " data-parallel replicas hold the same weights at iteration "
          << iteration << std::endl;
}

}  // namespace megabatch::train
