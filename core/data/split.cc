#include "core/data/split.h"

#include <cmath>
#include <sstream>
#include <vector>

#include "core/util/error.h"
#include "core/util/numbers.h"
#include "core/util/strings.h"

namespace megabatch::data {

std::array<size_t, 3> split_documents(const std::string& spec, size_t docs) {
  std::vector<double> w;
  std::string s = spec;
  for (char& ch : s)
    if (ch == '/') ch = ',';
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    std::string why;
    const auto x = parse_finite(trim(part), &why);
    if (!x) fail("split: '", spec, "': '", part, "' is not a proportion (", why, "); give numbers like 969,30,1");
    w.push_back(*x);
  }
  check(!w.empty() && w.size() <= 3, "split: '", spec, "': give 1 to 3 proportions (train, validation, test)");
  while (w.size() < 3) w.push_back(0);
  double sum = 0;
  for (double x : w) {
    check(x >= 0, "split: '", spec, "': proportions must be >= 0");
    sum += x;
  }
  check(sum > 0, "split: '", spec, "': proportions sum to 0");
  // Megatron's get_train_valid_test_split_: cumulative rounded boundaries, shifted so the
  // last one is the document count.
  std::array<size_t, 4> idx{0, 0, 0, 0};
  long long acc = 0;
  for (int i = 0; i < 3; ++i) {
    acc += std::llround(w[i] / sum * static_cast<double>(docs));
    idx[i + 1] = static_cast<size_t>(acc);
  }
  const long long diff = static_cast<long long>(idx[3]) - static_cast<long long>(docs);
  for (int i = 1; i < 4; ++i) idx[i] = static_cast<size_t>(static_cast<long long>(idx[i]) - diff);
  return {idx[1], idx[2], idx[3]};
}

}  // namespace megabatch::data
