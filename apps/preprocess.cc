// preprocess: Megatron-compatible dataset preparation. See --help.
#include <iostream>
#include <string>
#include <string_view>

#include "core/data/compact_vocab.h"
#include "core/data/indexed_dataset.h"
#include "core/data/preprocess.h"
#include "core/util/args.h"
#include "core/util/error.h"

using namespace megabatch;
using namespace megabatch::data;

namespace {

constexpr const char* kUsage =
    "usage: preprocess --input FILE --output-prefix PREFIX --tokenizer-type TYPE [options]\n"
    "       preprocess inspect PREFIX [--documents N] [--tokenizer-type TYPE]\n"
    "       preprocess compact IN OUT --tokenizer-type TYPE\n"
    "       preprocess brown [--output-dir DIR] [--workers N] [--force]\n"
    "\n"
    "Converts text to Megatron-LM indexed datasets (PREFIX_{key}_{document|sentence}.bin/.idx),\n"
    "taking the flags of Megatron's tools/preprocess_data.py with the same meaning, and writes\n"
    "beside each a .tokenizer.json naming its tokenizer and vocabulary, which train checks.\n"
    "Input: .jsonl (one JSON object per line, text under --json-keys) or plain text\n"
    "(documents separated by blank lines; with --split-sentences each line is a sentence).\n"
    "\n"
    "examples:\n"
    "  preprocess --input corpus.jsonl --output-prefix data/corpus --tokenizer-type GPT2BPETokenizer \\\n"
    "      --append-eod --workers 2\n"
    "  preprocess --input wiki.jsonl --output-prefix data/wiki --tokenizer-type BertWordPieceLowerCase \\\n"
    "      --split-sentences --workers 2\n"
    "  preprocess inspect data/brown_gpt2_text_document --tokenizer-type GPT2BPETokenizer\n"
    "  preprocess compact data/corpus_text_document data/corpus_compact_text_document \\\n"
    "      --tokenizer-type GPT2BPETokenizer  # only the tokens the corpus uses\n"
    "  preprocess brown                       # the default dataset, into data/\n"
    "\n"
    "Vocabularies default to the asset cache that ./setup.sh fills (GPT-2 encoder.json and\n"
    "vocab.bpe; BERT-base-uncased vocab.txt).";

void add_tokenizer_flags(ArgParser& a) {
  a.option("tokenizer-type", "TYPE", "GPT2BPETokenizer, BertWordPieceLowerCase or BertWordPieceCase");
  a.option("vocab-file", "FILE", "encoder.json (GPT-2) or vocab.txt (BERT); default: the asset cache", "");
  a.option("merge-file", "FILE", "vocab.bpe merges (GPT-2); default: the asset cache", "");
  a.option("vocab-extra-ids", "N", "T5 sentinels <extra_id_0..N-1> appended to the vocabulary", "0");
}

TokenizerOptions tokenizer_options(const ArgParser& a) {
  TokenizerOptions t;
  t.type = a.get("tokenizer-type");
  t.vocab_file = a.get("vocab-file");
  t.merge_file = a.get("merge-file");
  t.extra_ids = static_cast<int>(a.get_int("vocab-extra-ids"));
  return t;
}

int run_inspect(int argc, char** argv) {
  ArgParser a("preprocess inspect", "usage: preprocess inspect PREFIX [--documents N] [--tokenizer-type TYPE]\n\n"
                                    "Prints counts, dtype, the token id range and the first documents\n"
                                    "(decoded when --tokenizer-type is given).\n\n"
                                    "example: preprocess inspect data/brown_gpt2_text_document --tokenizer-type GPT2BPETokenizer");
  a.option("documents", "N", "documents to print", "3");
  add_tokenizer_flags(a);
  if (!a.parse(argc, argv, 2)) return 0;
  if (a.positional().size() != 1) fail("preprocess inspect: expected one dataset PREFIX (without .bin/.idx)");
  std::unique_ptr<Tokenizer> tok;
  const std::string prefix = dataset_prefix(a.positional()[0]).string();  // (its .bin or .idx named: taken)
  if (a.has("tokenizer-type")) tok = tokenizer_for_dataset(make_tokenizer(tokenizer_options(a)), prefix, &std::cout);
  inspect(prefix, static_cast<int>(a.get_int("documents")), tok.get(), std::cout);
  return 0;
}

int run_compact(int argc, char** argv) {
  ArgParser a("preprocess compact",
              "usage: preprocess compact IN OUT --tokenizer-type TYPE\n\n"
              "Writes OUT.bin/.idx: the dataset IN with each token id replaced by its rank among the ids\n"
              "IN uses, and OUT.vocab.json listing those ids. Training on OUT, the model's vocabulary is\n"
              "the corpus's own (the LM head shrinks to it); the text and its token sequence are the same.\n\n"
              "example: preprocess compact data/brown_gpt2_text_document data/brown_gpt2_compact_text_document \\\n"
              "             --tokenizer-type GPT2BPETokenizer");
  add_tokenizer_flags(a);
  if (!a.parse(argc, argv, 2)) return 0;
  if (a.positional().size() != 2) fail("preprocess compact: expected the dataset prefixes IN and OUT");
  const TokenizerOptions t = tokenizer_options(a);
  const auto tok = make_tokenizer(t);
  const auto v = compact_dataset(a.positional()[0], a.positional()[1], *tok);
  std::cout << "wrote " << a.positional()[1] << ".bin/.idx/.vocab.json: " << v.ids.size() << " of "
            << tok->vocab_size() << " " << t.type << " tokens" << std::endl;
  return 0;
}

int run_brown(int argc, char** argv) {
  ArgParser a("preprocess brown", "usage: preprocess brown [--output-dir DIR] [--workers N] [--force]\n\n"
                                  "Builds the default dataset from the Brown corpus in the asset cache:\n"
                                  "DIR/brown.jsonl, DIR/brown_gpt2_text_document, DIR/brown_bert_text_sentence,\n"
                                  "and DIR/brown_gpt2_compact_text_document (the GPT-2 dataset in the corpus's own\n"
                                  "32,735 tokens, which the default sweep trains on).");
  a.option("output-dir", "DIR", "where the dataset goes", "data");
  a.option("workers", "N", "encoding threads", "2");
  a.flag("force", "rebuild even when the outputs exist");
  if (!a.parse(argc, argv, 2)) return 0;
  build_brown(a.get("output-dir"), static_cast<int>(a.get_int("workers")), a.has("force"), std::cout);
  return 0;
}

int run_preprocess(int argc, char** argv) {
  ArgParser a("preprocess", kUsage);
  a.option("input", "FILE", "input .jsonl or text file");
  a.option("input-format", "FMT", "auto (by extension: .jsonl/.json/.ndjson are jsonl), jsonl or text", "auto");
  a.option("output-prefix", "PREFIX", "output path prefix; files are PREFIX_{key}_{level}.bin/.idx");
  a.list("json-keys", "KEY", "jsonl keys to extract (one dataset per key)", {"text"});
  a.flag("split-sentences", "one sequence per sentence (BERT, T5); the datasets end in _sentence");
  a.flag("keep-newlines", "keep line breaks inside sentences when splitting");
  add_tokenizer_flags(a);
  a.flag("append-eod", "append the end-of-document token to every document");
  a.option("workers", "N", "encoding threads", "1");
  a.option("partitions", "N", "accepted for compatibility; only 1 is supported", "1");
  a.option("log-interval", "N", "documents between progress lines", "1000");
  a.flag("skip-bad-lines", "skip malformed jsonl lines (counted and reported) instead of stopping");
  if (!a.parse(argc, argv)) return 0;
  if (!a.positional().empty()) fail("unexpected argument '", a.positional()[0], "'\n", kUsage);
  if (a.get_int("partitions") != 1) fail("--partitions ", a.get("partitions"), " is not supported; use --workers");
  PreprocessOptions o;
  o.input = a.get("input");
  o.input_format = a.get("input-format");
  o.output_prefix = a.get("output-prefix");
  o.json_keys = a.get_list("json-keys");
  o.split_sentences = a.has("split-sentences");
  o.keep_newlines = a.has("keep-newlines");
  o.append_eod = a.has("append-eod");
  o.skip_bad_lines = a.has("skip-bad-lines");
  o.tokenizer = tokenizer_options(a);
  o.workers = static_cast<int>(a.get_int("workers"));
  o.log_interval = a.get_int("log-interval");
  preprocess(o, std::cerr);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "inspect") return run_inspect(argc, argv);
    if (cmd == "brown") return run_brown(argc, argv);
    if (cmd == "compact") return run_compact(argc, argv);
    if (argc == 1) {
      std::cerr << kUsage << "\n";
      return 2;
    }
    return run_preprocess(argc, argv);
  } catch (const Error& e) {
    // the flag parser's messages and the library's begin with the command's name: said once
    constexpr std::string_view kName = "preprocess: ";
    std::string_view what = e.what();
    if (what.substr(0, kName.size()) == kName) what.remove_prefix(kName.size());
    std::cerr << kName << "error: " << what << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "preprocess: error: internal: " << e.what() << std::endl;
    return 3;
  }
}
