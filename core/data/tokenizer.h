// Tokenizers: GPT-2 byte-level BPE and BERT WordPiece, behind one interface.
//
// Ids match the reference implementations exactly (tests/unit/test_gpt2_tokenizer.cc
// compares every id with the gpt-3-encoder package's JavaScript encoder; the WordPiece
// test compares with an independent Python implementation of Google's BERT tokenizer).
// Special tokens follow Megatron-LM: BERT's [CLS] [SEP] [MASK] [PAD] [UNK] come from the
// vocabulary, [BOS] [EOS] and `extra_ids` T5 sentinels <extra_id_0..N-1> are appended
// after it (as --vocab-extra-ids does); GPT-2's end of document is <|endoftext|>.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace megabatch::data {

// Ids of special tokens; -1 where the vocabulary has none.
struct SpecialTokens {
  int32_t eod = -1;   // end of document (<|endoftext|>; [SEP] for WordPiece)
  int32_t cls = -1, sep = -1, mask = -1, pad = -1, unk = -1;
  int32_t bos = -1, eos = -1;  // appended [BOS]/[EOS] (WordPiece, as Megatron)
  int32_t first_sentinel = -1;  // <extra_id_0>; <extra_id_i> = first_sentinel + i
  int32_t num_sentinels = 0;
  int32_t sentinel(int i) const { return first_sentinel + i; }
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Megatron's name: GPT2BPETokenizer, BertWordPieceLowerCase, BertWordPieceCase.
  virtual std::string_view type() const = 0;
  // Appends the ids of `text` to `out`. Thread-safe (const, no shared mutable state).
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> ids;
    encode(text, ids);
    return ids;
  }
  // Text of ids; throws Error for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // The token's own text (for display).
  virtual std::string token_text(int32_t id) const = 0;
  // All ids, specials and sentinels included (before padding for the model).
  virtual int64_t vocab_size() const = 0;
  const SpecialTokens& special() const { return special_; }

 protected:
  SpecialTokens special_;
};

struct TokenizerOptions {
  std::string type = "GPT2BPETokenizer";  // or BertWordPieceLowerCase, BertWordPieceCase
  std::filesystem::path vocab_file;        // empty: the asset cache's file for `type`
  std::filesystem::path merge_file;        // GPT-2 only; empty: the asset cache's
  int extra_ids = 0;                       // T5 sentinels appended to the vocabulary
  // The vocabulary alone (ids, special tokens, texts) for a program that never encodes
  // (train): GPT-2's merges are not read, and encode() throws std::logic_error.
  bool vocabulary_only = false;
};

// Builds a tokenizer; throws Error naming the file and line for a bad vocabulary.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& options);

}  // namespace megabatch::data
