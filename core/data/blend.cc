#include "core/data/blend.h"

#include <algorithm>
#include <cmath>

#include "core/util/error.h"
#include "core/util/numbers.h"

namespace megabatch::data {

std::vector<BlendPart> parse_data_path(const std::vector<std::string>& values, const std::string& key) {
  check(!values.empty(), key, ": no dataset prefix given");
  auto weight = [](const std::string& v) { return parse_finite(v); };
  std::vector<BlendPart> parts;
  if (values.size() == 1) {
    check(!weight(values[0]), key, ": '", values[0],
          "' is a weight without a dataset prefix after it; give the prefix (PREFIX.bin, PREFIX.idx)");
    return {{values[0], 0}};
  }
  if (weight(values[0])) {  // W1 PREFIX1 W2 PREFIX2 ...
    check(values.size() % 2 == 0, key, ": ", values.size(),
          " items, but a weighted blend is pairs of a weight and a dataset prefix (0.3 PREFIX_A 0.7 PREFIX_B)");
    for (size_t i = 0; i < values.size(); i += 2) {
      const auto w = weight(values[i]);
      check(
          w.has_value(), key, ": item ", i + 1, " '", values[i],
          "' is not a weight; a weighted blend is pairs of a weight and a dataset prefix (0.3 PREFIX_A 0.7 PREFIX_B)");
      check(*w > 0, key, ": weight ", values[i], " of ", values[i + 1],
            " is not above 0; leave the dataset out instead");
      check(!weight(values[i + 1]), key, ": item ", i + 2, " '", values[i + 1],
            "' is a number where the dataset prefix of weight ", values[i], " belongs");
      parts.push_back({values[i + 1], *w});
    }
  } else {  // PREFIX1 PREFIX2 ...: weighed by their sizes
    for (size_t i = 0; i < values.size(); ++i) {
      check(!weight(values[i]), key, ": item ", i + 1, " '", values[i],
            "' is a number among dataset prefixes; give a weight before every prefix (0.3 PREFIX_A 0.7 PREFIX_B) "
            "or none");
      parts.push_back({values[i], 0});
    }
  }
  for (size_t i = 0; i < parts.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      check(parts[i].prefix != parts[j].prefix, key, ": ", parts[i].prefix,
            " is given twice; give it once, with the sum of its weights");
  return parts;
}

BlendOrder::BlendOrder(const std::vector<double>& weights) {
  check(!weights.empty(), "a blend of no datasets");
  for (double w : weights)
    check(std::isfinite(w) && w > 0, "a blend weight is ", w, "; weights are finite and above 0");
  const double largest = *std::max_element(weights.begin(), weights.end());
  for (double w : weights) {
    const auto part = static_cast<uint64_t>(std::llround(std::ldexp(w / largest, 32)));
    check(part > 0, "a blend weight of ", w, " is below 2^-32 of the largest, ", largest, "; leave its dataset out");
    parts_.push_back(part);
    total_ += part;
  }
  saved_.assign(parts_.size(), 0);  // nothing given before sample 0
}

namespace {
__extension__ typedef __int128 Wide;  // parts (< 2^33) times samples (< 2^64): no overflow
}  // namespace

size_t BlendOrder::pick(uint64_t i, const uint64_t* given) const {
  // behind_k = part_k / total * max(i, 1) - given_k, scaled by total
  const Wide at = std::max<uint64_t>(i, 1);
  auto behind = [&](size_t k) { return Wide(parts_[k]) * at - Wide(given[k]) * Wide(total_); };
  size_t best = 0;
  Wide most = behind(0);
  for (size_t k = 1; k < parts_.size(); ++k)
    if (const Wide b = behind(k); b > most) {
      most = b;
      best = k;
    }
  return best;
}

void BlendOrder::range(uint64_t first, int64_t count, std::vector<std::pair<size_t, uint64_t>>& out) {
  const size_t K = parts_.size();
  out.clear();
  // the counts saved at or before `first` (saving more, every kStride samples, as far as it)
  const uint64_t stride = first / kStride;
  std::vector<uint64_t> given(K);
  while (saved_.size() / K <= stride) {
    const uint64_t s = saved_.size() / K - 1;
    std::copy(saved_.end() - static_cast<std::ptrdiff_t>(K), saved_.end(), given.begin());
    for (uint64_t i = s * kStride; i < (s + 1) * kStride; ++i) ++given[pick(i, given.data())];
    saved_.insert(saved_.end(), given.begin(), given.end());
  }
  std::copy(saved_.begin() + static_cast<std::ptrdiff_t>(stride * K),
            saved_.begin() + static_cast<std::ptrdiff_t>((stride + 1) * K), given.begin());
  for (uint64_t i = stride * kStride; i < first; ++i) ++given[pick(i, given.data())];
  for (int64_t n = 0; n < count; ++n) {
    const size_t k = pick(first + static_cast<uint64_t>(n), given.data());
    out.emplace_back(k, given[k]++);
  }
}

}  // namespace megabatch::data
