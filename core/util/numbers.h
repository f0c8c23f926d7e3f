// The one way text becomes a number in megabatch: flags, config values given as text, lists
// such as --split and --gpus. The whole text must be the number: no surrounding spaces, no
// trailing text ("1e-3x"), no "inf" or "nan" where a finite value is meant, nothing that
// overflows its type. A leading '+' is allowed; hexadecimal is not.
//
//   parse_int("42")        -> 42          parse_int("4.0")     -> refused: not an integer
//   parse_finite("1e-3")   -> 0.001       parse_finite("inf")  -> refused: not finite
//   parse_finite("0.5abc") -> refused: trailing text "abc"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace megabatch {

// The integer `text` is, or nullopt with *why (when given) set to what is wrong: "not an
// integer", "trailing text 'x'", "too large for a 64-bit integer".
std::optional<int64_t> parse_int(std::string_view text, std::string* why = nullptr);

// The finite number `text` is, or nullopt with *why set: "not a number", "trailing text 'x'",
// "not finite", "out of the range of a double".
std::optional<double> parse_finite(std::string_view text, std::string* why = nullptr);

// As above, but an Error "<where>: expected an integer, got '<text>' (<why>)" when refused.
int64_t to_int(std::string_view text, const std::string& where);
double to_finite(std::string_view text, const std::string& where);

// The shortest text that reads back as exactly x ("0.999999999", "1e-08", "2"), for messages
// that show a limit or a value: a stream's default six digits would print 0.999999999 as "1".
std::string shortest(double x);

// `text` without leading and trailing spaces and tabs (for list items such as "969, 30, 1").
std::string_view trim(std::string_view text);

}  // namespace megabatch
