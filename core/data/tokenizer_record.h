// Which tokenizer a dataset's ids come from: PREFIX.tokenizer.json beside its .bin/.idx.
//
// Megatron's .bin/.idx say nothing of the tokenizer, and a WordPiece dataset's ids all lie
// within GPT-2's vocabulary: a GPT given one trained on it without a word. `preprocess`
// writes this record beside every dataset it makes, and tokenizer_for_dataset (train,
// preprocess inspect and compact) refuses a dataset whose record names another tokenizer or
// vocabulary than the run's. A dataset without a record (made by Megatron's
// preprocess_data.py, or by megabatch before the record) is taken as it is.
//
// {"format": "megabatch tokenizer record 1", "tokenizer_type": "GPT2BPETokenizer",
//  "vocab_size": 50257, "vocab_fingerprint": "fnv1a64:...", "vocab_file": ""}
// vocab_size and the fingerprint (FNV-1a, 64 bits, over each token's text in id order) cover
// the vocabulary without T5's sentinels: --vocab-extra-ids appends them after it, so the ids
// of the text are the same with any number. vocab_file is the --vocab-file given to
// preprocess, empty for the asset cache's (for people; the fingerprint decides).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "core/data/tokenizer.h"

namespace megabatch::data {

struct TokenizerRecord {
  std::string tokenizer_type;  // Megatron's name (Tokenizer::type())
  int64_t vocab_size = 0;      // ids the text can have: the vocabulary without sentinels
  std::string fingerprint;     // "fnv1a64:" and 16 hex digits
  std::string vocab_file;      // as given to preprocess; empty: the asset cache's
};

// PREFIX.tokenizer.json.
std::filesystem::path tokenizer_record_path(const std::filesystem::path& prefix);

// The record of datasets `tokenizer` makes (built from `vocab_file`, empty for the default).
TokenizerRecord describe_tokenizer(const Tokenizer& tokenizer, const std::filesystem::path& vocab_file = {});

// Writes PREFIX.tokenizer.json whole or not at all.
void write_tokenizer_record(const std::filesystem::path& prefix, const TokenizerRecord& record);

// Reads and validates a record; throws Error naming the file and the key.
TokenizerRecord read_tokenizer_record(const std::filesystem::path& file);

// Throws Error naming PREFIX.tokenizer.json, what made the dataset and what to change when the
// record names another tokenizer type or vocabulary than `tokenizer`'s; nothing without one.
void check_tokenizer_record(const std::filesystem::path& prefix, const Tokenizer& tokenizer);

}  // namespace megabatch::data
