// Compact vocabularies: a dataset renumbered to the tokens it uses keeps every document,
// sequence and token (mapped back through its .vocab.json), the tokenizer seen through it
// encodes and decodes the same text, and damaged or mismatched files are refused by name.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/data/compact_vocab.h"
#include "core/data/indexed_dataset.h"
#include "core/util/error.h"
#include "tests/unit/test_util.h"

namespace megabatch::data {
namespace {

using megabatch::testing::expect_error;
using megabatch::testing::TempDir;
using megabatch::testing::write_text;

// A tokenizer of `size` ids whose only special token is the end of document (the last id).
class NumberTokenizer final : public Tokenizer {
 public:
  explicit NumberTokenizer(int64_t size) : size_(size) { special_.eod = static_cast<int32_t>(size - 1); }
  std::string_view type() const override { return "GPT2BPETokenizer"; }
  void encode(std::string_view, std::vector<int32_t>&) const override {}
  std::string decode(std::span<const int32_t>) const override { return ""; }
  std::string token_text(int32_t id) const override { return std::to_string(id); }
  int64_t vocab_size() const override { return size_; }

 private:
  int64_t size_;
};

TEST(CompactVocab, DatasetKeepsDocumentsAndEveryTokenMapsBack) {
  TempDir dir;
  std::mt19937 rng(7);
  std::vector<int32_t> pool;  // 40 scattered ids of a 70,000-token vocabulary (int32 on disk)
  for (int i = 0; i < 40; ++i) pool.push_back(static_cast<int32_t>(rng() % 70000));
  std::vector<std::vector<std::vector<int32_t>>> docs(9);
  std::set<int32_t> used;
  {
    IndexedDatasetBuilder b(dir / "in", DType::kI32);
    for (auto& d : docs) {
      d.resize(rng() % 4);  // empty documents too
      for (auto& s : d) {
        s.resize(rng() % 30);  // empty sequences too
        for (auto& t : s) used.insert(t = pool[rng() % pool.size()]);
        b.add_sequence(s);
      }
      b.end_document();
    }
    b.finalize();
  }
  const NumberTokenizer numbers(70000);
  const CompactVocab v = compact_dataset(dir / "in", dir / "out", numbers);
  used.insert(69999);  // the end of document, a special token, though the dataset lacks it
  EXPECT_EQ(v.ids, std::vector<int32_t>(used.begin(), used.end())) << "the ids the dataset uses, ascending";
  const CompactVocab back = read_compact_vocab(compact_vocab_path(dir / "out"));
  EXPECT_EQ(back.ids, v.ids);
  EXPECT_EQ(back.tokenizer_type, "GPT2BPETokenizer");
  EXPECT_EQ(back.base_vocab_size, 70000);

  const IndexedDataset out(dir / "out");
  EXPECT_EQ(out.dtype(), DType::kU16) << "a compact vocabulary of " << v.ids.size() << " fits uint16";
  ASSERT_EQ(out.num_documents(), docs.size());
  size_t seq = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    ASSERT_EQ(out.document_index(d), static_cast<int64_t>(seq)) << "document " << d;
    for (const auto& s : docs[d]) {
      const auto got = out.sequence(seq++, static_cast<int64_t>(v.ids.size()));
      ASSERT_EQ(got.size(), s.size()) << "sequence " << seq - 1;
      for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(v.ids[static_cast<size_t>(got[i])], s[i]);
    }
  }
  EXPECT_EQ(out.num_sequences(), seq);

