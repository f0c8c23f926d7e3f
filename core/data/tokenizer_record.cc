#include "core/data/tokenizer_record.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/json.h"

namespace megabatch::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRecordFormat = "megabatch tokenizer record 1";
constexpr const char* kRebuild = "; delete it, or rebuild the dataset with `preprocess`";

// FNV-1a, 64 bits, over each token's length (8 bytes, little end first) and text.
std::string fingerprint(const Tokenizer& t, int64_t n) {
  uint64_t h = 14695981039346656037ull;
  auto add = [&h](unsigned char c) {
    h ^= c;
    h *= 1099511628211ull;
  };
  for (int64_t id = 0; id < n; ++id) {
    const std::string text = t.token_text(static_cast<int32_t>(id));
    for (int i = 0; i < 8; ++i) add(static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i)));
    for (const char c : text) add(static_cast<unsigned char>(c));
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string("fnv1a64:") + hex;
}

std::string described(const TokenizerRecord& r) {
  return r.tokenizer_type + " with a vocabulary of " + std::to_string(r.vocab_size) + " tokens (" +
         (r.vocab_file.empty() ? std::string("the asset cache's") : "vocab_file " + r.vocab_file) + ", " +
         r.fingerprint + ")";
}

}  // namespace

fs::path tokenizer_record_path(const fs::path& prefix) { return fs::path(prefix.string() + ".tokenizer.json"); }

TokenizerRecord describe_tokenizer(const Tokenizer& tokenizer, const fs::path& vocab_file) {
  TokenizerRecord r;
  r.tokenizer_type = std::string(tokenizer.type());
  r.vocab_size = tokenizer.vocab_size() - tokenizer.special().num_sentinels;
  r.fingerprint = fingerprint(tokenizer, r.vocab_size);
  r.vocab_file = vocab_file.string();
  return r;
}

void write_tokenizer_record(const fs::path& prefix, const TokenizerRecord& r) {
  const nlohmann::json j{{"format", kRecordFormat},
                         {"tokenizer_type", r.tokenizer_type},
                         {"vocab_size", r.vocab_size},
                         {"vocab_fingerprint", r.fingerprint},
                         {"vocab_file", r.vocab_file}};
  write_file_atomic(tokenizer_record_path(prefix), j.dump(1) + "\n");
}

TokenizerRecord read_tokenizer_record(const fs::path& file) {
  const std::string where = file.string();
  const nlohmann::json j = parse_json_or_fail(read_file(file, "tokenizer record"), where, kRebuild);
  auto need = [&](const char* key, auto ok, const char* what) {
    if (!j.is_object() || !j.contains(key)) fail(where, ": no \"", key, "\"", kRebuild);
    if (!ok(j[key])) fail(where, ": \"", key, "\" must be ", what, kRebuild);
  };
  const auto is_string = [](const nlohmann::json& x) { return x.is_string(); };
  need(
      "format", [](const nlohmann::json& x) { return x == kRecordFormat; }, "\"megabatch tokenizer record 1\"");
  need(
      "tokenizer_type", [](const nlohmann::json& x) { return x.is_string() && !x.get<std::string>().empty(); },
      "a tokenizer type");
  need(
      "vocab_size",
      [](const nlohmann::json& x) {
        return x.is_number_integer() && x.get<int64_t>() > 0 && x.get<int64_t>() <= int64_t{1} << 31;
      },
      "a positive integer up to 2^31");
  need(
      "vocab_fingerprint",
      [](const nlohmann::json& x) {
        if (!x.is_string()) return false;
        const std::string f = x.get<std::string>();
        return f.size() == 24 && f.rfind("fnv1a64:", 0) == 0 &&
               f.find_first_not_of("0123456789abcdef", 8) == std::string::npos;
      },
      "\"fnv1a64:\" and 16 hex digits");
  need("vocab_file", is_string, "a string (empty: the asset cache's vocabulary)");
  return {j["tokenizer_type"].get<std::string>(), j["vocab_size"].get<int64_t>(),
          j["vocab_fingerprint"].get<std::string>(), j["vocab_file"].get<std::string>()};
}

void check_tokenizer_record(const fs::path& prefix, const Tokenizer& tokenizer) {
  const fs::path file = tokenizer_record_path(prefix);
  if (!fs::exists(file)) return;
  const TokenizerRecord made = read_tokenizer_record(file);
  if (made.tokenizer_type != tokenizer.type())
    fail(file.string(), ": the dataset ", prefix.string(), " was made by ", described(made),
         ", but this run's tokenizer is ", tokenizer.type(), "; set tokenizer_type (--tokenizer-type) to ",
         made.tokenizer_type, ", or use a dataset made with ", tokenizer.type());
  const TokenizerRecord mine = describe_tokenizer(tokenizer);
  if (made.vocab_size != mine.vocab_size || made.fingerprint != mine.fingerprint)
    fail(file.string(), ": the dataset ", prefix.string(), " was made by ", described(made), ", but this run's ",
         mine.tokenizer_type, " has a vocabulary of ", mine.vocab_size, " tokens (", mine.fingerprint,
         "); set vocab_file (--vocab-file) to the file the dataset was made with");
}

}  // namespace megabatch::data
