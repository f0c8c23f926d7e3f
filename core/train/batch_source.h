// Where the training loop's micro-batches come from (a model family's sample builder).
#pragma once

#include <cstdint>
#include <string>

#include "core/train/model.h"

namespace megabatch::train {

// Fills a micro-batch with samples [first, first + count) of a deterministic sample order.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual void fill(uint64_t first, int64_t count, Batch& out) = 0;
  // Distinct samples before the order repeats (0: unknown). An evaluation by eval_samples
  // covers at most this many, each once.
  virtual uint64_t samples_per_epoch() const { return 0; }
  // Where one epoch of samples takes under half of the documents' text, a warning that says how
  // much, and why; "" otherwise.
  virtual std::string unused_text_warning() const { return ""; }
};

}  // namespace megabatch::train
