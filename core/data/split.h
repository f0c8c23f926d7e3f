// Megatron's --split: documents [0, N) cut into train, validation and test ranges by
// proportions ("969,30,1", "98/2/0"), with Megatron's rounding (get_train_valid_test_split_).
#pragma once

#include <array>
#include <cstddef>
#include <string>

namespace megabatch::data {

// The three ranges' ends (train [0, a), validation [a, b), test [b, c = docs)); `spec` gives
// 1 to 3 proportions >= 0 (missing ones are 0), errors naming --split.
std::array<size_t, 3> split_documents(const std::string& spec, size_t docs);

}  // namespace megabatch::data
