#include "core/data/gpt2_tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <functional>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <queue>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/data/unicode.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/json.h"

namespace megabatch::data {

namespace {
constexpr uint64_t kEmptyKey = std::numeric_limits<uint64_t>::max();  // ids are < 2^31: never a key
inline uint64_t slot_of(uint64_t key, uint64_t mask) { return (key * 0x9E3779B97F4A7C15ull >> 20) & mask; }
}  // namespace


namespace gpt2_detail {
Class classify(std::string_view s, size_t i, size_t& len) {
  const auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) {
    len = 1;
    static constexpr auto table = [] {
      std::array<Class, 128> t{};
      for (int c = 0; c < 128; ++c) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) t[c] = kLetter;
        else if (c >= '0' && c <= '9') t[c] = kNumber;
        else if (c == ' ' || (c >= 9 && c <= 13)) t[c] = kSpace;
        else t[c] = kOther;
      }
      return t;
    }();
    return table[b];
  }
  const char32_t c = unicode::decode_utf8(s, i, len);
  if (c == unicode::kInvalid) return kOther;
  if (unicode::is_letter(c)) return kLetter;
  if (unicode::is_number(c)) return kNumber;
  if (unicode::is_js_space(c)) return kSpace;
  return kOther;
}
}  // namespace gpt2_detail

namespace {

// GPT-2's reversible map from bytes to printable code points: printable Latin-1 bytes map
// to themselves, the other 68 bytes to U+0100 onwards in byte order.
std::array<char32_t, 256> bytes_to_unicode() {
  std::array<char32_t, 256> map{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = direct[b] ? static_cast<char32_t>(b) : next++;
  return map;
}

}  // namespace

namespace {
// A token's text in GPT-2's printable alphabet -> its raw bytes; false if it is not one.
bool to_bytes(std::string_view tok, std::string& raw) {
  static const std::array<int16_t, 256 + 68> u2b = [] {  // code point -> byte (-1: none)
    std::array<int16_t, 256 + 68> m;
    m.fill(-1);
    const auto b2u = bytes_to_unicode();
    for (int b = 0; b < 256; ++b) m[b2u[b]] = static_cast<int16_t>(b);
    return m;
  }();
  raw.clear();
  for (size_t i = 0, len = 0; i < tok.size(); i += len) {
    const char32_t c = unicode::decode_utf8(tok, i, len);
    if (c >= u2b.size() || u2b[c] < 0) return false;
    raw.push_back(static_cast<char>(u2b[c]));
  }
  return true;
}

// encoder.json as nlohmann's parser reports it, event by event (its SAX interface): each
// entry of the top-level object in file order, no document built. The document (a node, a key
// and a value for each of the 50,257 entries, and parse_json's set of the keys seen) took
// most of the time every `train` spent starting (2026-12-01, a sanitized build: 0.3 s of a
// 2-iteration run's 1.8 s).
class VocabularyEvents final : public nlohmann::json_sax<nlohmann::json> {
 public:
  struct Entry {
    std::string token;
    int64_t id = -1;
    std::string not_an_id;  // the value, where it is not an integer id
  };
  std::vector<Entry> entries;
  bool object = false;  // the top-level value is an object
  std::string error;    // a parse error, as parse_json words it

