// GPT-2 byte-level BPE (Radford et al. 2019), ids identical to the gpt-3-encoder package.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/data/tokenizer.h"

namespace megabatch::data {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // encoder.json (token -> id) and vocab.bpe (merges, one "a b" pair per line after a
  // "#version" header), as shipped with GPT-2. vocabulary_only: the merges are not read (the
  // file must still open), for a program that never encodes (train); encode() and bpe()
  // then throw std::logic_error.
  Gpt2Tokenizer(const std::filesystem::path& encoder_json, const std::filesystem::path& merges, int extra_ids = 0,
                bool vocabulary_only = false);

  std::string_view type() const override { return "GPT2BPETokenizer"; }
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override;
  std::string token_text(int32_t id) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_bytes_.size()); }

  // Splits text into the pre-tokens of GPT-2's regular expression
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  // calling fn(std::string_view piece) for each, in order. Pieces concatenate to text.
  template <typename Fn>
  static void pretokenize(std::string_view text, Fn&& fn);

  // BPE of one pre-token (raw bytes); appends ids. No cache.
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  // The same merges for a long piece (a line without whitespace) in O(n log n).
  void bpe_long(std::vector<int32_t>& w, std::vector<int32_t>& out) const;
  uint64_t merge_rank(int32_t a, int32_t b) const;  // (rank << 32 | merged id), or max

 private:
  // The constructor's parts: encoder.json into id_bytes_, byte_id_ and the eod token;
  // vocab.bpe into merges_; merges_ as the lookup table.
  void read_vocabulary(const std::filesystem::path& encoder_json);
  void read_merges(const std::filesystem::path& merges_path, const std::filesystem::path& encoder_json);
  void build_merge_table();
  void require_merges() const;  // throws where the merges were not read
  struct PairHash {
    size_t operator()(uint64_t k) const { return k * 0x9E3779B97F4A7C15ull >> 20; }
  };
  std::vector<std::string> id_bytes_;                        // id -> raw bytes
  std::unordered_map<uint64_t, uint64_t, PairHash> merges_;  // (a<<32|b) -> (rank<<32|merged)
  // The same as an open-addressing table (linear probing, at most half full), which the
  // merge loops look up: several times faster than the node-based map.
  std::vector<uint64_t> table_keys_, table_values_;
  uint64_t table_mask_ = 0;
  size_t num_merges_ = 0;  // ranks are 0 .. num_merges_ - 1
  int32_t byte_id_[256];                                     // byte -> single-byte token id
  uint64_t instance_;  // distinct per object: keys the per-thread word cache
};

// ---- implementation of the pre-tokenizer (header: the benchmark and tests use it) ----
namespace gpt2_detail {
enum Class : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };
Class classify(std::string_view s, size_t i, size_t& len);
}  // namespace gpt2_detail

template <typename Fn>
void Gpt2Tokenizer::pretokenize(std::string_view s, Fn&& fn) {
  using namespace gpt2_detail;
  const size_t n = s.size();
  size_t i = 0;
  size_t len = 0;
  // Consume a run of class c starting at j; returns the end.
  auto run = [&](size_t j, Class c) {
    size_t l = 0;
    while (j < n && classify(s, j, l) == c) j += l;
    return j;
  };
  while (i < n) {
    const char ch = s[i];
    if (ch == '\'' && i + 1 < n) {
      const char a = s[i + 1];
      size_t m = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') m = 2;
      else if (i + 2 < n && ((a == 'r' && s[i + 2] == 'e') || (a == 'v' && s[i + 2] == 'e') ||
                             (a == 'l' && s[i + 2] == 'l')))
        m = 3;
      if (m != 0) {
        fn(s.substr(i, m));
        i += m;
        continue;
      }
    }
    const Class c = classify(s, i, len);
    if (c == kSpace) {
      if (ch == ' ' && i + 1 < n) {  // " ?X+" for a non-space X
        size_t l2 = 0;
        const Class next = classify(s, i + 1, l2);
        if (next != kSpace) {
          const size_t e = run(i + 1, next);
          fn(s.substr(i, e - i));
          i = e;
          continue;
        }
      }
      // \s+(?!\S): a run followed by a non-space leaves its last space to the next piece
      size_t j = i, last = i, l = 0;
      while (j < n && classify(s, j, l) == kSpace) {
        last = j;
        j += l;
      }
      const size_t end = (j < n && last > i) ? last : j;
      fn(s.substr(i, end - i));
      i = end;
      continue;
    }
    const size_t e = run(i, c);
    fn(s.substr(i, e - i));
    i = e;
  }
}

}  // namespace megabatch::data
