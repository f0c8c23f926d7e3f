// GPT, BERT and T5 sample builders: statistics over many samples, document bounds,
// determinism and exact resume.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "core/data/indexed_dataset.h"
#include "core/data/samples.h"
#include "core/data/tokenizer.h"
#include "core/util/error.h"
#include "models/registry.h"
#include "tests/unit/test_util.h"

namespace megabatch::data {
namespace {

using megabatch::testing::TempDir;

// A dataset whose every token is unique: doc d, sentence s, position p.
struct Synthetic {
  TempDir dir;
  std::shared_ptr<IndexedDataset> ds;
  std::map<int32_t, std::tuple<int, int, int>> where;  // token -> (doc, sentence, position)
  std::vector<std::vector<int32_t>> doc_tokens;
  Synthetic(int docs, int max_sentences, int max_len, uint32_t seed) {
    std::mt19937 rng(seed);
    IndexedDatasetBuilder b(dir / "syn", DType::kI32);
    int32_t next = 1000;
    for (int d = 0; d < docs; ++d) {
      doc_tokens.emplace_back();
      const int ns = 1 + static_cast<int>(rng() % static_cast<uint32_t>(max_sentences));
      for (int s = 0; s < ns; ++s) {
        std::vector<int32_t> seq(1 + rng() % static_cast<uint32_t>(max_len));
        for (size_t p = 0; p < seq.size(); ++p) {
          seq[p] = next++;
          where[seq[p]] = {d, s, static_cast<int>(p)};
          doc_tokens.back().push_back(seq[p]);
        }
        b.add_sequence(seq);
      }
      b.end_document();
    }
    b.finalize();
    ds = std::make_shared<IndexedDataset>(dir / "syn");
  }
};

SpecialTokens bert_specials() {
  SpecialTokens s;
  s.pad = 0, s.unk = 100, s.cls = 101, s.sep = 102, s.mask = 103, s.bos = 1, s.eos = 2;
  s.first_sentinel = 900, s.num_sentinels = 100;
  return s;
}

TEST(GptSamples, WindowsFollowTheShuffledDocumentStreamAndStayInBounds) {
  Synthetic syn(40, 3, 20, 1);
  const int seq = 16;
  GptSamples g(syn.ds, DocumentRange::all(*syn.ds), seq, 1234, 1 << 30);
  uint64_t total = 0;
  for (const auto& d : syn.doc_tokens) total += d.size();
  EXPECT_EQ(g.samples_per_epoch(), (total - 1) / seq);
  std::vector<int32_t> w(seq + 1);
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<int32_t> firsts;
    for (uint64_t j = 0; j < g.samples_per_epoch(); ++j) {
      g.get(epoch * g.samples_per_epoch() + j, w.data());
      firsts.insert(w[0]);
      for (int i = 0; i + 1 <= seq; ++i) {
        const auto [d0, s0, p0] = syn.where.at(w[static_cast<size_t>(i)]);
        const auto [d1, s1, p1] = syn.where.at(w[static_cast<size_t>(i) + 1]);
        (void)s0, (void)s1;
        const bool next_in_doc = d1 == d0 && w[static_cast<size_t>(i) + 1] == w[static_cast<size_t>(i)] + 1;
        const bool doc_boundary = w[static_cast<size_t>(i)] == syn.doc_tokens[static_cast<size_t>(d0)].back() &&
                                  w[static_cast<size_t>(i) + 1] == syn.doc_tokens[static_cast<size_t>(d1)].front();
        ASSERT_TRUE(next_in_doc || doc_boundary) << "window " << j << " position " << i;
        (void)p0, (void)p1;
      }
    }
    EXPECT_EQ(firsts.size(), g.samples_per_epoch()) << "windows of an epoch start at distinct tokens";
  }
}

TEST(GptSamples, TooSmallDatasetIsAClearError) {
  Synthetic syn(2, 1, 3, 2);
  try {
    GptSamples g(syn.ds, DocumentRange::all(*syn.ds), 64, 1, 1 << 30);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one GPT sample of sequence length 64 needs 65"), std::string::npos) << e.what();
  }
}

TEST(BertAndT5Samples, DatasetsWithoutUsableDocumentsAreClearErrors) {
  using megabatch::testing::expect_error;
  Synthetic one_sentence_docs(6, 1, 10, 5);  // BERT's sentence-order task needs 2 sentences
  expect_error([&] { BertSamples(one_sentence_docs.ds, DocumentRange::all(*one_sentence_docs.ds), BertOptions{},
                                 bert_specials(), 1 << 30, 1); },
               "no BERT sample can be built from the selected 6 documents (each needs at least 2 sentences)");
  expect_error([&] { BertSamples(one_sentence_docs.ds, DocumentRange{2, 9}, BertOptions{}, bert_specials(), 1 << 30, 1); },
               "document range [2, 9) is outside the dataset's 6 documents");
  expect_error([&] { T5Samples(one_sentence_docs.ds, DocumentRange{3, 3}, T5Options{}, bert_specials(), 1 << 30, 1); },
               "no T5 sample can be built from the selected 0 documents");
  SpecialTokens gpt2_like;
  gpt2_like.eod = 50256;
  expect_error([&] { BertSamples(one_sentence_docs.ds, DocumentRange::all(*one_sentence_docs.ds), BertOptions{},
                                 gpt2_like, 1 << 30, 1); },
               "BERT samples need [CLS], [SEP], [MASK] and [PAD]");
}

TEST(GptSamples, TokenOutsideVocabularyIsAClearError) {
  Synthetic syn(5, 2, 10, 3);
  GptSamples g(syn.ds, DocumentRange::all(*syn.ds), 4, 1, /*vocab_size=*/1001);
  std::vector<int32_t> w(5);
  try {
    for (uint64_t i = 0; i < g.samples_per_epoch(); ++i) g.get(i, w.data());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is outside the vocabulary [0, 1001)"), std::string::npos) << e.what();
  }
}

TEST(Loader, ResumedCursorYieldsTheSameBatches) {
  Synthetic syn(30, 4, 12, 4);
  const BertOptions bo{24, 0.1, 0.15, true, false, {}};
  BertSamples bert(syn.ds, DocumentRange::all(*syn.ds), bo, bert_specials(), 1 << 30, 99);
  GptSamples gpt(syn.ds, DocumentRange::all(*syn.ds), 8, 99, 1 << 30);
  auto batch = [&](SampleCursor& c, uint64_t n) {
    std::vector<int32_t> all;
    const uint64_t first = c.take(n);
    BertSample s;
    std::vector<int32_t> w(9);
    for (uint64_t i = first; i < first + n; ++i) {
      bert.get(i, s);
      all.insert(all.end(), s.tokens.begin(), s.tokens.end());
      all.insert(all.end(), s.labels.begin(), s.labels.end());
      gpt.get(i, w.data());
      all.insert(all.end(), w.begin(), w.end());
    }
    return all;
  };
  SampleCursor straight;
  std::vector<std::vector<int32_t>> expected;
  for (int b = 0; b < 12; ++b) expected.push_back(batch(straight, 7));  // crosses epochs
  SampleCursor first_run;
  for (int b = 0; b < 5; ++b) (void)batch(first_run, 7);
  const uint64_t saved = first_run.consumed();
  SampleCursor resumed;
  resumed.seek(saved);
  for (int b = 5; b < 12; ++b) EXPECT_EQ(batch(resumed, 7), expected[static_cast<size_t>(b)]) << "batch " << b;
}

// The order of samples is shuffled per epoch and by seed, and reproducible.
TEST(SampleOrder, ShuffledPerEpochAndSeedAndReproducible) {
  Synthetic syn(60, 5, 8, 6);
  const BertOptions bo{32, 0.0, 0.15, true, false, {}};
  auto bert_order = [&](uint64_t seed, uint64_t epoch) {
    BertSamples b(syn.ds, DocumentRange::all(*syn.ds), bo, bert_specials(), 1 << 30, seed);
    std::vector<int> docs;  // the document of each sample's first A token
    BertSample s;
    for (uint64_t i = 0; i < b.samples_per_epoch(); ++i) {
      b.get(epoch * b.samples_per_epoch() + i, s);
      const int32_t t = s.loss_mask[1] ? s.labels[1] : s.tokens[1];
      docs.push_back(std::get<0>(syn.where.at(t)));
    }
    return docs;
  };
  const auto e0 = bert_order(1, 0);
  EXPECT_FALSE(std::is_sorted(e0.begin(), e0.end())) << "chunks are not served in document order";
  EXPECT_NE(e0, bert_order(1, 1)) << "each epoch has its own order";
  EXPECT_NE(e0, bert_order(2, 0)) << "the seed changes the order";
  EXPECT_EQ(e0, bert_order(1, 0)) << "the same seed gives the same order";
  auto gpt_starts = [&](uint64_t seed, uint64_t epoch) {
    GptSamples g(syn.ds, DocumentRange::all(*syn.ds), 6, seed, 1 << 30);
    std::vector<int32_t> firsts, w(7);
    for (uint64_t i = 0; i < g.samples_per_epoch(); ++i) {
      g.get(epoch * g.samples_per_epoch() + i, w.data());
      firsts.push_back(w[0]);
    }
    return firsts;
  };
  const auto g0 = gpt_starts(1, 0);
  EXPECT_FALSE(std::is_sorted(g0.begin(), g0.end()));
  {  // windows of an epoch are shuffled too: consecutive samples are rarely adjacent windows
    GptSamples g(syn.ds, DocumentRange::all(*syn.ds), 6, 1, 1 << 30);
    std::vector<int32_t> a(7), b(7);
    uint64_t adjacent = 0;
    for (uint64_t i = 0; i + 1 < g.samples_per_epoch(); ++i) {
      g.get(i, a.data());
      g.get(i + 1, b.data());
      adjacent += a[6] == b[0];  // b starts where a ended: the next window of the stream
    }
    EXPECT_LT(adjacent, g.samples_per_epoch() / 4);
  }
  EXPECT_NE(g0, gpt_starts(1, 1));
  EXPECT_NE(g0, gpt_starts(2, 0));
  EXPECT_EQ(g0, gpt_starts(1, 0));
}

// Over-long pairs lose tokens from the front or the back of the longer segment, each
// about half the time.
// BERT and T5 samples group a document's sequences, as sentences, up to a target length and cut
// off the rest of the last one. Where the sequences are whole documents (a dataset made without
// --split-sentences), that drops most of the text: the share one epoch takes is counted (here
// against the sum worked out from the documents alone), and under half of it is a warning that
// names the cause and the fix. Sentences leave little unused, and no warning.
TEST(BertAndT5Samples, WholeDocumentsAsSequencesLeaveMostTextUnusedAndSaySo) {
  Synthetic documents(30, 1, 600, 3), sentences(30, 20, 12, 4);
  BertOptions bo;
  bo.seq_length = 64;
  bo.short_seq_prob = 0;
  bo.binary_head = false;
  T5Options to;
  to.encoder_seq_length = 64;
  to.decoder_seq_length = 32;
  to.short_seq_prob = 0;
  const auto all = [](const Synthetic& syn) { return DocumentRange::all(*syn.ds); };
  const BertSamples bert(documents.ds, all(documents), bo, bert_specials(), 1 << 30, 1);
  const T5Samples t5(documents.ds, all(documents), to, bert_specials(), 1 << 30, 1);
  uint64_t tokens = 0, bert_taken = 0, t5_taken = 0;
  for (const auto& doc : documents.doc_tokens) {  // one sequence each: a sample of its first tokens
    tokens += doc.size();
    bert_taken += std::min<uint64_t>(doc.size(), 64 - 3);
    t5_taken += std::min<uint64_t>(doc.size(), static_cast<uint64_t>(t5.max_raw_length()));
  }
  EXPECT_EQ(bert.text_use().tokens, tokens);
  EXPECT_EQ(bert.text_use().sequences, 30u);
  EXPECT_EQ(bert.text_use().taken, bert_taken);
  EXPECT_EQ(t5.text_use().taken, t5_taken);
  ASSERT_LT(2 * bert_taken, tokens);
  for (const std::string& w :
       {models::BertBatchSource(documents.ds, all(documents), bo, bert_specials(), 1 << 30, 1).unused_text_warning(),
        models::T5BatchSource(documents.ds, all(documents), to, bert_specials(), 1 << 30, 1).unused_text_warning()}) {
    EXPECT_NE(w.find("% of the " + std::to_string(tokens) + " tokens of their documents"), std::string::npos) << w;
    EXPECT_NE(w.find("these sequences average " + std::to_string(tokens / 30) +
                     " tokens: whole documents, not sentences. Make the dataset with preprocess --split-sentences"),
              std::string::npos)
        << w;
  }
  const BertSamples split(sentences.ds, all(sentences), bo, bert_specials(), 1 << 30, 1);
  EXPECT_GT(static_cast<double>(split.text_use().taken), 0.8 * static_cast<double>(split.text_use().tokens));
  EXPECT_EQ(
      models::BertBatchSource(sentences.ds, all(sentences), bo, bert_specials(), 1 << 30, 1).unused_text_warning(), "");
  EXPECT_EQ(models::T5BatchSource(sentences.ds, all(sentences), to, bert_specials(), 1 << 30, 1).unused_text_warning(),
            "");
}

TEST(BertSamples, TruncationCutsFrontAndBackAlike) {
  Synthetic syn(80, 6, 30, 7);
  const BertOptions bo{24, 0.0, 0.15, true, false, {}};
  BertSamples b(syn.ds, DocumentRange::all(*syn.ds), bo, bert_specials(), 1 << 30, 5);
  int front = 0, back = 0;
  BertSample s;
  for (uint64_t i = 0; i < 3000; ++i) {
    b.get(i, s);
    std::vector<int32_t> seg;  // the original tokens of segment A
    for (size_t p = 1; p < s.tokens.size(); ++p) {
      const int32_t t = s.loss_mask[p] ? s.labels[p] : s.tokens[p];
      if (t == bert_specials().sep && !s.loss_mask[p]) break;
      seg.push_back(t);
    }
    if (seg.empty()) continue;
    const auto [d0, s0, p0] = syn.where.at(seg.front());
    const auto [d1, s1, p1] = syn.where.at(seg.back());
    (void)d0, (void)d1, (void)s0;
    const auto& doc = syn.doc_tokens[static_cast<size_t>(d1)];
    const size_t pos_last = static_cast<size_t>(std::find(doc.begin(), doc.end(), seg.back()) - doc.begin());
    front += p0 > 0;  // A does not start at a sentence start
    back += pos_last + 1 < doc.size() && std::get<1>(syn.where.at(doc[pos_last + 1])) == s1 &&
            std::get<0>(syn.where.at(doc[pos_last + 1])) == d1;  // A stops inside a sentence
    (void)p1;
  }
  EXPECT_GT(front, 100);
  EXPECT_GT(back, 100);
  EXPECT_NEAR(static_cast<double>(front) / (front + back), 0.5, 0.1);
}

class BrownSamples : public ::testing::Test {
 protected:
  // The build's default datasets (made once for every test program), not a Brown of its own.
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(asset_dir() / "brown/ca01")) return;
    TokenizerOptions o;
    o.type = "BertWordPieceLowerCase";
    o.extra_ids = 100;
    tok_ = make_tokenizer(o).release();
    ds_ = std::make_shared<IndexedDataset>(megabatch::testing::brown_data() / "brown_bert_text_sentence");
  }
  static void TearDownTestSuite() {
    ds_.reset();
    delete tok_;
  }
  void SetUp() override { MB_REQUIRE_ASSET("brown/ca01"); }
  static inline Tokenizer* tok_ = nullptr;
  static inline std::shared_ptr<IndexedDataset> ds_;
};