  bool null() override { return scalar("null"); }
  bool boolean(bool v) override { return scalar(v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override {
    if (depth_ == 1 && !entries.empty()) entries.back().id = v;
    return true;
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (v > static_cast<number_unsigned_t>(std::numeric_limits<int32_t>::max())) return scalar(std::to_string(v));
    return number_integer(static_cast<number_integer_t>(v));
  }
  bool number_float(number_float_t, const string_t& text) override { return scalar(text); }
  bool string(string_t& v) override {
    return scalar(nlohmann::json(v).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  bool binary(binary_t&) override { return scalar("binary"); }
  bool start_object(std::size_t) override { return open(true); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (depth_ == 1) entries.push_back({std::move(k), -1, {}});
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = json_error_text(e);
    return false;
  }

 private:
  int depth_ = 0;  // open objects and arrays
  bool scalar(std::string text) {
    if (depth_ == 1 && !entries.empty()) entries.back().not_an_id = std::move(text);
    return true;
  }
  bool open(bool is_object) {
    if (depth_ == 0) object = is_object;
    if (depth_ == 1 && !entries.empty()) entries.back().not_an_id = is_object ? "{...}" : "[...]";
    ++depth_;
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }
};
}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(const std::filesystem::path& encoder_json, const std::filesystem::path& merges_path,
                             int extra_ids, bool vocabulary_only) {
  static std::atomic<uint64_t> instances{0};
  instance_ = ++instances;
  read_vocabulary(encoder_json);
  if (vocabulary_only) {
    (void)read_file(merges_path, "GPT-2 merges (vocab.bpe)");  // a file that does not open is an error still
  } else {
    read_merges(merges_path, encoder_json);
    build_merge_table();
  }
  if (extra_ids < 0) fail("extra_ids must be >= 0, got ", extra_ids);
  if (extra_ids > 0) {
    special_.first_sentinel = static_cast<int32_t>(id_bytes_.size());
    special_.num_sentinels = extra_ids;
    for (int i = 0; i < extra_ids; ++i) id_bytes_.push_back("<extra_id_" + std::to_string(i) + ">");
  }
}

// encoder.json: {"token": id, ...}, ids dense from 0
void Gpt2Tokenizer::read_vocabulary(const std::filesystem::path& encoder_json) {
  const std::string text = read_file(encoder_json, "GPT-2 vocabulary (encoder.json)");
  const std::string_view advice = "; expected GPT-2's encoder.json (an object of token -> id); re-run ./setup.sh";
  VocabularyEvents events;
  if (!nlohmann::json::sax_parse(text, &events))
    fail(encoder_json.string(), ": not valid JSON (", events.error, ")", advice);
  if (!events.object || events.entries.empty())
    fail(encoder_json.string(), ": expected a JSON object of token -> id (GPT-2's encoder.json)");
  // A key twice (parse_json's rule: nlohmann's document would keep the last value silently).
  // Sorted by hash first, the keys are compared only where hashes tie: several times faster
  // than sorting the keys.
  std::vector<std::pair<size_t, std::string_view>> keys;  // (hash, key)
  keys.reserve(events.entries.size());
  for (const auto& e : events.entries) keys.emplace_back(std::hash<std::string_view>{}(e.token), e.token);
  std::sort(keys.begin(), keys.end());
  if (const auto twice = std::adjacent_find(keys.begin(), keys.end()); twice != keys.end())
    fail(encoder_json.string(), ": not valid JSON (", key_given_twice(std::string(twice->second)), ")", advice);
  const size_t n = events.entries.size();
  id_bytes_.assign(n, std::string());
  std::vector<bool> seen(n, false);
  std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
  for (auto& [tok, id, not_an_id] : events.entries) {
    if (!not_an_id.empty() || id < 0 || id >= static_cast<int64_t>(n) || seen[static_cast<size_t>(id)])
      fail(encoder_json.string(), ": token \"", tok, "\" has id ", not_an_id.empty() ? std::to_string(id) : not_an_id,
           "; ids must be distinct integers in [0, ", n, ")");
    seen[static_cast<size_t>(id)] = true;
    std::string& raw = id_bytes_[static_cast<size_t>(id)];
    if (!to_bytes(tok, raw))
      fail(encoder_json.string(), ": token \"", tok, "\" (id ", id, ") holds a character outside GPT-2's byte alphabet");
    if (tok == "<|endoftext|>") special_.eod = static_cast<int32_t>(id);
    if (raw.size() == 1) byte_id_[static_cast<uint8_t>(raw[0])] = static_cast<int32_t>(id);
  }
  for (int b = 0; b < 256; ++b)
    if (byte_id_[b] < 0) fail(encoder_json.string(), ": no token for byte ", b, "; not a byte-level BPE vocabulary");
  if (special_.eod < 0) fail(encoder_json.string(), ": no <|endoftext|> token; GPT-2's vocabulary has it as id 50256");
}

// vocab.bpe: "#version: 0.2" then one merge "a b" per line, by priority
void Gpt2Tokenizer::read_merges(const std::filesystem::path& merges_path, const std::filesystem::path& encoder_json) {
  const std::string merges_text = read_file(merges_path, "GPT-2 merges (vocab.bpe)");
  std::unordered_map<std::string_view, int32_t> token_id;  // raw bytes -> id
  token_id.reserve(id_bytes_.size());
  for (size_t id = 0; id < id_bytes_.size(); ++id) token_id.emplace(id_bytes_[id], static_cast<int32_t>(id));
  uint32_t rank = 0;
  merges_.reserve(60000);
  auto to_raw = [&](std::string_view tok, size_t line) {
    std::string raw;
    if (!to_bytes(tok, raw))
      fail(merges_path.string(), ":", line, ": \"", tok, "\" holds a character outside GPT-2's byte alphabet");
    auto id = token_id.find(raw);
    if (id == token_id.end())
      fail(merges_path.string(), ":", line, ": \"", tok, "\" is not in ", encoder_json.string(),
           "; the merges file does not belong to this vocabulary");
    return id->second;
  };
  for_each_line(merges_text, [&](std::string_view line, size_t line_no) {
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) return;
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp + 1 >= line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos)
      fail(merges_path.string(), ":", line_no, ": expected two tokens separated by one space, got \"",
           line, "\"");
    const std::string_view a = line.substr(0, sp), b = line.substr(sp + 1);
    const int32_t ia = to_raw(a, line_no), ib = to_raw(b, line_no);
    auto merged = token_id.find(id_bytes_[static_cast<size_t>(ia)] + id_bytes_[static_cast<size_t>(ib)]);
    if (merged == token_id.end())
      fail(merges_path.string(), ":", line_no, ": the merge of \"", a, "\" and \"", b,
           "\" is not in the vocabulary");
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia)) << 32) | static_cast<uint32_t>(ib);
    merges_.emplace(key, (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(merged->second));
    ++rank;
  });
  if (rank == 0) fail(merges_path.string(), ": no merges found; expected GPT-2's vocab.bpe");
  num_merges_ = static_cast<size_t>(rank);
}

void Gpt2Tokenizer::build_merge_table() {
  size_t slots = 16;
  while (slots < 2 * merges_.size()) slots *= 2;
  table_mask_ = slots - 1;
  table_keys_.assign(slots, kEmptyKey);
  table_values_.assign(slots, 0);
  for (const auto& [key, value] : merges_) {
    uint64_t s = slot_of(key, table_mask_);
    while (table_keys_[s] != kEmptyKey) s = (s + 1) & table_mask_;
    table_keys_[s] = key;
    table_values_[s] = value;
  }
}

void Gpt2Tokenizer::require_merges() const {
  if (table_keys_.empty())
    throw std::logic_error(
        "this GPT-2 tokenizer was made for its vocabulary alone (vocabulary_only), without the "
        "merges that encoding needs");
}

uint64_t Gpt2Tokenizer::merge_rank(int32_t a, int32_t b) const {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  for (uint64_t s = slot_of(key, table_mask_);; s = (s + 1) & table_mask_) {
    const uint64_t k = table_keys_[s];
    if (k == key) return table_values_[s];
    if (k == kEmptyKey) return std::numeric_limits<uint64_t>::max();
  }
}

// GPT-2's rule, as bpe() below applies it: the lowest-ranked adjacent pair is merged at
// every occurrence, left to right, then ranks are looked at again. Here the positions of
// the adjacent pairs wait in one bucket per rank (a rank names one merge (a, b)), and a
// small heap holds the ranks whose buckets are filled. A round takes the lowest rank's
// bucket, sorts it, and merges the pairs still there left to right, so overlapping
// occurrences ("aaa" with (a, a)) resolve as there. The pairs a merge creates cannot have
// the round's rank (the merged token is neither a nor b): they are bucketed after the
// round. O(n log n), with far fewer cache misses than a heap over every position.
void Gpt2Tokenizer::bpe_long(std::vector<int32_t>& w, std::vector<int32_t>& out) const {
  require_merges();
  // Per position i (the left token of a pair; merges keep the left index): the next and
  // previous live positions, and the rank and merged id of the pair (i, next[i]).
  const auto n = static_cast<uint32_t>(w.size());
  constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  std::vector<uint32_t> next(n), prev(n), rank(n, kNone);
  std::vector<int32_t> merged(n, -1);
  for (uint32_t i = 0; i < n; ++i) next[i] = i + 1 < n ? i + 1 : kNone, prev[i] = i > 0 ? i - 1 : kNone;
  std::vector<std::vector<uint32_t>> bucket(num_merges_);
  std::priority_queue<uint32_t, std::vector<uint32_t>, std::greater<uint32_t>> ranks;
  // An entry i in bucket r is current while rank[i] == r (the pair there is then the same pair).
  auto set_pair = [&](uint32_t i) {
    if (i == kNone) return;
    rank[i] = kNone;
    const uint32_t j = next[i];
    if (j == kNone) return;
    const uint64_t r = merge_rank(w[i], w[j]);
    if (r == std::numeric_limits<uint64_t>::max()) return;
    rank[i] = static_cast<uint32_t>(r >> 32);
    merged[i] = static_cast<int32_t>(r & 0xFFFFFFFFu);
    auto& b = bucket[rank[i]];
    if (b.empty()) ranks.push(rank[i]);
    b.push_back(i);
  };
  for (uint32_t i = 0; i + 1 < n; ++i) set_pair(i);
  std::vector<uint32_t> round, merged_at;
  while (!ranks.empty()) {
    const uint32_t r = ranks.top();
    ranks.pop();
    round.clear();
    round.swap(bucket[r]);
    if (round.empty()) continue;  // a rank pushed twice
    std::sort(round.begin(), round.end());
    merged_at.clear();
    for (const uint32_t i : round) {
      if (rank[i] != r) continue;  // stale, or its right token was consumed earlier this round
      const uint32_t j = next[i], k = next[j];
      w[i] = merged[i];
      next[i] = k;
      if (k != kNone) prev[k] = i;
      // The pairs (prev, i), (i, k) and j's are no longer what their entries say; the new
      // ones are bucketed after the round.
      rank[j] = kNone;
      rank[i] = kNone;
      if (prev[i] != kNone) rank[prev[i]] = kNone;
      merged_at.push_back(i);
    }
    for (const uint32_t i : merged_at) {
      set_pair(prev[i]);
      set_pair(i);
    }
  }
  for (uint32_t i = 0; i != kNone; i = next[i]) out.push_back(w[i]);
}

void Gpt2Tokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  require_merges();
  if (piece.size() > 256) {  // each round below scans the whole piece: quadratic for long ones
    std::vector<int32_t> w(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) w[i] = byte_id_[static_cast<uint8_t>(piece[i])];
    return bpe_long(w, out);
  }
  int32_t small[64];
  std::vector<int32_t> big;
  int32_t* w = small;
  if (piece.size() > 64) {
    big.resize(piece.size());
    w = big.data();
  }
  size_t n = piece.size();
  for (size_t i = 0; i < n; ++i) w[i] = byte_id_[static_cast<uint8_t>(piece[i])];
  auto rank_of = [&](int32_t a, int32_t b) { return merge_rank(a, b); };
  while (n > 1) {
    // The lowest-ranked adjacent pair (a, b)...
    uint64_t best = std::numeric_limits<uint64_t>::max();
    int32_t a = 0, b = 0;
    for (size_t i = 0; i + 1 < n; ++i) {
      const uint64_t r = rank_of(w[i], w[i + 1]);
      if (r < best) best = r, a = w[i], b = w[i + 1];
    }
    if (best == std::numeric_limits<uint64_t>::max()) break;
    // ...is merged at every occurrence, left to right, before ranks are looked at again.
    const auto merged = static_cast<int32_t>(best & 0xFFFFFFFFu);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
      if (i + 1 < n && w[i] == a && w[i + 1] == b) {
        w[o++] = merged;
        i += 2;
      } else {
        w[o++] = w[i++];
      }
    }
    n = o;
  }
  out.insert(out.end(), w, w + n);
}

namespace {
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct PieceCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
};
}  // namespace

void Gpt2Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  require_merges();
  // Per-thread cache of pre-token -> ids: words repeat, so most pieces are a lookup.
  thread_local PieceCache cache;
  if (cache.owner != instance_ || cache.map.size() > (1u << 20)) {
    cache.map.clear();
    cache.owner = instance_;
  }
  pretokenize(text, [&](std::string_view piece) {
    if (piece.size() == 1) {
      out.push_back(byte_id_[static_cast<uint8_t>(piece[0])]);
      return;
    }
    auto it = cache.map.find(piece);
    if (it == cache.map.end()) {
      std::vector<int32_t> ids;
      bpe(piece, ids);
      it = cache.map.emplace(std::string(piece), std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  });
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      fail("GPT-2 decode: token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")");
    out += id_bytes_[static_cast<size_t>(id)];
  }
  return out;
}

std::string Gpt2Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_size()) fail("GPT-2: token id ", id, " is outside the vocabulary");
  return id_bytes_[static_cast<size_t>(id)];
}

}  // namespace megabatch::data
