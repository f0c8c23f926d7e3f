// GPT-2 byte-level BPE against the reference: the gpt-3-encoder package's JavaScript
// encoder run under Node.js on the same texts; every id must agree.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <utility>

#include "core/data/brown.h"
#include "core/data/gpt2_tokenizer.h"
#include "core/data/tokenizer_record.h"
#include "core/data/unicode.h"
#include "core/util/error.h"
#include "tests/unit/test_util.h"

namespace megabatch::data {
namespace {

using megabatch::testing::run_command;
using megabatch::testing::TempDir;
using megabatch::testing::write_text;

const Gpt2Tokenizer& tokenizer() {
  static const Gpt2Tokenizer tok(asset_dir() / "gpt2/encoder.json", asset_dir() / "gpt2/vocab.bpe");
  return tok;
}

// Lines without whitespace, long enough (4 KB) for the O(n log n) merge path: random
// letters (one pre-token), letters and digits and punctuation (many), and runs of a few
// letters (many overlapping occurrences of one pair).
std::string pathological(int kind) {
  std::mt19937 g(static_cast<unsigned>(kind) + 1);
  const std::string alphabets[] = {"abcdefghijklmnopqrstuvwxyz", "abcXYZ019_.-+/|", "aab"};
  const std::string& a = alphabets[kind];
  std::string s;
  for (int i = 0; i < 4096; ++i) s += a[g() % a.size()];
  return s;
}

// Texts that stress the pre-tokenizer and the byte fallback.
std::vector<std::string> edge_texts() {
  return {
      "Hello world", "Hello  world", "  leading and trailing  ", "tabs\tand\t\tmore\t",
      "line\nbreaks\n\n\nand\r\nCRLF\r\n", " \n \n x", "     ", "\n", "a \u00a0b\u3000c\u2028d\u2029e\ufeff f",
      "I'm you're we've they'll he'd it's can't", "'s 't 're 've 'm 'll 'd", "'S 'T 'RE YOU'LL",
      "rock'n'roll ''quoted'' '' ' 'x", "don''t", "12345 3.14159 1,000,000 -42 +7 1e10",
      "\u0661\u0662\u0663 \u00bd \u2167 \u00b2 \u2460", "numbers123mixed456", "café naïve résumé Ångström",
      "Ελληνικά κείμενα, Русский текст, עברית, العربية", "中文字符测试，日本語のテキスト。한국어 텍스트",
      "हिन्दी देवनागरी ਪੰਜਾਬੀ தமிழ்", "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇺🇸🇩🇪 ❤️‍🔥", "math ∑∫√∞ ≠ ≤ ≥ → ⇒",
      "URL https://example.com/path?q=1&r=2#frag", "email someone@example.org", "C++ std::vector<int> x{1,2};",
      "<|endoftext|> is text here", "!!!??? ... --- ___ *** ###", "\"quoted\" (paren) [bracket] {brace}",
      "ＦＵＬＬＷＩＤＴＨ ｌｅｔｔｅｒｓ １２３", "a\u0301 e\u0308 combining", "\u200b\u200c\u200d zero width",
      "mixed\u00a0\u00a0nbsp  runs \t \n end", "x" + std::string(300, 'y') + " long", std::string(50, ' ') + "z",
      pathological(0), pathological(1), pathological(2),
  };
}

TEST(Gpt2Tokenizer, KnownIdsOfThePublishedVocabulary) {
  MB_REQUIRE_ASSET("gpt2/encoder.json");
  const auto& tok = tokenizer();
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.special().eod, 50256);
  // "Hello world" is [15496, 995] in GPT-2 (a widely published example).
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<int32_t>{15496, 995}));
}

