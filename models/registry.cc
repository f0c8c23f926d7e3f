#include "models/registry.h"

#include "core/util/error.h"
#include "models/gpt.h"

namespace megabatch::models {

std::unique_ptr<train::Model> make_model(const ModelConfig& config, comm::Communicator& tp, uint64_t seed) {
  std::unique_ptr<train::Model> m;
  if (config.family == "gpt")
    m = std::make_unique<Gpt>(config, tp);
  else
    fail("model family '", config.family, "' is not available (gpt)");
  m->parameters().finalize();
  m->parameters().initialize(seed);
  return m;
}

void GptBatchSource::fill(uint64_t first, int64_t count, train::Batch& out) {
  out.batch = count;
  out.seq = seq_;
  out.tokens.resize(count * seq_);
  out.labels.resize(count * seq_);
  out.padding_mask.clear();
  window_.resize(seq_ + 1);
  for (int64_t b = 0; b < count; ++b) {
    samples_.get(first + static_cast<uint64_t>(b), window_.data());
    std::copy(window_.begin(), window_.end() - 1, out.tokens.begin() + b * seq_);
    std::copy(window_.begin() + 1, window_.end(), out.labels.begin() + b * seq_);
  }
}

}  // namespace megabatch::models
