#include "core/data/tokenizer.h"

#include "core/data/gpt2_tokenizer.h"
#include "core/data/wordpiece_tokenizer.h"
#include "core/util/error.h"
#include "core/util/files.h"

namespace megabatch::data {

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& o) {
  if (o.type == "GPT2BPETokenizer") {
    const auto vocab = o.vocab_file.empty() ? asset_path("gpt2/encoder.json") : o.vocab_file;
    const auto merges = o.merge_file.empty() ? asset_path("gpt2/vocab.bpe") : o.merge_file;
    return std::make_unique<Gpt2Tokenizer>(vocab, merges, o.extra_ids, o.vocabulary_only);
  }
  if (o.type == "BertWordPieceLowerCase" || o.type == "BertWordPieceCase") {
    // Cased WordPiece over an uncased vocabulary: every word with a capital letter is [UNK].
    if (o.type == "BertWordPieceCase" && o.vocab_file.empty())
      fail("BertWordPieceCase keeps capital letters, but the default vocabulary (", asset_dir().string(),
           "/bert/vocab.txt) is BERT-base-uncased's, made from lowercased text, so every word with a capital would "
           "become [UNK]; give a cased vocabulary with --vocab-file (e.g. bert-base-cased's vocab.txt), or use "
           "BertWordPieceLowerCase");
    const auto vocab = o.vocab_file.empty() ? asset_path("bert/vocab.txt") : o.vocab_file;
    return std::make_unique<WordPieceTokenizer>(vocab, o.type == "BertWordPieceLowerCase", o.extra_ids);
  }
  fail("unknown tokenizer type '", o.type,
       "'; expected GPT2BPETokenizer, BertWordPieceLowerCase or BertWordPieceCase");
}

}  // namespace megabatch::data
