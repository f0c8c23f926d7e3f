// Weighted blends of datasets, as Megatron's --data-path takes them: "W1 PREFIX1 W2 PREFIX2 ..."
// (weights in any scale, normalized), or several prefixes without weights (each dataset then
// weighs as many samples as it has, as one corpus of them all would).
//
// BlendOrder is which dataset global sample i comes from, and its index there, by Megatron's
// rule (BlendedDataset's build_blending_indices): sample i goes to the dataset furthest behind
// its share, weight_k * max(i, 1) - (samples given to k so far), the lowest index on a tie.
// So every prefix of the order holds each dataset's share to within two samples, and the order
// depends on the weights alone: resume and evaluation find the same samples again. It is
// computed exactly, in integers (each weight rounded to 2^-32 of the largest): Megatron's
// doubles break ties by rounding, and a compiler that fuses a multiply and a subtract (FMA)
// breaks them another way, so a run resumed by another build would read other samples.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace megabatch::data {

struct BlendPart {
  std::string prefix;
  double weight = 0;  // as given; 0 when data_path gives none
};

// data_path's values (or train_data_path's and the like, `key`) as dataset prefixes and
// weights: one prefix; pairs of a weight (finite, > 0) and a prefix; or prefixes without
// weights. Errors name `key`, the item and what to give instead.
std::vector<BlendPart> parse_data_path(const std::vector<std::string>& values, const std::string& key = "data_path");

class BlendOrder {
 public:
  // Weights > 0, of any scale (only their ratios count).
  explicit BlendOrder(const std::vector<double>& weights);

  // (dataset, its sample index) of global samples [first, first + count), into `out`.
  void range(uint64_t first, int64_t count, std::vector<std::pair<size_t, uint64_t>>& out);

  size_t size() const { return parts_.size(); }  // datasets

 private:
  // The dataset sample `i` goes to, given the samples each dataset has had before it.
  size_t pick(uint64_t i, const uint64_t* given) const;

  static constexpr uint64_t kStride = 1024;  // samples between saved counts
  std::vector<uint64_t> parts_;              // the weights in integers: the largest is 2^32
  uint64_t total_ = 0;                       // their sum
  std::vector<uint64_t> saved_;              // the counts before sample s * kStride, K per s
};

}  // namespace megabatch::data