  expect_error([&] { compact_dataset(dir / "in", dir / "in", numbers); }, "would overwrite its input");
  expect_error([&] { compact_dataset(dir / "out", dir / "again", numbers); }, "is already compact");
  const auto small = [&] { compact_dataset(dir / "in", dir / "x", NumberTokenizer(1000)); };
  expect_error(small, (dir / "in").string());
  expect_error(small, "is outside the vocabulary [0, 1000)");
  EXPECT_FALSE(std::filesystem::exists(dir / "x.idx")) << "no dataset is left from a failed compaction";
}

TEST(CompactVocab, DamagedFilesNameTheFileAndTheKey) {
  TempDir dir;
  const auto f = dir / "d.vocab.json";
  const std::string head = R"("format": "megabatch compact vocabulary 1", "tokenizer_type": "GPT2BPETokenizer")";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json", "not valid JSON"},
      {"{" + head + R"(, "base_vocab_size": 9e999, "ids": [1]})", "not valid JSON (number overflow parsing '9e999')"},
      {R"({"format": "other", "tokenizer_type": "GPT2BPETokenizer", "base_vocab_size": 9, "ids": [1]})", "\"format\" must be"},
      {"{" + head + R"(, "ids": [1]})", "no \"base_vocab_size\""},
      {"{" + head + R"(, "base_vocab_size": 9})", "no \"ids\""},
      {"{" + head + R"(, "base_vocab_size": 9, "ids": []})", "\"ids\" must be a non-empty array"},
      {"{" + head + R"(, "base_vocab_size": 9, "ids": [1, 9]})", "\"ids\"[1] is 9, expected a token id in [0, 9)"},
      {"{" + head + R"(, "base_vocab_size": 9, "ids": [1, "2"]})", "\"ids\"[1] is \"2\""},
      {"{" + head + R"(, "base_vocab_size": 9, "ids": [3, 3]})", "must ascend without repeats, but [1] = 3 follows 3"},
  };
  for (const auto& [text, want] : cases) {
    SCOPED_TRACE(text);
    write_text(f, text);
    expect_error([&] { read_compact_vocab(f); }, f.string());
    expect_error([&] { read_compact_vocab(f); }, want);
  }
}

TEST(CompactVocab, TokenizerSeenThroughTheVocabularyEncodesAndDecodesTheSameText) {
  MB_REQUIRE_ASSET("gpt2/encoder.json");
  TempDir dir;
  TokenizerOptions o;
  const auto gpt2 = make_tokenizer(o);
  const std::vector<std::string> texts = {"The jury said the election was conducted well.",
                                          "It said the city of Atlanta deserves praise."};
  {
    IndexedDatasetBuilder b(dir / "in", token_dtype(gpt2->vocab_size()));
    for (const auto& t : texts) {
      auto ids = gpt2->encode(t);
      ids.push_back(gpt2->special().eod);
      b.add_sequence(ids);
      b.end_document();
    }
    b.finalize();
  }
  const CompactVocab v = compact_dataset(dir / "in", dir / "out", *gpt2);
  std::ostringstream log;
  const auto tok = tokenizer_for_dataset(make_tokenizer(o), dir / "out", &log);
  EXPECT_NE(log.str().find("of 50257"), std::string::npos) << log.str();
  EXPECT_EQ(tok->vocab_size(), static_cast<int64_t>(v.ids.size()));
  EXPECT_EQ(tok->type(), "GPT2BPETokenizer");
  ASSERT_GE(tok->special().eod, 0);
  EXPECT_EQ(v.ids[static_cast<size_t>(tok->special().eod)], gpt2->special().eod) << "<|endoftext|> is remapped";
  const IndexedDataset out(dir / "out");
  for (size_t i = 0; i < texts.size(); ++i) {
    auto want = out.sequence(i);
    want.pop_back();  // the EOD
    EXPECT_EQ(tok->encode(texts[i]), want) << "encoding gives the dataset's compact ids";
    EXPECT_EQ(tok->decode(want), texts[i]);
    EXPECT_EQ(tok->token_text(want[1]), gpt2->token_text(gpt2->encode(texts[i])[1]));
  }
  EXPECT_EQ(make_tokenizer(o)->vocab_size(), tokenizer_for_dataset(make_tokenizer(o), dir / "in")->vocab_size())
      << "a dataset without .vocab.json keeps the tokenizer's vocabulary";

  expect_error([&] { tok->encode("Zebras"); },
               "which is not in the compact vocabulary " + compact_vocab_path(dir / "out").string());
  expect_error([&] { tok->decode(std::vector<int32_t>{static_cast<int32_t>(v.ids.size())}); },
               "outside the compact vocabulary");

  TokenizerOptions extra = o;
  extra.extra_ids = 3;  // another vocabulary size than the file was made for
  expect_error([&] { tokenizer_for_dataset(make_tokenizer(extra), dir / "out"); },
               "compacted from a vocabulary of 50257 tokens, but this GPT2BPETokenizer tokenizer has 50260");
  if (std::filesystem::exists(asset_path("bert/vocab.txt"))) {
    TokenizerOptions bert;
    bert.type = "BertWordPieceLowerCase";
    expect_error([&] { tokenizer_for_dataset(make_tokenizer(bert), dir / "out"); },
                 "compacted from GPT2BPETokenizer ids, but the tokenizer is BertWordPieceLowerCase");
  }
}

