// Parsing JSON text that comes from outside (config files, flags, sweep files, corpus lines,
// vocabularies) so that every way it can be wrong becomes an error the caller words, naming
// its file or line. nlohmann reports malformed text as parse_error but a number beyond a
// double's range ("lr": 1e999) as out_of_range; a catch of parse_error alone let that one
// escape (preprocess aborted in a worker thread; train and sweep said "internal error" and
// named no file). Found by the coverage-guided fuzzers (cmake --workflow --preset fuzz).
#pragma once

#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/util/error.h"

namespace megabatch {

// What text from outside may hold beyond JSON's grammar. A key twice in one object is
// refused (nlohmann, like Python's json, would keep the last value and drop the first
// silently: a second "grid" in a sweep file dropped the first); a corpus line follows
// Megatron's json.loads instead and keeps the last. Nesting deeper than max_depth is
// refused: no file megabatch reads needs more than a few levels, and code that walks a
// value recursively would run out of stack on a deep one (train, sweep run and sweep status
// crashed on 100,000 nested arrays).
struct JsonRules {
  bool unique_keys = true;
  int max_depth = 64;
};

// nlohmann's message of a parse error without its "[json.exception.parse_error.101] " tag.
inline std::string json_error_text(const std::exception& e) {
  const std::string w = e.what();
  const size_t tag = w.find("] ");  // the first "] " closes the tag
  return w.rfind("[json.exception.", 0) == 0 && tag != std::string::npos ? w.substr(tag + 2) : w;
}

// What a key given twice in one object is told (JSON text from outside, and GPT-2's encoder.json).
inline std::string key_given_twice(const std::string& key) {
  return "the key " + nlohmann::json(key).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         " appears twice in one object; give each key once";
}

// The value, or nullopt with *why (when given) set to what is wrong and where, without
// nlohmann's "[json.exception...]" tag: "parse error at line 3, column 1: syntax error while
// parsing object - unexpected end of input; expected '}'", "number overflow parsing '1e999'",
// "the key \"grid\" appears twice in one object", "nested deeper than 64 levels".
template <class Json = nlohmann::json>
std::optional<Json> parse_json(std::string_view text, std::string* why = nullptr, JsonRules rules = {}) {
  struct Refused {
    std::string what;
  };
  std::vector<std::unordered_set<std::string>> keys;  // of each open object, innermost last
  int open = 0;                                       // open objects and arrays
  using Event = typename Json::parse_event_t;
  auto rule = [&](int /*depth*/, Event event, Json& parsed) -> bool {
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        if (++open > rules.max_depth)
          throw Refused{"nested deeper than " + std::to_string(rules.max_depth) + " levels"};
        if (event == Event::object_start && rules.unique_keys) keys.emplace_back();
        break;
      case Event::object_end:
      case Event::array_end:
        --open;
        if (event == Event::object_end && rules.unique_keys) keys.pop_back();
        break;
      case Event::key:
        if (rules.unique_keys && !keys.back().insert(parsed.template get<std::string>()).second)
          throw Refused{key_given_twice(parsed.template get<std::string>())};
        break;
      case Event::value:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text, rule);
  } catch (const Refused& r) {
    if (why) *why = r.what;
    return std::nullopt;
  } catch (const typename Json::exception& e) {
    if (why) *why = json_error_text(e);
    return std::nullopt;
  }
}

// The value of a whole file's text; refused text fails with "<where>: not valid JSON (<what
// is wrong>)<advice>", advice being what to do ("; re-run ./setup.sh").
template <class Json = nlohmann::json>
Json parse_json_or_fail(std::string_view text, const std::string& where, std::string_view advice = "") {
  std::string why;
  std::optional<Json> j = parse_json<Json>(text, &why);
  if (!j) fail(where, ": not valid JSON (", why, ")", advice);
  return std::move(*j);
}

}  // namespace megabatch
