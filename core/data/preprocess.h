// `preprocess`: text -> Megatron indexed datasets, a drop-in for Megatron-LM's
// tools/preprocess_data.py (same flags, same output names {prefix}_{key}_{level}).
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

#include "core/data/tokenizer.h"

namespace megabatch::data {

struct PreprocessOptions {
  std::filesystem::path input;          // .jsonl (one JSON object per line) or plain text
  std::string input_format = "auto";    // auto (by extension), jsonl, text
  std::filesystem::path output_prefix;
  std::vector<std::string> json_keys{"text"};
  bool split_sentences = false;
  bool keep_newlines = false;
  bool append_eod = false;
  bool skip_bad_lines = false;
  TokenizerOptions tokenizer;
  int workers = 1;
  int64_t log_interval = 1000;          // documents between progress lines
};

struct PreprocessStats {
  uint64_t documents = 0, sentences = 0, tokens = 0, input_bytes = 0, bad_lines = 0;
  double seconds = 0;
  std::string first_bad_line;  // "FILE:LINE: reason" of the first skipped line
  std::vector<std::filesystem::path> outputs;  // the prefixes written
};

// Output prefix for one key: {prefix}_{key}_{document|sentence}.
std::filesystem::path output_name(const std::filesystem::path& prefix, const std::string& key, bool sentences);

// Runs the whole conversion; progress lines go to `log`. Throws Error for bad input
// (naming the file and line) unless skip_bad_lines; outputs appear only when complete.
PreprocessStats preprocess(const PreprocessOptions& options, std::ostream& log);

// One document's token ids, sentence by sentence (empty sentences dropped, EOD appended
// to the last sentence when asked), exactly as Megatron's encoder does.
struct EncodedDocument {
  std::vector<int32_t> tokens;
  std::vector<int32_t> lengths;
};
// Encodes docs[i] (a list of sentence texts) into out[i] on `workers` threads.
void encode_documents(const Tokenizer& tokenizer, const std::vector<std::vector<std::string>>& docs,
                      bool append_eod, int workers, std::vector<EncodedDocument>& out);

// The default dataset: the de-tagged Brown corpus from the asset cache, written as
// DIR/brown.jsonl, DIR/brown_gpt2_text_document (GPT-2 BPE, EOD after each document),
// DIR/brown_bert_text_sentence (WordPiece lower-case, one sequence per sentence) and
// DIR/brown_gpt2_compact_text_document (the GPT-2 dataset in the tokens the corpus uses,
// see compact_vocab.h). Skips the work when valid outputs already exist, unless force.
void build_brown(const std::filesystem::path& dir, int workers, bool force, std::ostream& log);

// `preprocess inspect`: counts, dtype and the first documents (decoded when a tokenizer
// is given), plus a full scan for the largest token id.
void inspect(const std::filesystem::path& prefix, int documents, const Tokenizer* tokenizer, std::ostream& out);

}  // namespace megabatch::data
