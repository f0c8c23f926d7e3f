// Small string helpers for messages: joining lists and suggesting the nearest valid name.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace megabatch {

inline std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

// Levenshtein distance (insertions, deletions, substitutions), treating '-' and '_' alike.
inline size_t edit_distance(std::string_view a, std::string_view b) {
  auto norm = [](char c) { return c == '-' ? '_' : c; };
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (norm(a[i - 1]) == norm(b[j - 1]) ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The candidate nearest to `name`, or "" when none is within a third of its length (+2).
inline std::string nearest(std::string_view name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = name.size() / 3 + 2;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(name, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

// "; did you mean 'x'?" or "".
inline std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates,
                                std::string_view prefix = "") {
  const std::string n = nearest(name, candidates);
  return n.empty() ? std::string() : "; did you mean '" + std::string(prefix) + n + "'?";
}

}  // namespace megabatch
