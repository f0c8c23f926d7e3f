// BERT WordPiece (Devlin et al. 2019): basic tokenization (clean, split CJK characters,
// optional lower-casing with accent stripping, punctuation split), then greedy
// longest-match-first sub-words with "##" continuations; [UNK] for unknown words and for
// words over 100 characters. Special tokens follow Megatron-LM (see tokenizer.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/data/tokenizer.h"

namespace megabatch::data {

class WordPieceTokenizer final : public Tokenizer {
 public:
  // vocab.txt: one token per line, the line number (from 0) is the id.
  WordPieceTokenizer(const std::filesystem::path& vocab_txt, bool lower_case, int extra_ids = 0);

  std::string_view type() const override {
    return lower_case_ ? "BertWordPieceLowerCase" : "BertWordPieceCase";
  }
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override;
  std::string token_text(int32_t id) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }

  // The words of basic tokenization (before WordPiece), UTF-8.
  std::vector<std::string> basic_tokenize(std::string_view text) const;

  static constexpr size_t kMaxCharsPerWord = 200;  // Google's BERT (Megatron's copy): [UNK] above 200

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  void wordpiece(std::string_view word, size_t num_chars, std::vector<int32_t>& out) const;
  int32_t require(const std::filesystem::path& file, const char* token) const;

  bool lower_case_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids_;
};

}  // namespace megabatch::data
