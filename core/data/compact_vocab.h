// A dataset's compact vocabulary: the tokens a corpus actually uses, renumbered 0..n-1.
//
// A small model trained on a small corpus spends most of its work in the LM head over
// the whole tokenizer vocabulary (GPT-2's 50,257 tokens, of which the Brown corpus uses
// 32,735). `preprocess compact IN OUT` writes OUT.bin/.idx with every token id replaced by
// its rank among the ids IN uses, and OUT.vocab.json listing those tokenizer ids in order.
// A dataset with such a file beside it is trained with the tokenizer seen through it: the
// model's vocabulary is the corpus's, the same text gives the same token sequence, and
// decoding maps back to the tokenizer's ids. Documents, sequences and lengths are kept.
//
// OUT.vocab.json: {"format": "megabatch compact vocabulary 1", "tokenizer_type": ...,
// "base_vocab_size": N, "source": "IN", "ids": [ascending tokenizer ids]}.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/data/tokenizer.h"

namespace megabatch::data {

struct CompactVocab {
  std::string tokenizer_type;  // the tokenizer whose ids `ids` are
  int64_t base_vocab_size = 0; // its vocabulary size when the file was written
  std::string source;          // the dataset it was made from (for people)
  std::vector<int32_t> ids;    // compact id i is tokenizer id ids[i]; ascending, unique
};

// PREFIX.vocab.json, the file that marks a dataset as compact.
std::filesystem::path compact_vocab_path(const std::filesystem::path& prefix);

// Reads and validates a vocabulary file; throws Error naming the file and the key.
CompactVocab read_compact_vocab(const std::filesystem::path& file);

// Writes OUT.bin/.idx and OUT.vocab.json from the dataset IN, made with `tokenizer` (its ids
// must lie in its vocabulary). The vocabulary holds the ids IN uses and every special token
// of the tokenizer ([CLS] [SEP] [MASK] [PAD] ..., T5 sentinels), which the sample builders
// insert though the text never has them. Every output appears complete or not at all.
CompactVocab compact_dataset(const std::filesystem::path& in, const std::filesystem::path& out,
                             const Tokenizer& tokenizer);

// `base` seen through `vocab`: ids are compact, specials are remapped (-1 where the corpus
// lacks them), and encoding text with a token outside the vocabulary is an Error naming it.
// Throws Error when vocab was written for another tokenizer or vocabulary size.
std::unique_ptr<Tokenizer> compact_tokenizer(std::unique_ptr<Tokenizer> base, CompactVocab vocab,
                                             const std::filesystem::path& file);

// The tokenizer for the dataset PREFIX: `base`, through PREFIX.vocab.json when there is one
// (then one line saying so goes to `log`, when given). Without one, PREFIX.tokenizer.json,
// where there is one, must name `base`'s type and vocabulary (tokenizer_record.h).
std::unique_ptr<Tokenizer> tokenizer_for_dataset(std::unique_ptr<Tokenizer> base, const std::filesystem::path& prefix,
                                                 std::ostream* log = nullptr);

}  // namespace megabatch::data
