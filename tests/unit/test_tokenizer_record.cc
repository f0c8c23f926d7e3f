// Tokenizer records (PREFIX.tokenizer.json): preprocess writes one beside each dataset it
// makes; a dataset is refused, by name, by a tokenizer of another type or vocabulary; T5's
// sentinels do not count; a dataset without one is taken as Megatron's are; a damaged one is
// named with its key; a rebuilt or compacted dataset never keeps an earlier one's record.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/data/compact_vocab.h"
#include "core/data/indexed_dataset.h"
#include "core/data/preprocess.h"
#include "core/data/tokenizer_record.h"
#include "core/util/error.h"
#include "tests/unit/test_util.h"

namespace megabatch::data {
namespace {

namespace fs = std::filesystem;
using megabatch::testing::expect_error;
using megabatch::testing::TempDir;
using megabatch::testing::write_text;

TokenizerOptions of_type(const std::string& type, int extra_ids = 0) {
  TokenizerOptions o;
  o.type = type;
  o.extra_ids = extra_ids;
  return o;
}

// Two documents of text under the keys "text" and "title", through preprocess().
PreprocessStats preprocess_to(const fs::path& dir, const std::string& prefix, const TokenizerOptions& t) {
  write_text(dir / "in.jsonl",
             "{\"text\": \"The jury said the election was conducted well.\", \"title\": \"Jury\"}\n"
             "{\"text\": \"It said the city of Atlanta deserves praise.\", \"title\": \"City\"}\n");
  PreprocessOptions o;
  o.input = dir / "in.jsonl";
  o.output_prefix = dir / prefix;
  o.json_keys = {"text", "title"};
  o.append_eod = true;
  o.tokenizer = t;
  o.log_interval = 0;
  std::ostringstream log;
  return preprocess(o, log);
}

TEST(TokenizerRecord, PreprocessWritesOneBesideEachDatasetAndAnotherTokenizerIsRefused) {
  MB_REQUIRE_ASSET("gpt2/encoder.json");
  MB_REQUIRE_ASSET("bert/vocab.txt");
  TempDir dir;
  const PreprocessStats gpt = preprocess_to(dir.path(), "gpt", of_type("GPT2BPETokenizer"));
  ASSERT_EQ(gpt.outputs.size(), 2u);
  for (const fs::path& prefix : gpt.outputs) {
    SCOPED_TRACE(prefix.string());
    const TokenizerRecord r = read_tokenizer_record(tokenizer_record_path(prefix));
    EXPECT_EQ(r.tokenizer_type, "GPT2BPETokenizer");
    EXPECT_EQ(r.vocab_size, 50257) << "GPT-2's published vocabulary";
    EXPECT_EQ(r.vocab_file, "") << "the asset cache's";
    EXPECT_NO_THROW(tokenizer_for_dataset(make_tokenizer(of_type("GPT2BPETokenizer")), prefix));
  }
  const fs::path text = gpt.outputs[0], record = tokenizer_record_path(text);
  EXPECT_EQ(record, dir / "gpt_text_document.tokenizer.json");
  const auto bert = [&] { tokenizer_for_dataset(make_tokenizer(of_type("BertWordPieceLowerCase")), text); };
  expect_error(bert, record.string() + ": the dataset " + text.string() + " was made by GPT2BPETokenizer");
  expect_error(bert,
               "but this run's tokenizer is BertWordPieceLowerCase; set tokenizer_type (--tokenizer-type) to "
               "GPT2BPETokenizer");
  // compacting it as a WordPiece dataset would write a vocabulary of the wrong tokenizer's ids
  expect_error([&] { compact_dataset(text, dir / "c", *make_tokenizer(of_type("BertWordPieceLowerCase"))); },
               record.string());
  EXPECT_FALSE(fs::exists(dir / "c.vocab.json"));

  // WordPiece: the vocabulary with [BOS] and [EOS] but without T5's sentinels, so a T5 run
  // (--vocab-extra-ids 100) takes a dataset made with none, and one made with 5 as well
  const PreprocessStats wp = preprocess_to(dir.path(), "wp", of_type("BertWordPieceLowerCase", 5));
  const TokenizerRecord r = read_tokenizer_record(tokenizer_record_path(wp.outputs[0]));
  EXPECT_EQ(r.tokenizer_type, "BertWordPieceLowerCase");
  EXPECT_EQ(r.vocab_size, 30522 + 2) << "BERT-base's 30,522 entries, [BOS] and [EOS]";
  for (const int extra : {0, 100})
    EXPECT_NO_THROW(tokenizer_for_dataset(make_tokenizer(of_type("BertWordPieceLowerCase", extra)), wp.outputs[0]))
        << extra << " sentinels";
  expect_error([&] { tokenizer_for_dataset(make_tokenizer(of_type("GPT2BPETokenizer")), wp.outputs[0]); },
               "was made by BertWordPieceLowerCase with a vocabulary of 30524 tokens (the asset cache's");

  // made again at the same prefix with the other tokenizer: the record follows
  preprocess_to(dir.path(), "gpt", of_type("BertWordPieceLowerCase"));
  EXPECT_EQ(read_tokenizer_record(record).tokenizer_type, "BertWordPieceLowerCase");
  EXPECT_NO_THROW(tokenizer_for_dataset(make_tokenizer(of_type("BertWordPieceLowerCase")), text));
}

// The vocabulary's text decides, not its file's name: a copy is the same vocabulary; two
// entries swapped (same type and size, ids that mean other words) or one entry more is not.
TEST(TokenizerRecord, AnotherVocabularyOfTheSameTypeIsRefusedAndACopyIsTaken) {
  MB_REQUIRE_ASSET("bert/vocab.txt");
  TempDir dir;
  const fs::path prefix = preprocess_to(dir.path(), "wp", of_type("BertWordPieceLowerCase")).outputs[0];
  std::vector<std::string> lines;
  {
    std::ifstream in(asset_path("bert/vocab.txt"));
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  ASSERT_EQ(lines.size(), 30522u);
  auto vocab = [&](const std::string& name, const std::vector<std::string>& ls) {
    std::string s;
    for (const auto& l : ls) s += l + "\n";
    write_text(dir / name, s);
    TokenizerOptions o = of_type("BertWordPieceLowerCase");
    o.vocab_file = dir / name;
    return make_tokenizer(o);
  };
  EXPECT_NO_THROW(tokenizer_for_dataset(vocab("copy.txt", lines), prefix)) << "the same entries in another file";
  std::vector<std::string> swapped = lines;
  std::swap(swapped[1996], swapped[7592]);  // "the" and "hello"
  const auto s = [&] { tokenizer_for_dataset(vocab("swapped.txt", swapped), prefix); };
  expect_error(
      s, tokenizer_record_path(prefix).string() + ": the dataset " + prefix.string() +
             " was made by BertWordPieceLowerCase with a vocabulary of 30524 tokens (the asset cache's, fnv1a64:");
  expect_error(s, "but this run's BertWordPieceLowerCase has a vocabulary of 30524 tokens (fnv1a64:");
  expect_error(s, "set vocab_file (--vocab-file) to the file the dataset was made with");
  EXPECT_NE(describe_tokenizer(*vocab("swapped.txt", swapped)).fingerprint,
            describe_tokenizer(*vocab("copy.txt", lines)).fingerprint);
  std::vector<std::string> longer = lines;
  longer.push_back("zyzzyva");
  expect_error([&] { tokenizer_for_dataset(vocab("longer.txt", longer), prefix); }, "has a vocabulary of 30525 tokens");

  // a dataset made from a vocab_file records the file's name, for people
  PreprocessOptions o;
  write_text(dir / "one.jsonl", "{\"text\": \"the cat\"}\n");
  o.input = dir / "one.jsonl";
  o.output_prefix = dir / "own";
  o.tokenizer = of_type("BertWordPieceLowerCase");
  o.tokenizer.vocab_file = dir / "swapped.txt";
  o.log_interval = 0;
  std::ostringstream log;
  const fs::path own = preprocess(o, log).outputs[0];
  EXPECT_EQ(read_tokenizer_record(tokenizer_record_path(own)).vocab_file, (dir / "swapped.txt").string());
  expect_error([&] { tokenizer_for_dataset(make_tokenizer(of_type("BertWordPieceLowerCase")), own); },
               "(vocab_file " + (dir / "swapped.txt").string() + ", fnv1a64:");
}

TEST(TokenizerRecord, ADatasetWithoutOneIsTakenAndADamagedOneIsNamedWithItsKey) {
  TempDir dir;
  {
    IndexedDatasetBuilder b(dir / "d", DType::kU16);
    b.add_sequence(std::vector<int32_t>{1, 2, 3});
    b.end_document();
    b.finalize();
  }
  class Numbers final : public Tokenizer {
   public:
    std::string_view type() const override { return "GPT2BPETokenizer"; }
    void encode(std::string_view, std::vector<int32_t>&) const override {}
    std::string decode(std::span<const int32_t>) const override { return ""; }
    std::string token_text(int32_t id) const override { return std::to_string(id); }
    int64_t vocab_size() const override { return 10; }
  };
  EXPECT_NO_THROW(check_tokenizer_record(dir / "d", Numbers())) << "Megatron's datasets have no record";
  write_tokenizer_record(dir / "d", describe_tokenizer(Numbers()));
  EXPECT_NO_THROW(check_tokenizer_record(dir / "d", Numbers()));

  const fs::path f = tokenizer_record_path(dir / "d");
  const nlohmann::json good = nlohmann::json::parse(megabatch::testing::read_text(f));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"format\": ", "not valid JSON"},
      {R"({"format": "megabatch tokenizer record 2"})", "\"format\" must be \"megabatch tokenizer record 1\""},
      {"[1]", "no \"format\""},
  };
  for (const auto& [text, want] : cases) {
    SCOPED_TRACE(text);
    write_text(f, text);
    expect_error([&] { check_tokenizer_record(dir / "d", Numbers()); }, f.string() + ": ");
    expect_error([&] { check_tokenizer_record(dir / "d", Numbers()); }, want);
  }
  for (const auto& [key, value, want] : std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"tokenizer_type", "", "\"tokenizer_type\" must be a tokenizer type"},
           {"vocab_size", "10", "\"vocab_size\" must be a positive integer up to 2^31"},
           {"vocab_size", 0, "\"vocab_size\" must be a positive integer up to 2^31"},
           {"vocab_fingerprint", "fnv1a64:12", "\"vocab_fingerprint\" must be \"fnv1a64:\" and 16 hex digits"},
           {"vocab_fingerprint", "fnv1a64:0123456789ABCDEF", "\"vocab_fingerprint\" must be"},
           {"vocab_file", nullptr, "\"vocab_file\" must be a string"}}) {
    SCOPED_TRACE(key + " = " + value.dump());
    nlohmann::json j = good;
    j[key] = value;
    write_text(f, j.dump());
    expect_error([&] { check_tokenizer_record(dir / "d", Numbers()); }, f.string() + ": " + want);
    j.erase(key);
    write_text(f, j.dump());
    expect_error([&] { check_tokenizer_record(dir / "d", Numbers()); }, f.string() + ": no \"" + key + "\"");
  }
}

// `preprocess compact OUT` over a prefix that held a dataset with a record: the compact
// vocabulary names the tokenizer, and the old record goes.
TEST(TokenizerRecord, ACompactDatasetKeepsNoEarlierRecord) {
  MB_REQUIRE_ASSET("gpt2/encoder.json");
  MB_REQUIRE_ASSET("bert/vocab.txt");
  TempDir dir;
  const fs::path in = preprocess_to(dir.path(), "gpt", of_type("GPT2BPETokenizer")).outputs[0];
  const fs::path old = preprocess_to(dir.path(), "out", of_type("BertWordPieceLowerCase")).outputs[0];
  ASSERT_TRUE(fs::exists(tokenizer_record_path(old)));
  compact_dataset(in, old, *make_tokenizer(of_type("GPT2BPETokenizer")));
  EXPECT_FALSE(fs::exists(tokenizer_record_path(old)));
  EXPECT_EQ(tokenizer_for_dataset(make_tokenizer(of_type("GPT2BPETokenizer")), old)->vocab_size(),
            static_cast<int64_t>(read_compact_vocab(compact_vocab_path(old)).ids.size()));
}

}  // namespace
}  // namespace megabatch::data
