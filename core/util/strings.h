// Small string helpers: joining lists, quoting for the shell, suggesting the nearest valid name.
#pragma once

#include <cstdint>

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace megabatch {

// printf's formatting into a string (at most 255 characters: log lines' fields).
template <typename... Args>
std::string printf_string(const char* fmt, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

// 1536 -> "1.5 KiB", 100 -> "100 B" (binary units, one decimal past bytes).
inline std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f %s", u ? 1 : 0, b, units[u]);
  return buf;
}

inline std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

// Numbers (iterations, say) as "1, 2, 3".
inline std::string join(const std::vector<int64_t>& items, std::string_view sep) {
  std::vector<std::string> text;
  for (const int64_t x : items) text.push_back(std::to_string(x));
  return join(text, sep);
}

// `s` as one word for /bin/sh: in single quotes, a ' inside written as '\''.
inline std::string shell_quote(std::string_view s) {
  std::string q(1, '\'');
  for (const char c : s) {
    if (c == '\'') q.append("'\\''");
    else q.push_back(c);
  }
  q.push_back('\'');
  return q;
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

// The byte offset of the first byte of `s` that is not well-formed UTF-8 (overlong forms,
// surrogates and values above U+10FFFF included), or npos when all of it is.
inline size_t invalid_utf8_at(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t c = 0, min = 0;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      n = 1, c = b & 0x1F, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      n = 2, c = b & 0x0F, min = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      n = 3, c = b & 0x07, min = 0x10000;
    } else {
      return i;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return i;
      const auto t = static_cast<unsigned char>(s[i + k]);
      if ((t & 0xC0) != 0x80) return i;
      c = (c << 6) | (t & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return i;
    i += n + 1;
  }
  return std::string_view::npos;
}

}  // namespace megabatch
