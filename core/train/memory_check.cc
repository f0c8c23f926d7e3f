#include "core/train/memory_check.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>

#include "core/device/runtime.h"
#include "core/util/error.h"
#include "core/util/numbers.h"
#include "core/util/strings.h"

namespace megabatch::train {

void check_memory(const ModelMemory& m, DType dtype, Device device, int64_t micro_batch, int64_t shards,
                  bool noise_scale, bool skip, bool logger) {
  const bool flash = m.flash_attention;
  const double p = static_cast<double>(m.parameters_per_rank), d = static_cast<double>(std::max<int64_t>(shards, 1));
  const bool fp32 = dtype == DType::kF32;
  const double params = p * static_cast<double>(dtype_size(dtype)), grads = 4 * p + (d > 1 ? 4 * p / d : 0.0),
               masters = fp32 ? 0.0 : 4 * p / d, state = 8 * p / d,
               acts = (m.activation_bytes - (flash ? m.attention_score_bytes : 0.0)) *
                      static_cast<double>(micro_batch) * (fp32 ? 2.0 : 1.0);
  const double noise = noise_scale ? 4 * p : 0.0;  // --log-noise-scale: the gradients before a micro-batch
  const double logits = std::min(m.head_logits_per_sample * static_cast<double>(micro_batch), m.head_logits_most);
  const double need = params + grads + masters + state + noise + acts + logits;
  const std::string sharded = d > 1 ? " (this rank's 1/" + std::to_string(shards) + ")" : std::string();
  double ranks_here = 1;  // ranks of this job on this host share its memory
  if (const char* l = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); l && device.is_cpu()) ranks_here = std::max(1.0, parse_finite(l).value_or(1.0));
  const auto avail = runtime::available_memory(device);
  const double have = static_cast<double>(avail.bytes) / ranks_here;
  const std::string parts = "parameters " + human_bytes(params) + ", gradients " + human_bytes(grads) +
                            (masters > 0 ? ", master weights " + human_bytes(masters) + sharded : std::string()) +
                            ", optimizer state " + human_bytes(state) + sharded +
                            (noise > 0 ? ", noise-scale buffer " + human_bytes(noise) : std::string()) +
                            ", activations " + human_bytes(acts) + " for micro batch " + std::to_string(micro_batch) +
                            (logits > 0 ? ", LM-head logits " + human_bytes(logits) : std::string()) +
                            (flash ? ", flash attention" : "");
  if (logger)
    std::cout << "> memory: about " << human_bytes(need) << " per rank on " << device.str() << " (" << parts << "); "
              << human_bytes(have) << " available" << (ranks_here > 1 ? " per rank" : "") << std::endl;
  if (need > have && !skip)
    fail("this run needs about ", human_bytes(need), " on ", device.str(), " (", parts, ") but ", human_bytes(have),
             " is available (", avail.source, ranks_here > 1 ? ", shared by this host's ranks" : "",
             "); use a smaller model or micro batch, more tensor parallelism, ", dtype == DType::kF32 ? "--bf16, " : "",
             "or --skip-memory-check if the estimate is wrong for your optimizer");
}

}  // namespace megabatch::train