TEST_F(BrownSamples, BertMaskingSentenceOrderAndLayoutStatistics) {
  const BertOptions bo{128, 0.1, 0.15, true, false, {}};
  const auto& sp = tok_->special();
  BertSamples bert(ds_, DocumentRange::all(*ds_), bo, sp, 30522, 7);
  ASSERT_GT(bert.samples_per_epoch(), 5000u);
  uint64_t real = 0, masked = 0, as_mask = 0, unchanged = 0, random = 0, swapped = 0, short_samples = 0;
  const int n = 6000;
  BertSample s;
  for (int i = 0; i < n; ++i) {
    bert.get(static_cast<uint64_t>(i), s);
    ASSERT_EQ(s.tokens.size(), 128u);
    ASSERT_EQ(s.tokens[0], sp.cls);
    size_t len = 0;
    while (len < 128 && s.padding_mask[len]) ++len;
    for (size_t p = len; p < 128; ++p) ASSERT_EQ(s.tokens[p], sp.pad) << "padding after the real tokens";
    ASSERT_EQ(s.tokens[len - 1], sp.sep);
    int seps = 0;
    for (size_t p = 0; p < len; ++p) {
      const bool special = p == 0 || (s.tokens[p] == sp.sep && !s.loss_mask[p]);
      seps += s.tokens[p] == sp.sep && !s.loss_mask[p];
      if (special) continue;
      ++real;
      if (!s.loss_mask[p]) {
        ASSERT_EQ(s.labels[p], -1);
        continue;
      }
      ++masked;
      ASSERT_GE(s.labels[p], 0);
      if (s.tokens[p] == sp.mask) ++as_mask;
      else if (s.tokens[p] == s.labels[p]) ++unchanged;
      else ++random;
    }
    ASSERT_EQ(seps, 2) << "[CLS] A [SEP] B [SEP]";
    ASSERT_EQ(s.token_types[0], 0);
    ASSERT_EQ(s.token_types[len - 1], 1);
    swapped += static_cast<uint64_t>(s.is_random);
    short_samples += len < 100;
  }
  const double rate = static_cast<double>(masked) / static_cast<double>(real);
  EXPECT_NEAR(rate, 0.15, 0.003) << "masking rate";
  EXPECT_NEAR(static_cast<double>(as_mask) / static_cast<double>(masked), 0.8, 0.01);
  EXPECT_NEAR(static_cast<double>(unchanged) / static_cast<double>(masked), 0.1, 0.01);
  EXPECT_NEAR(static_cast<double>(random) / static_cast<double>(masked), 0.1, 0.01);
  // Sentence-order label: Bernoulli(0.5) over n samples, within 4 standard deviations.
  EXPECT_NEAR(static_cast<double>(swapped) / n, 0.5, 4 * 0.5 / std::sqrt(double(n)));
  EXPECT_GT(short_samples, 0u);
}

