#include "core/data/sentence_splitter.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace megabatch::data {

namespace {

constexpr std::array<std::string_view, 48> kAbbreviations = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "rev", "gen", "col", "capt", "lt", "sgt", "gov",
    "sen", "rep", "pres", "vs", "etc", "e.g", "i.e", "cf", "no", "inc", "co", "corp", "ltd", "jan", "feb", "mar",
    "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "u.s", "u.n", "a.m", "p.m", "fig", "vol", "ave"};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string tidy(std::string_view s, bool keep_newlines) {
  size_t a = 0, b = s.size();
  while (a < b && is_space(s[a])) ++a;
  while (b > a && is_space(s[b - 1])) --b;
  std::string out;
  out.reserve(b - a);
  for (size_t i = a; i < b;) {
    if (!keep_newlines && is_space(s[i])) {
      size_t j = i;
      bool newline = false;
      while (j < b && is_space(s[j])) newline |= s[j++] == '\n';
      if (newline) {
        out.push_back(' ');
        i = j;
        continue;
      }
    }
    out.push_back(s[i++]);
  }
  return out;
}

// Is the word ending just before `period` (exclusive) an abbreviation or an initial?
bool abbreviation_before(std::string_view text, size_t period) {
  size_t start = period;
  while (start > 0 && !is_space(text[start - 1]) && text[start - 1] != '(' && text[start - 1] != '"') --start;
  std::string word(text.substr(start, period - start));
  std::transform(word.begin(), word.end(), word.begin(), [](unsigned char c) { return std::tolower(c); });
  if (word.size() == 1 && std::isalpha(static_cast<unsigned char>(word[0]))) return true;
  return std::find(kAbbreviations.begin(), kAbbreviations.end(), word) != kAbbreviations.end();
}

}  // namespace

std::vector<std::string> split_sentences(std::string_view text, bool keep_newlines) {
  std::vector<std::string> out;
  auto emit = [&](size_t a, size_t b) {
    std::string s = tidy(text.substr(a, b - a), keep_newlines);
    if (!s.empty()) out.push_back(std::move(s));
  };
  size_t start = 0;
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    const char c = text[i];
    if (c == '\n') {  // blank line: paragraph break
      size_t j = i + 1;
      while (j < n && (text[j] == ' ' || text[j] == '\t' || text[j] == '\r')) ++j;
      if (j < n && text[j] == '\n') {
        emit(start, i);
        while (j < n && is_space(text[j])) ++j;
        start = j;
        i = j - 1;
        continue;
      }
    }
    if (c != '.' && c != '!' && c != '?') continue;
    size_t end = i + 1;
    while (end < n && (text[end] == '.' || text[end] == '!' || text[end] == '?')) ++end;
    while (end < n && (text[end] == '"' || text[end] == '\'' || text[end] == ')' || text[end] == ']')) ++end;
    if (end >= n || !is_space(text[end])) {
      i = end - 1;
      continue;
    }
    size_t next = end;
    while (next < n && is_space(text[next])) ++next;
    if (next >= n) break;
    const auto nc = static_cast<unsigned char>(text[next]);
    const bool starts = std::isupper(nc) || std::isdigit(nc) || nc == '"' || nc == '\'' || nc == '(' ||
                        nc == '[' || nc >= 0x80;
    if (starts && !(c == '.' && end == i + 1 && abbreviation_before(text, i))) {
      emit(start, end);
      start = next;
    }
    i = end - 1;
  }
  emit(start, n);
  return out;
}

}  // namespace megabatch::data
