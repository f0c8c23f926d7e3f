// Parsing JSON text that comes from outside (config files, flags, sweep files, corpus lines,
// vocabularies) so that every way it can be wrong becomes an error the caller words, naming
// its file or line. nlohmann reports malformed text as parse_error but a number beyond a
// double's range ("lr": 1e999) as out_of_range; a catch of parse_error alone let that one
// escape (preprocess aborted in a worker thread; train and sweep said "internal error" and
// named no file). Found by the coverage-guided fuzzers (cmake --workflow --preset fuzz).
#pragma once

#include <optional>
#include <utility>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/util/error.h"

namespace megabatch {

// The value, or nullopt with *why (when given) set to what is wrong and where, without
// nlohmann's "[json.exception...]" tag: "parse error at line 3, column 1: syntax error while
// parsing object - unexpected end of input; expected '}'", "number overflow parsing '1e999'".
template <class Json = nlohmann::json>
std::optional<Json> parse_json(std::string_view text, std::string* why = nullptr) {
  try {
    return Json::parse(text);
  } catch (const typename Json::exception& e) {
    if (why) {
      const std::string w = e.what();
      const size_t tag = w.find("] ");  // the first "] " closes the tag
      *why = w.rfind("[json.exception.", 0) == 0 && tag != std::string::npos ? w.substr(tag + 2) : w;
    }
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
