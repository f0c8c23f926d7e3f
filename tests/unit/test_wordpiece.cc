// BERT WordPiece against an independent Python reference (tests/reference/bert_wordpiece.py,
// Python's unicodedata) on the Brown corpus and edge cases, plus published ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/data/brown.h"
#include "core/data/tokenizer.h"
#include "core/data/wordpiece_tokenizer.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "tests/unit/test_util.h"

namespace megabatch::data {
namespace {

using megabatch::testing::run_command;
using megabatch::testing::TempDir;
using megabatch::testing::write_text;

const WordPieceTokenizer& uncased() {
  static const WordPieceTokenizer tok(asset_dir() / "bert/vocab.txt", true);
  return tok;
}

TEST(WordPiece, PublishedIdsOfBertBaseUncased) {
  MB_REQUIRE_ASSET("bert/vocab.txt");
  const auto& tok = uncased();
  EXPECT_EQ(tok.special().pad, 0);
  EXPECT_EQ(tok.special().unk, 100);
  EXPECT_EQ(tok.special().cls, 101);
  EXPECT_EQ(tok.special().sep, 102);
  EXPECT_EQ(tok.special().mask, 103);
  // "Hello, world!" -> hello , world ! = 7592 1010 2088 999 in bert-base-uncased.
  EXPECT_EQ(tok.encode("Hello, world!"), (std::vector<int32_t>{7592, 1010, 2088, 999}));
  // Accents are stripped when lower-casing: "Héllo" is "hello".
  EXPECT_EQ(tok.encode("H\u00e9llo"), (std::vector<int32_t>{7592}));
}

TEST(WordPiece, SubwordsUnknownsAndLongWords) {
  MB_REQUIRE_ASSET("bert/vocab.txt");
  const auto& tok = uncased();
  const auto ids = tok.encode("unaffable");
  ASSERT_GT(ids.size(), 1u);
  for (size_t i = 1; i < ids.size(); ++i) EXPECT_TRUE(tok.token_text(ids[i]).starts_with("##"));
  EXPECT_EQ(tok.decode(ids), "unaffable");
  EXPECT_EQ(tok.encode(std::string(201, 'a')), (std::vector<int32_t>{tok.special().unk}));  // Google BERT: over 200
  EXPECT_NE(tok.encode(std::string(200, 'a')), (std::vector<int32_t>{tok.special().unk}));
  EXPECT_EQ(tok.encode("\u2603\u2603\U0001F600"), (std::vector<int32_t>{tok.special().unk}));  // no pieces
  EXPECT_EQ(tok.basic_tokenize("Hi,there!\tCaf\u00c9 \u4e2d\u6587"),
            (std::vector<std::string>{"hi", ",", "there", "!", "cafe", "\u4e2d", "\u6587"}));
}

TEST(WordPiece, SpecialTokensFollowMegatron) {
  MB_REQUIRE_ASSET("bert/vocab.txt");
  const WordPieceTokenizer tok(asset_dir() / "bert/vocab.txt", true, 100);
  EXPECT_EQ(tok.special().bos, 30522);
  EXPECT_EQ(tok.special().eos, 30523);
  EXPECT_EQ(tok.special().first_sentinel, 30524);
  EXPECT_EQ(tok.vocab_size(), 30624);
  EXPECT_EQ(tok.token_text(30524 + 7), "<extra_id_7>");
  EXPECT_EQ(tok.special().eod, 30523) << "--append-eod appends [EOS], as Megatron's tokenizer falls back to eos";
}

// The edge cases and Brown's sentences, eight to a record (`every`: every n-th record).
std::vector<std::string> reference_texts(size_t every = 1) {
  std::vector<std::string> texts = {
      "The quick brown fox.", "UNwant\u00e9d,running", "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m",
      "\u00c6sir \u0152uvre stra\u00dfe \u0130stanbul", "tabs\tnew\nlines\r\nand  spaces", "ctrl\x01\x7f chars\u200b",
      "\u4e2d\u6587\u5b57\u7b26 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud55c\uad6d\uc5b4",
      "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0420\u0443\u0441\u0441\u043a\u0438\u0439",
      "$100 + 5% = <html> ~tilde^ `tick` |pipe|", "\u00ab\u00bb \u201cquotes\u201d \u2014dash\u2013 \u2026",
      "don't can't it's", "x" + std::string(120, 'b') + " tail", "\u00a0nbsp\u3000ideo\u2028ls",
      "emoji \U0001F600 \U0001F44D\U0001F3FD", "numbers 3.14 1,000 \u0661\u0662 \u00bd",
      // Greek capital sigma lowers to final sigma at the end of a word (Python's lower() of the
      // whole token): after a letter, before punctuation, with apostrophes and marks between
      "\u039f\u0394\u039f\u03a3 \u03a3\u039f\u03a6\u039f\u03a3. \u03a3 \u0391\u03a3'\u03a3 \u0391\u03a3.\u03a3 "
      "\u0391\u03a3\u0301 \u03b1\u03a3 \u0391\u03a3\u4e2d \u039f\u03a3\u03a3\u039f",
      // the over-long-word threshold: 200 characters is a word, 201 is [UNK]
      std::string(200, 'a') + " " + std::string(201, 'a'),
      // CJK compatibility ideographs are words of their own
      "\uf900\uf901x\ufa0e \U0002F800y",
      // characters newer than the reference's Unicode data (14.0): Kawi danda and sign (15.0),
      // Ol Onal punctuation and a capital letter with a lower-case mapping (16.0)
      "a\U00011F43b c\U00011F00d e\U0001E5FFf \uA7CBx \U0001E030",
  };
  for (const auto& doc : read_brown(asset_dir() / "brown"))
    for (size_t i = 0; i < doc.sentences.size(); i += 8) {
      std::string rec;
      for (size_t k = i; k < std::min(i + 8, doc.sentences.size()); ++k) rec += doc.sentences[k] + " ";
      if ((i / 8) % every == 0) texts.push_back(std::move(rec));
    }
  return texts;
}

// `tok` gives tests/reference/bert_wordpiece.py's ids (`mode`: lower or case) over `vocab`.
void expect_matches_reference(const Tokenizer& tok, const std::filesystem::path& vocab, const std::string& mode,
                              const std::vector<std::string>& texts) {
  TempDir dir;
  std::string input;
  for (const auto& t : texts) input += nlohmann::json(t).dump() + "\n";
  write_text(dir / "in.jsonl", input);
  const auto r =
      run_command("/usr/bin/python3 " + megabatch::testing::source_dir() + "/tests/reference/bert_wordpiece.py " +
                  vocab.string() + " " + mode + " " + (dir / "in.jsonl").string() + " " + (dir / "out.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir / "out.jsonl");
  std::string line;
  size_t n = 0, mismatches = 0;
  while (std::getline(in, line)) {
    ASSERT_LT(n, texts.size());
    const auto expected = nlohmann::json::parse(line).get<std::vector<int32_t>>();
    const auto got = tok.encode(texts[n]);
    if (got != expected && ++mismatches <= 5)
      ADD_FAILURE() << "record " << n << ": " << nlohmann::json(texts[n]).dump() << "\n  reference: "
                    << nlohmann::json(expected).dump() << "\n  ours:      " << nlohmann::json(got).dump();
    ++n;
  }
  EXPECT_EQ(n, texts.size());
  EXPECT_EQ(mismatches, 0u) << "of " << n << " records";
}

TEST(WordPiece, MatchesPythonReferenceOnBrownCorpusAndEdgeCases) {
  MB_REQUIRE_ASSET("bert/vocab.txt");
  MB_REQUIRE_ASSET("brown/ca01");
  expect_matches_reference(uncased(), asset_dir() / "bert/vocab.txt", "lower", reference_texts());
}

// BertWordPieceCase (no lower-casing, accents kept) against the reference in its cased mode,
// over a cased vocabulary: BERT-base-uncased's with each lower-case word also capitalized
// ("the" and "The"), and the accented letters of the edge cases as tokens of their own.
TEST(WordPiece, CasedMatchesPythonReferenceOverACasedVocabulary) {
  MB_REQUIRE_ASSET("bert/vocab.txt");
  MB_REQUIRE_ASSET("brown/ca01");
  TempDir dir;
  std::string vocab = read_file(asset_dir() / "bert/vocab.txt", "vocab");
  std::string added;
  int32_t capitalized = 0, the = -1, The = -1;
  for_each_line(vocab, [&](std::string_view tok, size_t line) {
    if (tok.size() < 2 || !std::all_of(tok.begin(), tok.end(), [](char c) { return c >= 'a' && c <= 'z'; })) return;
    std::string cap(tok);
    cap[0] = static_cast<char>(cap[0] - 'a' + 'A');
    added += cap + "\n";
    if (tok == "the") {
      the = static_cast<int32_t>(line) - 1;  // line n is id n - 1
      The = 30522 + capitalized;
    }
    ++capitalized;
  });
  for (const char* accented : {"\u00e9", "##\u00e9", "\u00c5", "\u00f6", "##\u00f6", "\u00ef", "##\u00ef"})
    added += std::string(accented) + "\n";
  ASSERT_GT(capitalized, 10000);
  ASSERT_EQ(uncased().vocab_size(), 30522 + 2) << "BERT-base-uncased's, with [BOS] and [EOS]";
  write_text(dir / "cased.txt", vocab + added);
  const WordPieceTokenizer cased(dir / "cased.txt", false);
  EXPECT_EQ(cased.encode("The the"), (std::vector<int32_t>{The, the}));
  expect_matches_reference(cased, dir / "cased.txt", "case", reference_texts(4));
}

TEST(WordPiece, BadVocabularyNamesFileAndLine) {
  using megabatch::testing::expect_error;
  TempDir dir;
  write_text(dir / "v.txt", "[PAD]\n[UNK]\nhello\n\nworld\n");
  expect_error([&] { WordPieceTokenizer(dir / "v.txt", true); }, "v.txt:4: empty token");
  write_text(dir / "v2.txt", "[PAD]\n[UNK]\nhello\nhello\n");
  expect_error([&] { WordPieceTokenizer(dir / "v2.txt", true); }, "v2.txt:4: token \"hello\" appears twice");
  write_text(dir / "v3.txt", "[PAD]\n[UNK]\nhello\n");
  expect_error([&] { WordPieceTokenizer(dir / "v3.txt", true); }, "has no [CLS]");
  TokenizerOptions o;
  o.type = "SentencePiece";
  expect_error([&] { (void)make_tokenizer(o); }, "unknown tokenizer type 'SentencePiece'");
  // cased over the default, uncased vocabulary: refused, where every capitalized word became
  // [UNK] without a word; over a cased vocabulary given, capitals are kept
  o.type = "BertWordPieceCase";
  expect_error([&] { (void)make_tokenizer(o); },
               "BertWordPieceCase keeps capital letters, but the default vocabulary (");
  write_text(dir / "cased.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nThe\nthe\n");
  o.vocab_file = dir / "cased.txt";
  EXPECT_EQ(make_tokenizer(o)->encode("The the"), (std::vector<int32_t>{5, 6}));
  o.type = "BertWordPieceLowerCase";
  EXPECT_EQ(make_tokenizer(o)->encode("The the"), (std::vector<int32_t>{6, 6}));
}

}  // namespace
}  // namespace megabatch::data