TEST_F(BrownSamples, BertSamplesStayInsideOneDocument) {
  const BertOptions bo{64, 0.1, 0.15, true, false, {}};
  BertSamples bert(ds_, DocumentRange::all(*ds_), bo, tok_->special(), 30522, 3);
  // Map each sentence's token sequence back to its document via a token -> documents index
  // is ambiguous for real text; instead check that every sample's A+B tokens occur in
  // order inside the concatenated sentences of a single document.
  std::vector<std::vector<int32_t>> docs(ds_->num_documents());
  for (size_t d = 0; d < ds_->num_documents(); ++d)
    for (auto s = static_cast<size_t>(ds_->document_index(d)); s < static_cast<size_t>(ds_->document_index(d + 1)); ++s) {
      const auto t = ds_->sequence(s);
      docs[d].insert(docs[d].end(), t.begin(), t.end());
    }
  BertSample s;
  for (uint64_t i = 0; i < 300; ++i) {
    bert.get(i, s);
    std::vector<int32_t> a;
    bool in_b = false;
    for (size_t p = 1; p < s.tokens.size() && s.padding_mask[p]; ++p) {
      const int32_t orig = s.loss_mask[p] ? s.labels[p] : s.tokens[p];
      if (orig == tok_->special().sep && !s.loss_mask[p]) {
        if (in_b) break;
        in_b = true;
        continue;
      }
      if (!in_b) a.push_back(orig);
    }
    bool found = false;
    for (const auto& d : docs)
      if (!a.empty() && std::search(d.begin(), d.end(), a.begin(), a.end()) != d.end()) {
        found = true;
        break;
      }
    ASSERT_TRUE(found) << "segment A of sample " << i << " is not a contiguous run of one document";
  }
}

