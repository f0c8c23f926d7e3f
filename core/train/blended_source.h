// A batch source of several datasets' sources in a weighted blend (data/blend.h): global sample
// i is sample j of source k, as BlendOrder says.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "core/data/blend.h"
#include "core/train/batch_source.h"

namespace megabatch::train {

class BlendedSource final : public BatchSource {
 public:
  // One source per dataset, with its weight (> 0, any scale).
  BlendedSource(std::vector<std::unique_ptr<BatchSource>> sources, std::vector<double> weights);
  void fill(uint64_t first, int64_t count, Batch& out) override;
  // 0: a blend repeats no dataset's order as a whole, so it has no epoch of its own.
  uint64_t samples_per_epoch() const override { return 0; }

 private:
  std::vector<std::unique_ptr<BatchSource>> sources_;
  data::BlendOrder order_;
  std::vector<std::pair<size_t, uint64_t>> picked_;
  Batch one_;
};

// Appends `rows`' samples to `out` (the same model's batches: the fields `rows` has).
void append_samples(Batch& out, const Batch& rows);

}  // namespace megabatch::train
