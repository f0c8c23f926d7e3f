#include "core/data/unicode.h"

#include <algorithm>
#include <array>
#include <cstdint>

namespace megabatch::unicode {
namespace {

struct CodeRange {
  uint32_t lo, hi;
};
struct CodeMap3 {
  uint32_t cp;
  uint8_t n;
  uint32_t to[3];
};
struct CodeMap4 {
  uint32_t cp;
  uint8_t n;
  uint32_t to[4];
};

#include "core/data/unicode_tables.inc"
#include "core/data/bert_unicode_assigned.inc"

template <size_t N>
bool in_ranges(const CodeRange (&table)[N], char32_t c) {
  const auto* end = table + N;
  const auto* it = std::upper_bound(table, end, static_cast<uint32_t>(c),
                                    [](uint32_t v, const CodeRange& r) { return v < r.lo; });
  return it != table && c <= (it - 1)->hi;
}

// ASCII classes, precomputed: bit 0 letter, 1 number, 2 js space, 3 punct, 4 zs, 5 control.
constexpr std::array<uint8_t, 128> make_ascii() {
  std::array<uint8_t, 128> t{};
  for (int c = 0; c < 128; ++c) {
    uint8_t f = 0;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) f |= 1;
    if (c >= '0' && c <= '9') f |= 2;
    if (c == ' ' || (c >= 9 && c <= 13)) f |= 4;
    const bool p = (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
                   (c >= 123 && c <= 126);
    // Unicode category P* among ASCII excludes $ + < = > ^ ` | ~ (symbols, category S).
    const bool sym = c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
                     c == '`' || c == '|' || c == '~';
    if (p && !sym) f |= 8;
    if (c == ' ') f |= 16;
    if (c < 32 || c == 127) f |= 32;
    t[c] = f;
  }
  return t;
}
constexpr auto kAscii = make_ascii();

}  // namespace

char32_t decode_utf8(std::string_view s, size_t i, size_t& len) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  len = 1;
  if (b0 < 0x80) return b0;
  int n;
  char32_t c, min;
  if ((b0 & 0xE0) == 0xC0) { n = 1; c = b0 & 0x1F; min = 0x80; }
  else if ((b0 & 0xF0) == 0xE0) { n = 2; c = b0 & 0x0F; min = 0x800; }
  else if ((b0 & 0xF8) == 0xF0) { n = 3; c = b0 & 0x07; min = 0x10000; }
  else return kInvalid;
  if (i + static_cast<size_t>(n) >= s.size()) return kInvalid;  // truncated
  for (int k = 1; k <= n; ++k) {
    const auto b = static_cast<uint8_t>(s[i + static_cast<size_t>(k)]);
    if ((b & 0xC0) != 0x80) return kInvalid;
    c = (c << 6) | (b & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return kInvalid;
  len = static_cast<size_t>(n) + 1;
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool is_letter(char32_t c) { return c < 128 ? (kAscii[c] & 1) != 0 : c != kInvalid && in_ranges(kLetter, c); }
bool is_number(char32_t c) { return c < 128 ? (kAscii[c] & 2) != 0 : c != kInvalid && in_ranges(kNumber, c); }
bool is_js_space(char32_t c) { return c < 128 ? (kAscii[c] & 4) != 0 : c != kInvalid && in_ranges(kJsSpace, c); }
bool is_punct(char32_t c) { return c < 128 ? (kAscii[c] & 8) != 0 : c != kInvalid && in_ranges(kPunct, c); }
bool is_space_sep(char32_t c) { return c < 128 ? (kAscii[c] & 16) != 0 : c != kInvalid && in_ranges(kSpaceSep, c); }
bool is_control(char32_t c) { return c < 128 ? (kAscii[c] & 32) != 0 : c != kInvalid && in_ranges(kControl, c); }
bool is_nonspacing_mark(char32_t c) { return c >= 0x300 && c != kInvalid && in_ranges(kMark, c); }

namespace {
template <typename Map, size_t N>
const Map* find_map(const Map (&table)[N], char32_t c) {
  const auto* end = table + N;
  const auto* it = std::lower_bound(table, end, static_cast<uint32_t>(c),
                                    [](const Map& m, uint32_t v) { return m.cp < v; });
  return (it != end && it->cp == c) ? it : nullptr;
}
}  // namespace

int to_lower(char32_t c, char32_t out[3]) {
  if (c < 128) {
    out[0] = (c >= 'A' && c <= 'Z') ? c + 32 : c;
    return 1;
  }
  if (const auto* m = find_map(kLower, c)) {
    for (int k = 0; k < m->n; ++k) out[k] = m->to[k];
    return m->n;
  }
  out[0] = c;
  return 1;
}

int strip_accents(char32_t c, char32_t out[4]) {
  if (c < 0xC0) {
    out[0] = c;
    return 1;
  }
  if (c >= 0xAC00 && c <= 0xD7A3) {  // Hangul syllable: L V (T), Unicode 3.12
    const char32_t s = c - 0xAC00;
    out[0] = 0x1100 + s / (21 * 28);
    out[1] = 0x1161 + (s % (21 * 28)) / 28;
    if (s % 28 == 0) return 2;
    out[2] = 0x11A7 + s % 28;
    return 3;
  }
  if (const auto* m = find_map(kStrip, c)) {
    for (int k = 0; k < m->n; ++k) out[k] = m->to[k];
    return m->n;
  }
  if (is_nonspacing_mark(c)) return 0;
  out[0] = c;
  return 1;
}

const char* table_version() { return kUnicodeVersion; }
bool assigned_in_bert_reference(char32_t c) { return c < 128 || (c != kInvalid && in_ranges(kBertAssigned, c)); }
const char* bert_reference_version() { return kBertUnicodeVersion; }

}  // namespace megabatch::unicode