TEST_F(BrownSamples, T5SpanCorruptionStatisticsAndReconstruction) {
  const T5Options to{512, 128, 0.15, 3.0, 0.1, {}};
  const auto& sp = tok_->special();
  T5Samples t5(ds_, DocumentRange::all(*ds_), to, sp, tok_->vocab_size(), 11);
  // 569 raw tokens: 85 corrupted in 28 spans leave 569 - 85 + 28 = 512 encoder tokens (no
  // encoder [EOS], as in Megatron) and 85 + 28 + 1 = 114 decoder tokens.
  EXPECT_EQ(t5.max_raw_length(), 569);
  uint64_t noise = 0, raw = 0, spans = 0;
  std::map<int, uint64_t> span_hist;
  T5Sample s;
  for (uint64_t i = 0; i < 1500; ++i) {
    t5.get(i, s);
    ASSERT_EQ(s.encoder_tokens.size(), 512u);
    ASSERT_EQ(s.decoder_input.size(), 128u);
    ASSERT_EQ(s.decoder_input[0], sp.bos);
    // Rebuild the raw text from the encoder input and the targets, sentinel by sentinel.
    std::vector<std::vector<int32_t>> fill(static_cast<size_t>(s.num_spans));
    int cur = -1;
    size_t dl = 0;
    while (dl < 128 && s.decoder_mask[dl]) ++dl;
    ASSERT_EQ(s.decoder_target[dl - 1], sp.eos);
    for (size_t p = 0; p + 1 < dl; ++p) {
      const int32_t t = s.decoder_target[p];
      if (t >= sp.first_sentinel && t < sp.first_sentinel + sp.num_sentinels) cur = t - sp.first_sentinel;
      else fill[static_cast<size_t>(cur)].push_back(t);
      ASSERT_EQ(s.decoder_input[p + 1], t) << "decoder input is the target shifted right";
    }
    int expect_sentinel = 0, rebuilt = 0;
    for (size_t p = 0; p < 512 && s.encoder_mask[p]; ++p) {
      const int32_t t = s.encoder_tokens[p];
      if (t >= sp.first_sentinel && t < sp.first_sentinel + sp.num_sentinels) {
        ASSERT_EQ(t - sp.first_sentinel, expect_sentinel++) << "sentinels in order";
        rebuilt += static_cast<int>(fill[static_cast<size_t>(t - sp.first_sentinel)].size());
        span_hist[static_cast<int>(fill[static_cast<size_t>(t - sp.first_sentinel)].size())]++;
        ASSERT_FALSE(fill[static_cast<size_t>(t - sp.first_sentinel)].empty()) << "spans are non-empty";
      } else {
        ++rebuilt;
      }
    }
    ASSERT_EQ(expect_sentinel, s.num_spans);
    ASSERT_EQ(rebuilt, s.raw_length);
    noise += static_cast<uint64_t>(s.num_noise_tokens);
    raw += static_cast<uint64_t>(s.raw_length);
    spans += static_cast<uint64_t>(s.num_spans);
  }
  EXPECT_NEAR(static_cast<double>(noise) / static_cast<double>(raw), 0.15, 0.01) << "corruption rate";
  EXPECT_NEAR(static_cast<double>(noise) / static_cast<double>(spans), 3.0, 0.15) << "mean span length";
  EXPECT_GT(span_hist[1], 0u);
  EXPECT_GT(span_hist[5], 0u) << "span lengths vary";
}