TEST(Gpt2Tokenizer, MatchesJavaScriptReferenceOnBrownCorpusAndEdgeCases) {
  MB_REQUIRE_ASSET("gpt-3-encoder/Encoder.js");
  MB_REQUIRE_ASSET("brown/ca01");
  std::vector<std::string> texts = edge_texts();
  // The whole de-tagged Brown corpus, in records of up to 4 sentences joined by newlines
  // (the reference encoder is quadratic in the length of one call).
  size_t brown_bytes = 0;
  for (const auto& doc : read_brown(asset_dir() / "brown")) {
    for (size_t i = 0; i < doc.sentences.size(); i += 4) {
      std::string rec;
      for (size_t k = i; k < std::min(i + 4, doc.sentences.size()); ++k) rec += doc.sentences[k] + "\n";
      brown_bytes += rec.size();
      texts.push_back(std::move(rec));
    }
  }
  ASSERT_GT(brown_bytes, 5'000'000u) << "the de-tagged Brown corpus should be over 5 MB";
  TempDir dir;
  std::string input;
  for (const auto& t : texts) input += nlohmann::json(t).dump() + "\n";
  write_text(dir / "in.jsonl", input);
  const auto r = run_command("node " + megabatch::testing::source_dir() + "/tests/reference/gpt2_encode.js " +
                             (asset_dir() / "gpt-3-encoder").string() + " " + (dir / "in.jsonl").string() +
                             " " + (dir / "out.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir / "out.jsonl");
  std::string line;
  size_t n = 0, mismatches = 0, ids = 0;
  while (std::getline(in, line)) {
    ASSERT_LT(n, texts.size());
    const auto expected = nlohmann::json::parse(line).get<std::vector<int32_t>>();
    const auto got = tokenizer().encode(texts[n]);
    ids += expected.size();
    if (got != expected && ++mismatches <= 5)
      ADD_FAILURE() << "record " << n << " differs from the reference: " << nlohmann::json(texts[n]).dump()
                    << "\n  reference: " << nlohmann::json(expected).dump() << "\n  ours:      "
                    << nlohmann::json(got).dump();
    ++n;
  }
  EXPECT_EQ(n, texts.size());
  EXPECT_EQ(mismatches, 0u) << "of " << n << " records";
  EXPECT_GT(ids, 1'000'000u);
}

// With GPT-2's own merges, merging every occurrence of the best pair per round and merging
// one occurrence at a time give the same ids (a pair that involves a new token always
// ranks after the merge that made it). A synthetic merge list where "ab a" outranks
// "a b" tells the two apart: the reference, run on that list, merges "abab" to [ab, ab].
TEST(Gpt2Tokenizer, MergesEveryOccurrenceOfTheBestPairLikeTheReference) {
  MB_REQUIRE_ASSET("gpt-3-encoder/Encoder.js");
  TempDir dir;
  // GPT-2's byte alphabet: printable Latin-1 bytes as themselves, the rest from U+0100 up.
  nlohmann::json enc = nlohmann::json::object();
  int next = 256, id = 0;
  for (int b = 0; b < 256; ++b) {
    const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    std::string u;
    unicode::append_utf8(u, static_cast<char32_t>(direct ? b : next++));
    enc[u] = id++;
  }
  enc["ab"] = id++;
  enc["aba"] = id++;
  enc["<|endoftext|>"] = id++;
  write_text(dir / "encoder.json", enc.dump());
  write_text(dir / "vocab.bpe", "#version: 0.2\nab a\na b\n");
  std::filesystem::copy_file(asset_dir() / "gpt-3-encoder/Encoder.js", dir / "Encoder.js");
  std::vector<std::string> texts = {"abab", "ababab", "aab", "abba", "baba", "ab ab"};
  std::string abs, aas;  // longer than 256 bytes: the heap path
  for (int i = 0; i < 200; ++i) abs += i % 7 == 3 ? "aab" : "ab";
  for (int i = 0; i < 300; ++i) aas += i % 5 == 0 ? "b" : "a";
  texts.insert(texts.end(), {abs, aas, std::string(301, 'a') + "b", "b" + std::string(257, 'a')});
  std::string input;
  for (const auto& t : texts) input += nlohmann::json(t).dump() + "\n";
  write_text(dir / "in.jsonl", input);
  const auto r = run_command("node " + megabatch::testing::source_dir() + "/tests/reference/gpt2_encode.js " +
                             dir.path().string() + " " + (dir / "in.jsonl").string() + " " + (dir / "out.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Gpt2Tokenizer tok(dir / "encoder.json", dir / "vocab.bpe");
  std::ifstream in(dir / "out.jsonl");
  std::string line;
  for (const auto& t : texts) {
    ASSERT_TRUE(std::getline(in, line));
    EXPECT_EQ(tok.encode(t), nlohmann::json::parse(line).get<std::vector<int32_t>>()) << t;
  }
  const int32_t ab = enc["ab"].get<int32_t>();
  EXPECT_EQ(tok.encode("abab"), (std::vector<int32_t>{ab, ab}));
}

TEST(Gpt2Tokenizer, DecodeInvertsEncodeForArbitraryBytes) {
  MB_REQUIRE_ASSET("gpt2/encoder.json");
  const auto& tok = tokenizer();
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s(rng() % 64, '\0');
    const int mode = trial % 3;  // raw bytes, ASCII-ish, UTF-8 fragments
    for (auto& ch : s) {
      const auto r = rng();
      ch = static_cast<char>(mode == 0 ? r : mode == 1 ? " \n\ta'b1.Z"[r % 9] : "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 x"[r % 12]);
    }
    const auto ids = tok.encode(s);
    ASSERT_EQ(tok.decode(ids), s) << "trial " << trial;
    for (const int32_t id : ids) ASSERT_LT(id, tok.vocab_size());
  }
  for (const auto& t : edge_texts()) EXPECT_EQ(tok.decode(tok.encode(t)), t);
}

TEST(Gpt2Tokenizer, PretokenizerPiecesConcatenateToInput) {
  std::vector<std::string> pieces;
  Gpt2Tokenizer::pretokenize("Hello  world's 42\n\n x", [&](std::string_view p) { pieces.emplace_back(p); });
  EXPECT_EQ(pieces, (std::vector<std::string>{"Hello", " ", " world", "'s", " 42", "\n\n", " x"}));
}

TEST(Gpt2Tokenizer, SentinelsAreAppendedAfterTheVocabulary) {
  MB_REQUIRE_ASSET("gpt2/encoder.json");
  const Gpt2Tokenizer tok(asset_dir() / "gpt2/encoder.json", asset_dir() / "gpt2/vocab.bpe", 100);
  EXPECT_EQ(tok.vocab_size(), 50357);
  EXPECT_EQ(tok.special().first_sentinel, 50257);
  EXPECT_EQ(tok.token_text(tok.special().sentinel(99)), "<extra_id_99>");
}

TEST(Gpt2Tokenizer, BadVocabularyFilesNameTheFileAndLine) {
  MB_REQUIRE_ASSET("gpt2/encoder.json");
  TempDir dir;
  using megabatch::testing::expect_error;
  const auto good_vocab = asset_dir() / "gpt2/encoder.json";
  const auto good_merges = asset_dir() / "gpt2/vocab.bpe";
  expect_error([&] { Gpt2Tokenizer(dir / "missing.json", good_merges); }, "missing.json: cannot open");
  write_text(dir / "bad.json", "{\"a\": 0,");
  expect_error([&] { Gpt2Tokenizer(dir / "bad.json", good_merges); }, "bad.json: not valid JSON");
  write_text(dir / "list.json", "[1,2]");
  expect_error([&] { Gpt2Tokenizer(dir / "list.json", good_merges); }, "expected a JSON object");
  write_text(dir / "merges.bpe", "#version: 0.2\nĠ t\nthree tokens here\n");
  expect_error([&] { Gpt2Tokenizer(good_vocab, dir / "merges.bpe"); }, "merges.bpe:3: expected two tokens");
  write_text(dir / "merges2.bpe", "#version: 0.2\nĠ t\nqqqqq zzzzzz\n");
  expect_error([&] { Gpt2Tokenizer(good_vocab, dir / "merges2.bpe"); }, "merges2.bpe:3: \"qqqqq\" is not in");
  expect_error([&] { (void)tokenizer().decode(std::vector<int32_t>{50257}); }, "outside the vocabulary");
  // each entry's id, said with the token it belongs to
  const std::vector<std::pair<std::string, std::string>> bad_ids = {
      {R"({"a": 0, "a": 1})", "not valid JSON (the key \"a\" appears twice in one object; give each key once)"},
      {R"({"a": 0, "b": 1.5})", "token \"b\" has id 1.5; ids must be distinct integers in [0, 2)"},
      {R"({"a": "0", "b": 1})", "token \"a\" has id \"0\"; ids must be distinct integers in [0, 2)"},
      {R"({"a": 0, "b": [1]})", "token \"b\" has id [...]; ids must be distinct integers in [0, 2)"},
      {R"({"a": {"b": 1}, "b": 1})", "token \"a\" has id {...}; ids must be distinct integers in [0, 2)"},
      {R"({"a": 0, "b": -1})", "token \"b\" has id -1; ids must be distinct integers in [0, 2)"},
      {R"({"a": 0, "b": 2})", "token \"b\" has id 2; ids must be distinct integers in [0, 2)"},
      {R"({"a": 0, "b": 0})", "token \"b\" has id 0; ids must be distinct integers in [0, 2)"},
      {R"({"a": 0, "b": 99999999999})", "token \"b\" has id 99999999999; ids must be distinct integers in [0, 2)"},
      {R"({"a": 0, "b": null})", "token \"b\" has id null; ids must be distinct integers in [0, 2)"},
      {R"({"a": 0, "b c": 1})", "token \"b c\" (id 1) holds a character outside GPT-2's byte alphabet"},
      {R"({"a": 0, "b": 1})", "no token for byte 0; not a byte-level BPE vocabulary"},
      {R"({"a": 0} [])", "not valid JSON (parse error at line 1, column "},
      {R"({"a": 1e999})", "not valid JSON (number overflow parsing '1e999')"},
  };
  for (const auto& [text, said] : bad_ids) {
    write_text(dir / "ids.json", text);
    expect_error([&] { Gpt2Tokenizer(dir / "ids.json", good_merges); }, (dir / "ids.json").string() + ": " + said);
  }
}

// train reads the vocabulary alone (it never encodes): the same ids, texts and record as the
// whole tokenizer's, no merges read, and encoding refused rather than done without merges.
TEST(Gpt2Tokenizer, TheVocabularyAloneHasTheWholeTokenizersIdsAndTextsAndDoesNotEncode) {
  MB_REQUIRE_ASSET("gpt2/encoder.json");
  TempDir dir;
  const Gpt2Tokenizer alone(asset_dir() / "gpt2/encoder.json", asset_dir() / "gpt2/vocab.bpe", 3, true);
  const Gpt2Tokenizer whole(asset_dir() / "gpt2/encoder.json", asset_dir() / "gpt2/vocab.bpe", 3);
  ASSERT_EQ(alone.vocab_size(), 50260);
  ASSERT_EQ(alone.vocab_size(), whole.vocab_size());
  EXPECT_EQ(alone.special().eod, 50256);
  EXPECT_EQ(alone.special().first_sentinel, whole.special().first_sentinel);
  for (int32_t id = 0; id < alone.vocab_size(); ++id) ASSERT_EQ(alone.token_text(id), whole.token_text(id)) << id;
  const std::vector<int32_t> ids = whole.encode("Hello world, a vocabulary alone");
  EXPECT_EQ(alone.decode(ids), "Hello world, a vocabulary alone");
  EXPECT_EQ(describe_tokenizer(alone).fingerprint, describe_tokenizer(whole).fingerprint);
  try {
    (void)alone.encode("Hello");
    ADD_FAILURE() << "a tokenizer without merges encoded";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("without the merges that encoding needs"), std::string::npos) << e.what();
  }
  std::vector<int32_t> out;
  EXPECT_THROW(alone.bpe("Hello", out), std::logic_error);
  // the merges file is not read, but one that does not open is an error as before
  write_text(dir / "not-merges.bpe", "not a merges file\n");
  EXPECT_EQ(Gpt2Tokenizer(asset_dir() / "gpt2/encoder.json", dir / "not-merges.bpe", 0, true).vocab_size(), 50257);
  megabatch::testing::expect_error(
      [&] { Gpt2Tokenizer(asset_dir() / "gpt2/encoder.json", dir / "missing.bpe", 0, true); },
      "missing.bpe: cannot open");
  // and a run's tokenizer is this one
  TokenizerOptions o;
  o.vocabulary_only = true;
  EXPECT_THROW((void)make_tokenizer(o)->encode("Hello"), std::logic_error);
}

}  // namespace
}  // namespace megabatch::data
