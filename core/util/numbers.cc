#include "core/util/numbers.h"

#include <charconv>
#include <cmath>
#include <system_error>
#include <type_traits>

#include "core/util/error.h"

namespace megabatch {
namespace {

// std::from_chars over the whole of `text` (a '+' sign first is skipped: from_chars takes
// only '-'); *why says what stopped it.
template <typename T, typename... Format>
std::optional<T> whole(std::string_view text, std::string* why, const char* what, Format... format) {
  auto say = [&](std::string s) {
    if (why) *why = std::move(s);
    return std::nullopt;
  };
  std::string_view t = text;
  if (t.size() > 1 && t[0] == '+' && t[1] != '-' && t[1] != '+') t.remove_prefix(1);
  if (t.empty()) return say("empty");
  T out{};
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), out, format...);
  if (ec == std::errc::invalid_argument) return say(std::string("not ") + what);
  if (ec == std::errc::result_out_of_range)
    return say(std::is_integral_v<T> ? "too large for a 64-bit integer" : "out of the range of a double");
  if (end != t.data() + t.size()) {
    const std::string_view rest(end, static_cast<size_t>(t.data() + t.size() - end));
    if constexpr (std::is_integral_v<T>)
      if (rest[0] == '.' || rest[0] == 'e' || rest[0] == 'E') return say("not a whole number");
    return say("trailing text '" + std::string(rest) + "'");
  }
  return out;
}

}  // namespace

std::string shortest(double x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

std::string_view trim(std::string_view text) {
  const size_t b = text.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  return text.substr(b, text.find_last_not_of(" \t") - b + 1);
}

std::optional<int64_t> parse_int(std::string_view text, std::string* why) {
  return whole<int64_t>(text, why, "an integer");
}

std::optional<double> parse_finite(std::string_view text, std::string* why) {
  const auto x = whole<double>(text, why, "a number", std::chars_format::general);
  if (x && !std::isfinite(*x)) {
    if (why) *why = "not finite";
    return std::nullopt;
  }
  return x;
}

int64_t to_int(std::string_view text, const std::string& where) {
  std::string why;
  const auto x = parse_int(text, &why);
  if (!x) fail(where, ": expected an integer, got '", text, "' (", why, ")");
  return *x;
}

double to_finite(std::string_view text, const std::string& where) {
  std::string why;
  const auto x = parse_finite(text, &why);
  if (!x) fail(where, ": expected a finite number, got '", text, "' (", why, ")");
  return *x;
}

}  // namespace megabatch