// Megatron's --mask-prob and --short-seq-prob reach the samples a run trains on (the batches of
// models::make_batch_source): each BERT sample masks max(1, round(p x its candidates)) tokens
// (its real tokens but [CLS] and the two [SEP]s); each T5 sample corrupts
// round(p x its raw tokens), counted back from the batch (targets = noise + spans + [EOS]), its
// longest sample the one data::t5_fit tells; a short-sequence probability of 1 fills every
// sample to a shorter length than 0 does. Where T5's spans fill the decoder and leave a quarter
// of the encoder or more as padding, train warns, naming the decoder length that fills it.
TEST_F(BrownSamples, MaskProbAndShortSeqProbReachTheBatchesAndT5WarnsWhereItsEncoderIsLeftPadded) {
  const int64_t n = 400;
  auto batch_of = [&](models::ModelConfig mc) {
    train::Batch b;
    models::make_batch_source(mc, ds_, DocumentRange::all(*ds_), *tok_, 5)->fill(0, n, b);
    return b;
  };
  auto real = [](const std::vector<uint8_t>& mask, size_t at, size_t len) {
    return std::count(mask.begin() + static_cast<std::ptrdiff_t>(at),
                      mask.begin() + static_cast<std::ptrdiff_t>(at + len), 1);
  };
  models::ModelConfig bert = models::preset("bert-mini");
  bert.seq_length = 128;
  for (const double p : {0.15, 0.4, 1.0}) {
    bert.mask_prob = p;
    const train::Batch b = batch_of(bert);
    for (int64_t i = 0; i < n; ++i) {
      const auto at = static_cast<size_t>(i * 128), candidates = static_cast<size_t>(real(b.padding_mask, at, 128) - 3);
      const auto masked = std::count_if(b.labels.begin() + static_cast<std::ptrdiff_t>(at),
                                        b.labels.begin() + static_cast<std::ptrdiff_t>(at + 128),
                                        [](int32_t l) { return l != train::kIgnoreLabel; });
      ASSERT_EQ(static_cast<size_t>(masked),
                std::min(candidates,
                         std::max<size_t>(1, static_cast<size_t>(std::lround(p * static_cast<double>(candidates))))))
          << "--mask-prob " << p << ", sample " << i << " of " << candidates << " candidates";
    }
  }
  double mean_length[2] = {0, 0};
  bert.mask_prob = 0.15;
  for (const int always : {0, 1}) {
    bert.short_seq_prob = always;
    const train::Batch b = batch_of(bert);
    mean_length[always] = static_cast<double>(real(b.padding_mask, 0, b.padding_mask.size())) / n;
  }
  EXPECT_GT(mean_length[0], 110) << "samples of 128 tokens, filled";
  EXPECT_LT(mean_length[1], 0.75 * mean_length[0]) << "every sample shorter, its length drawn from 2 up";

  models::ModelConfig t5 = models::preset("t5-mini");
  t5.seq_length = 256;
  t5.decoder_seq_length = 128;
  const SpecialTokens& sp = tok_->special();
  for (const double p : {0.15, 0.3, 0.5}) {
    t5.mask_prob = p;
    const train::Batch b = batch_of(t5);
    int checked = 0;
    int64_t longest_encoder = 0, longest_decoder = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto enc = static_cast<size_t>(i * 256), dec = static_cast<size_t>(i * 128);
      const auto spans = std::count_if(b.tokens.begin() + static_cast<std::ptrdiff_t>(enc),
                                       b.tokens.begin() + static_cast<std::ptrdiff_t>(enc + 256), [&](int32_t t) {
                                         return t >= sp.first_sentinel && t < sp.first_sentinel + sp.num_sentinels;
                                       });
      const auto targets = std::count_if(b.labels.begin() + static_cast<std::ptrdiff_t>(dec),
                                         b.labels.begin() + static_cast<std::ptrdiff_t>(dec + 128),
                                         [](int32_t l) { return l != train::kIgnoreLabel; });
      const auto noise = targets - spans - 1, raw = real(b.padding_mask, enc, 256) - spans + noise;
      longest_encoder = std::max<int64_t>(longest_encoder, real(b.padding_mask, enc, 256));
      longest_decoder = std::max<int64_t>(longest_decoder, targets);
      if (raw < 10) continue;  // (a chunk this short keeps a token uncorrupted, whatever p is)
      ASSERT_EQ(noise, std::lround(p * static_cast<double>(raw))) << "--mask-prob " << p << ", sample " << i;
      ++checked;
    }
    EXPECT_GT(checked, n / 2);
    // the longest sample is the one t5_fit tells (and the warning below counts with)
    const T5Fit fit = t5_fit({256, 128, p, 3.0, 0.1, {}}, sp.num_sentinels);
    EXPECT_EQ(longest_encoder, fit.encoder()) << "--mask-prob " << p;
    EXPECT_EQ(longest_decoder, fit.decoder()) << "--mask-prob " << p;
  }
  // At 0.5 the spans fill the decoder's 128 positions first and leave half the encoder as
  // padding: a warning, with the decoder length that fills it (the figures worked out apart,
  // halves rounded away from zero, as std::lround does: 190 tokens, 95 in 32 spans take 127 + 128; 385,
  // 193 in 64 take 256 + 258); none at 0.15, which fills the encoder (285 tokens: 256 + 58).
  t5.mask_prob = 0.15;
  EXPECT_EQ(models::sample_fill_warning(t5, *tok_), "");
  t5.mask_prob = 0.5;
  EXPECT_EQ(models::sample_fill_warning(t5, *tok_),
            "T5 samples at --mask-prob 0.5 take at most 190 tokens of text (95 corrupted, in 32 spans), whose targets "
            "fill the decoder's 128 positions but only 127 of the encoder's 256: the rest is padding. "
            "--decoder-seq-length 258 fills 256 (with 385 tokens of text), or lower --mask-prob");
  t5.decoder_seq_length = 258;
  EXPECT_EQ(models::sample_fill_warning(t5, *tok_), "");
  EXPECT_EQ(models::sample_fill_warning(bert, *tok_), "");
}

