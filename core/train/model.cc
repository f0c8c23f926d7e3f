#include "core/train/model.h"

namespace megabatch::train {

int64_t counted_tokens(const Batch& batch) {
  int64_t n = 0;
  for (int32_t y : batch.labels) n += y != kIgnoreLabel;
  return n;
}

std::vector<double> LossOutput::mean_weights() const {
  std::vector<double> w{count ? 1.0 / static_cast<double>(count) : 0.0};
  for (const auto& [name, n] : extra) w.push_back(n ? 1.0 / static_cast<double>(n) : 0.0);
  return w;
}

LossValues LossOutput::read() const {
  LossValues v;
  const std::vector<double> s = sums.defined() ? to_host_f64(sums) : std::vector<double>(1 + extra.size(), 0.0);
  v.loss_sum = s.at(0);
  v.count = count;
  for (size_t k = 0; k < extra.size(); ++k) v.extra.push_back({extra[k].first, s.at(k + 1), extra[k].second});
  return v;
}

}  // namespace megabatch::train