// WordPiece for BERT and T5: the sample builders insert [CLS] [SEP] [MASK] [PAD] and the
// sentinels, which raw text never has; the vocabulary keeps them all, and one without a
// special token is refused by name.
TEST(CompactVocab, SpecialTokensAreKeptForTheSampleBuilders) {
  MB_REQUIRE_ASSET("bert/vocab.txt");
  TempDir dir;
  TokenizerOptions o;
  o.type = "BertWordPieceLowerCase";
  o.extra_ids = 4;  // T5's sentinels
  const auto bert = make_tokenizer(o);
  {
    IndexedDatasetBuilder b(dir / "in", token_dtype(bert->vocab_size()));
    b.add_sequence(bert->encode("the cat sat on the mat ."));
    b.end_document();
    b.finalize();
  }
  const CompactVocab v = compact_dataset(dir / "in", dir / "out", *bert);
  const auto tok = tokenizer_for_dataset(make_tokenizer(o), dir / "out");
  const SpecialTokens &full = bert->special(), &c = tok->special();
  const std::vector<std::pair<int32_t, int32_t>> pairs = {{c.cls, full.cls}, {c.sep, full.sep}, {c.mask, full.mask},
                                                          {c.pad, full.pad}, {c.unk, full.unk}, {c.bos, full.bos},
                                                          {c.eos, full.eos}, {c.eod, full.eod}};
  for (const auto& [compact, base] : pairs) {
    ASSERT_GE(compact, 0) << "base id " << base;
    EXPECT_EQ(v.ids[static_cast<size_t>(compact)], base);
  }
  ASSERT_EQ(c.num_sentinels, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(v.ids[static_cast<size_t>(c.sentinel(i))], full.sentinel(i)) << i;
  EXPECT_EQ(tok->vocab_size(), 6 + 5 + 2 + 4)
      << "the, cat, sat, on, mat, '.'; [CLS] [SEP] [MASK] [PAD] [UNK]; [BOS] [EOS]; 4 sentinels";

  // a hand-made vocabulary without [MASK]
  std::vector<int32_t> ids;
  for (const int32_t id : v.ids)
    if (id != full.mask) ids.push_back(id);
  write_text(dir / "nomask.vocab.json", nlohmann::json{{"format", "megabatch compact vocabulary 1"},
                                                       {"tokenizer_type", "BertWordPieceLowerCase"},
                                                       {"base_vocab_size", bert->vocab_size()}, {"ids", ids}}.dump());
  const auto nomask = [&] { tokenizer_for_dataset(make_tokenizer(o), dir / "nomask"); };
  expect_error(nomask, "the special token \"[MASK]\"");
  expect_error(nomask, (dir / "nomask.vocab.json").string());
}

}  // namespace
}  // namespace megabatch::data