// --bert-masking whole-word, Megatron's masking: each sample's words (a piece and the "##"
// pieces after it, found here from the vocabulary's text) are masked whole or not at all, in
// runs of neighbouring words (n-grams of up to 3), never more tokens than Megatron's count
// min(p x target, max(1, round(p x tokens))) and, over the samples, close to it; the tokens
// chosen still go 80% [MASK], 10% random, 10% unchanged. Per-token masking (the default) splits
// words and masks a word's neighbour about as often as any word.
TEST_F(BrownSamples, WholeWordMaskingMasksWordsWholeInNgramsToMegatronsCount) {
  const int64_t n = 1000, T = 128;
  models::ModelConfig mc = models::preset("bert-mini");
  mc.seq_length = T;
  mc.mask_prob = 0.15;
  const SpecialTokens& sp = tok_->special();
  struct Counts {
    int64_t masked = 0, bound = 0, split_words = 0, whole_long_words = 0, masked_words = 0, neighbours = 0;
    int64_t as_mask = 0, unchanged = 0, mask_labels = 0;
  };
  auto count = [&](const std::string& masking) {
    mc.bert_masking = masking;
    train::Batch b;
    models::make_batch_source(mc, ds_, DocumentRange::all(*ds_), *tok_, 9)->fill(0, n, b);
    Counts c;
    for (int64_t i = 0; i < n; ++i) {
      const auto at = static_cast<size_t>(i * T);
      std::vector<int32_t> text;  // the sample before masking
      std::vector<bool> masked;
      for (size_t t = at; t < at + static_cast<size_t>(T) && b.padding_mask[t]; ++t) {
        masked.push_back(b.labels[t] != train::kIgnoreLabel);
        text.push_back(masked.back() ? b.labels[t] : b.tokens[t]);
        if (masked.back()) {
          c.mask_labels += b.labels[t] == sp.mask;  // (a position masked twice: its label lost)
          c.as_mask += b.tokens[t] == sp.mask;
          c.unchanged += b.tokens[t] == b.labels[t];
        }
      }
      // words: [first, end) runs of positions, a "##" piece joining the word just before it
      std::vector<std::pair<size_t, size_t>> words;
      for (size_t t = 0; t < text.size(); ++t) {
        if (text[t] == sp.cls || text[t] == sp.sep) continue;
        if (tok_->token_text(text[t]).rfind("##", 0) == 0 && !words.empty() && words.back().second == t)
          words.back().second = t + 1;
        else
          words.push_back({t, t + 1});
      }
      int64_t in_sample = 0;
      for (size_t w = 0; w < words.size(); ++w) {
        const auto [first, end] = words[w];
        const auto k = std::count(masked.begin() + static_cast<std::ptrdiff_t>(first),
                                  masked.begin() + static_cast<std::ptrdiff_t>(end), true);
        in_sample += k;
        c.split_words += k > 0 && k < static_cast<std::ptrdiff_t>(end - first);
        if (k == 0) continue;
        ++c.masked_words;
        c.whole_long_words += end - first > 1 && k == static_cast<std::ptrdiff_t>(end - first);
        c.neighbours += w + 1 < words.size() && words[w + 1].first == end && masked[words[w + 1].first];
      }
      const double p = mc.mask_prob, tokens = static_cast<double>(text.size());
      // the target lies between the text's length and seq_length - 3
      const auto most = static_cast<int64_t>(
          std::min(p * static_cast<double>(T - 3), std::max(1.0, static_cast<double>(std::lround(p * tokens)))));
      if (masking == "whole-word") {
        EXPECT_LE(in_sample, most) << "sample " << i;
      }
      c.bound += most;
      c.masked += in_sample;
    }
    return c;
  };
  const Counts w = count("whole-word"), t = count("token");
  EXPECT_EQ(w.split_words, 0) << "a word masked in part";
  EXPECT_EQ(w.mask_labels + t.mask_labels, 0) << "a label is the original token, never [MASK]";
  EXPECT_GT(w.whole_long_words, 100) << "words of several pieces, masked whole";
  EXPECT_GT(static_cast<double>(w.masked), 0.95 * static_cast<double>(w.bound)) << "Megatron's count, nearly";
  // n = 2 or 3 with probability 5/11: a masked word's next word is masked far more often than
  // per-token masking's, which draws every token alike
  const double w_next = static_cast<double>(w.neighbours) / static_cast<double>(w.masked_words),
               t_next = static_cast<double>(t.neighbours) / static_cast<double>(t.masked_words);
  EXPECT_GT(w_next, 0.3);
  EXPECT_LT(t_next, 0.25);
  EXPECT_GT(t.split_words, 0) << "per token, a word's pieces are drawn apart";
  EXPECT_NEAR(static_cast<double>(w.as_mask) / static_cast<double>(w.masked), 0.8, 0.02);
  EXPECT_NEAR(static_cast<double>(w.unchanged) / static_cast<double>(w.masked), 0.1, 0.02);
  std::cout << "whole-word: " << w.masked << " masked of at most " << w.bound << ", next word masked " << w_next
            << "; per token: " << t_next << "\n";
}

// --t5-masking whole-word, Megatron's T5 corruption: each sample fills the encoder's length less
// 2 with text (rebuilt here from the encoder's input and the decoder's targets, sentinel by
// sentinel), and each span is an n-gram of whole words (a word: a piece and the "##" pieces
// after it, found from the vocabulary's text), of n words drawn from a geometric distribution
// (p = 0.2: each length 0.8 times as frequent as the one before) and at most 10, to no more
// tokens than Megatron's count min(p x target, max(1, round(p x tokens))) and, over the samples,
// close to it. Where the decoder is too short for that count, the spans stop where it is full,
// and train warns; T5's span corruption (the default) cuts words.
TEST_F(BrownSamples, T5WholeWordMaskingCorruptsWholeWordNgramsOfGeometricLength) {
  const int64_t n = 400;
  const SpecialTokens& sp = tok_->special();
  const auto is_sentinel = [&](int32_t t) {
    return t >= sp.first_sentinel && t < sp.first_sentinel + sp.num_sentinels;
  };
  const auto continues = [&](int32_t t) { return tok_->token_text(t).rfind("##", 0) == 0; };
  struct Counts {
    int64_t noise = 0, bound = 0, split_words = 0, full_encoders = 0, longest_raw = 0, longest_decoder = 0;
    std::map<int64_t, int64_t> span_words;  // words in a span: spans
  };
  auto count_into = [&](const models::ModelConfig& mc, Counts& c) {  // (void: for ASSERT)
    train::Batch b;
    models::make_batch_source(mc, ds_, DocumentRange::all(*ds_), *tok_, 3)->fill(0, n, b);
    const auto Te = static_cast<size_t>(mc.seq_length), Td = static_cast<size_t>(mc.decoder_seq());
    for (int64_t i = 0; i < n; ++i) {
      // the spans from the targets: <extra_id_k> then span k's tokens, ..., [EOS]
      std::vector<std::vector<int32_t>> spans;
      size_t dl = 0;
      for (size_t t = static_cast<size_t>(i) * Td; t < static_cast<size_t>(i + 1) * Td; ++t) {
        const int32_t l = b.labels[t];
        if (l == train::kIgnoreLabel) break;
        ++dl;
        if (l == sp.eos) break;
        if (is_sentinel(l)) {
          ASSERT_EQ(l - sp.first_sentinel, static_cast<int32_t>(spans.size())) << "sentinels in order, sample " << i;
          spans.emplace_back();
        } else {
          ASSERT_FALSE(spans.empty());
          spans.back().push_back(l);
        }
      }
      ASSERT_EQ(b.labels[static_cast<size_t>(i) * Td + dl - 1], sp.eos) << "sample " << i;
      // the text: the encoder's input with each sentinel replaced by its span; the spans' places
      std::vector<int32_t> text;
      std::vector<std::pair<size_t, size_t>> where;
      size_t next = 0, enc_len = 0;
      for (size_t t = static_cast<size_t>(i) * Te; t < static_cast<size_t>(i + 1) * Te && b.padding_mask[t]; ++t) {
        ++enc_len;
        if (!is_sentinel(b.tokens[t])) {
          text.push_back(b.tokens[t]);
          continue;
        }
        ASSERT_EQ(b.tokens[t] - sp.first_sentinel, static_cast<int32_t>(next)) << "sample " << i;
        ASSERT_FALSE(spans[next].empty()) << "spans are non-empty, sample " << i;
        where.push_back({text.size(), text.size() + spans[next].size()});
        text.insert(text.end(), spans[next].begin(), spans[next].end());
        ++next;
      }
      ASSERT_EQ(next, spans.size()) << "every span has its place in the encoder, sample " << i;
      int64_t noise = 0;
      for (const auto& [first, end] : where) {
        noise += static_cast<int64_t>(end - first);
        // whole words: no span starts inside a word or stops before a word's end
        c.split_words += continues(text[first]) || (end < text.size() && continues(text[end]));
        ++c.span_words[std::count_if(text.begin() + static_cast<std::ptrdiff_t>(first),
                                     text.begin() + static_cast<std::ptrdiff_t>(end),
                                     [&](int32_t t) { return !continues(t); })];
      }
      const double p = mc.mask_prob;
      const auto most = static_cast<int64_t>(std::min(p * static_cast<double>(mc.seq_length - 2),
                                                      std::max(1.0, std::round(p * static_cast<double>(text.size())))));
      if (mc.t5_masking == "whole-word") {
        EXPECT_LE(noise, most) << "sample " << i;
      }
      c.noise += noise;
      c.bound += most;
      c.full_encoders += text.size() == Te - 2;
      c.longest_raw = std::max<int64_t>(c.longest_raw, static_cast<int64_t>(text.size()));
      c.longest_decoder = std::max<int64_t>(c.longest_decoder, static_cast<int64_t>(dl));
      if (mc.t5_masking == "whole-word") {
        EXPECT_LE(enc_len, Te - 2) << "sample " << i;
      }
    }
  };
  auto count = [&](const models::ModelConfig& mc) {
    Counts c;
    count_into(mc, c);
    return c;
  };
  models::ModelConfig mc = models::preset("t5-mini");
  mc.seq_length = 512;
  mc.decoder_seq_length = 128;
  mc.mask_prob = 0.15;
  mc.t5_masking = "whole-word";
  Counts w = count(mc);
  EXPECT_EQ(w.split_words, 0) << "a word corrupted in part";
  EXPECT_EQ(w.longest_raw, 510) << "the encoder's length less 2, as Megatron's";
  EXPECT_GT(w.full_encoders, n / 2) << "most samples fill it (a tenth are shorter: --short-seq-prob)";
  EXPECT_GT(static_cast<double>(w.noise), 0.95 * static_cast<double>(w.bound)) << "Megatron's count, nearly";
  EXPECT_EQ(w.span_words.rbegin()->first, 10) << "spans of up to 10 words, and no more";
  // geometric: n + 1 words are 0.8 times as frequent as n (n = 2 to 8), a little less: a long
  // n-gram overlaps a masked word more often, and is left out, and a sample's last n-gram is
  // shortened to the count; the draws of 10 or more are cut to 10
  int64_t from2 = 0, from3 = 0;
  for (int64_t k = 2; k <= 8; ++k) from2 += w.span_words[k], from3 += w.span_words[k + 1];
  const double ratio = static_cast<double>(from3) / static_cast<double>(from2);
  EXPECT_GT(ratio, 0.7);
  EXPECT_LT(ratio, 0.85);
  EXPECT_GT(w.span_words[10], 2 * w.span_words[9]) << "0.8^9 of the draws are cut to 10 words";
  EXPECT_EQ(models::sample_fill_warning(mc, *tok_), "");

  // a decoder of 32 positions holds 30 targets of the 76 that 0.15 of 510 tokens asks: full
  mc.decoder_seq_length = 32;
  const Counts d = count(mc);
  EXPECT_EQ(d.longest_decoder, 32);
  EXPECT_LT(static_cast<double>(d.noise), 0.5 * static_cast<double>(d.bound));
  EXPECT_EQ(models::sample_fill_warning(mc, *tok_),
            "T5 whole-word masking at --mask-prob 0.15 masks up to 76 of a sample's 510 tokens, but the decoder's 32 "
            "positions hold at most 30 of them (with a sentinel per span and [EOS]), so fewer are masked. Raise "
            "--decoder-seq-length past 77 (a position more per span), or lower --mask-prob");

  // no more spans than sentinels: with 3, the samples stop at their third span
  T5Options few;
  few.whole_words.on = true;
  for (int32_t id = 0; id < static_cast<int32_t>(tok_->vocab_size()); ++id)
    few.whole_words.word_continues.push_back(continues(id));
  SpecialTokens three = sp;
  three.num_sentinels = 3;
  const T5Samples samples(ds_, DocumentRange::all(*ds_), few, three, tok_->vocab_size(), 3);
  T5Sample s;
  int64_t at_most = 0;
  for (uint64_t i = 0; i < 200; ++i) {
    samples.get(i, s);
    EXPECT_LE(s.num_spans, 3) << "sample " << i;
    at_most += s.num_spans == 3;
  }
  EXPECT_GT(at_most, 150);

  mc.decoder_seq_length = 128;
  mc.t5_masking = "span";
  EXPECT_GT(count(mc).split_words, 50) << "T5's spans cut words";
  std::cout << "whole-word: " << w.noise << " corrupted of at most " << w.bound << " in spans of";
  for (const auto& [words, spans] : w.span_words) std::cout << " " << words << ":" << spans;
  std::cout << "\n";
}

TEST(T5Segmentation, UniformCompositionsAreNonEmptyAndSumUp) {
  PhiloxStream rng(5, 5);
  std::map<std::vector<int32_t>, int> counts;
  for (int i = 0; i < 30000; ++i) {
    const auto seg = random_segmentation(5, 3, rng);  // C(4,2) = 6 compositions of 5 into 3
    ASSERT_EQ(seg.size(), 3u);
    int sum = 0;
    for (int x : seg) {
      ASSERT_GE(x, 1);
      sum += x;
    }
    ASSERT_EQ(sum, 5);
    ++counts[seg];
  }
  ASSERT_EQ(counts.size(), 6u);
  for (const auto& [seg, c] : counts) EXPECT_NEAR(c, 5000, 5 * std::sqrt(5000.0));
}

}  // namespace
}  // namespace megabatch::data
