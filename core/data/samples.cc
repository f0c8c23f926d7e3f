#include "core/data/samples.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/util/error.h"
#include "core/util/philox.h"

namespace megabatch::data {

namespace {

// Stream tags: one Philox key per purpose, so no two purposes share numbers.
constexpr uint64_t kGptDocs = 0x6770742d646f6373ull, kGptSamples = 0x6770742d736d706cull;
constexpr uint64_t kChunkTargets = 0x6368756e6b2d7467ull, kChunkOrder = 0x6368756e6b2d6f72ull;
constexpr uint64_t kBertSample = 0x626572742d736d70ull, kT5Sample = 0x74352d73616d706cull;

void check_range(const IndexedDataset& ds, const DocumentRange& docs) {
  if (docs.begin > docs.end || docs.end > ds.num_documents())
    fail(ds.prefix().string(), ": document range [", docs.begin, ", ", docs.end, ") is outside the dataset's ",
         ds.num_documents(), " documents");
}

// Copies `count` tokens of document d starting at token `offset` (across its sequences).
void read_document(const IndexedDataset& ds, size_t d, uint64_t offset, uint64_t count, int32_t* out,
                   int64_t vocab) {
  auto s = static_cast<size_t>(ds.document_index(d));
  const auto end = static_cast<size_t>(ds.document_index(d + 1));
  for (; s < end && count > 0; ++s) {
    const auto len = static_cast<uint64_t>(ds.sequence_length(s));
    if (offset >= len) {
      offset -= len;
      continue;
    }
    const uint64_t take = std::min(len - offset, count);
    ds.read(s, offset, take, out, vocab);
    out += take;
    count -= take;
    offset = 0;
  }
  if (count > 0) fail(ds.prefix().string(), ": internal: read past the end of document ", d);
}

// Per-epoch permutation of [0, n), cached for the last epoch asked.
std::vector<uint32_t> epoch_permutation(uint64_t n, uint64_t seed, uint64_t tag, uint64_t epoch) {
  std::vector<uint32_t> p(n);
  std::iota(p.begin(), p.end(), 0u);
  PhiloxStream rng(mix_key(seed, tag), epoch);
  philox_shuffle(p.data(), n, rng);
  return p;
}

// Position `index` of the epoch-shuffled chunk order. The permutation is a function of
// (n, seed, epoch); the last one asked is kept per thread.
uint32_t chunk_order(uint64_t seed, uint64_t n, uint64_t index) {
  thread_local uint64_t cached_epoch = ~uint64_t{0}, cached_seed = 0;
  thread_local std::vector<uint32_t> perm;
  const uint64_t e = index / n;
  if (cached_epoch != e || cached_seed != seed || perm.size() != n) {
    perm = epoch_permutation(n, seed, kChunkOrder, e);
    cached_epoch = e;
    cached_seed = seed;
  }
  return perm[index % n];
}

// Megatron's grouping of a document's sentences into chunks of about `max_target`
// tokens (shorter with probability short_prob); documents with fewer than min_sentences
// sentences are skipped. Counts in `use` the documents' text and what the chunks take of it.
std::vector<SentenceChunk> build_chunks(const IndexedDataset& ds, DocumentRange docs, uint32_t max_target,
                                        double short_prob, uint32_t min_sentences, uint64_t seed,
                                        ChunkedSamples::TextUse& use) {
  std::vector<SentenceChunk> out;
  use = {};
  for (size_t d = docs.begin; d < docs.end; ++d) {
    const auto first = static_cast<uint32_t>(ds.document_index(d));
    const auto end = static_cast<uint32_t>(ds.document_index(d + 1));
    use.sequences += end - first;
    if (end - first < min_sentences) {
      for (uint32_t s = first; s < end; ++s) use.tokens += static_cast<uint64_t>(ds.sequence_length(s));
      continue;
    }
    PhiloxStream rng(mix_key(seed, kChunkTargets), d);
    auto target = [&] {
      return (short_prob > 0 && rng.uniform() < short_prob && max_target > 2)
                 ? static_cast<uint32_t>(2 + rng.below(max_target - 1))
                 : max_target;
    };
    uint32_t start = first, nsent = 0, t = target();
    uint64_t len = 0;
    for (uint32_t s = first; s < end; ++s) {
      len += static_cast<uint64_t>(ds.sequence_length(s));
      ++nsent;
      const uint32_t remaining = end - s - 1;
      if ((len >= t && remaining > 1 && nsent >= min_sentences) || remaining == 0) {
        if (nsent >= min_sentences && len > 0) {
          out.push_back({start, s + 1, t});
          use.taken += std::min<uint64_t>(len, t);  // a sample cuts off what is past its target
        }
        use.tokens += len;
        start = s + 1;
        len = 0;
        nsent = 0;
        t = target();
      }
    }
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- GPT

GptSamples::GptSamples(std::shared_ptr<const IndexedDataset> ds, DocumentRange docs, int seq_length, uint64_t seed,
                       int64_t vocab_size)
    : ds_(std::move(ds)), docs_(docs), seq_length_(seq_length), seed_(seed), vocab_size_(vocab_size) {
  check_range(*ds_, docs_);
  if (seq_length_ < 1) fail("GPT samples: seq_length must be positive, got ", seq_length_);
  uint64_t total = 0;
  for (size_t d = docs_.begin; d < docs_.end; ++d) {
    uint64_t n = 0;
    for (auto s = static_cast<size_t>(ds_->document_index(d)); s < static_cast<size_t>(ds_->document_index(d + 1)); ++s)
      n += static_cast<uint64_t>(ds_->sequence_length(s));
    doc_tokens_.push_back(n);
    total += n;
  }
  if (total < static_cast<uint64_t>(seq_length_) + 1)
    fail(ds_->prefix().string(), ": the selected ", docs_.end - docs_.begin, " documents hold ", total,
         " tokens; one GPT sample of sequence length ", seq_length_, " needs ", seq_length_ + 1,
         ". Use a shorter --seq-length or a larger dataset (or split)");
  samples_per_epoch_ = (total - 1) / static_cast<uint64_t>(seq_length_);
  if (samples_per_epoch_ > UINT32_MAX) fail(ds_->prefix().string(), ": more than 2^32 samples per epoch");
}

const GptSamples::Epoch& GptSamples::epoch(uint64_t e) const {
  if (cached_.number == e) return cached_;
  Epoch ep;
  ep.number = e;
  ep.doc_order = epoch_permutation(doc_tokens_.size(), seed_, kGptDocs, e);
  ep.doc_start.resize(ep.doc_order.size() + 1);
  uint64_t off = 0;
  for (size_t i = 0; i < ep.doc_order.size(); ++i) {
    ep.doc_start[i] = off;
    off += doc_tokens_[ep.doc_order[i]];
  }
  ep.doc_start.back() = off;
  ep.sample_order = epoch_permutation(samples_per_epoch_, seed_, kGptSamples, e);
  cached_ = std::move(ep);
  return cached_;
}

void GptSamples::get(uint64_t index, int32_t* tokens) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Epoch& ep = epoch(index / samples_per_epoch_);
  uint64_t pos = static_cast<uint64_t>(ep.sample_order[index % samples_per_epoch_]) * static_cast<uint64_t>(seq_length_);
  uint64_t need = static_cast<uint64_t>(seq_length_) + 1;
  // First document whose span contains pos.
  size_t i = static_cast<size_t>(std::upper_bound(ep.doc_start.begin(), ep.doc_start.end(), pos) - ep.doc_start.begin()) - 1;
  while (need > 0) {
    if (i >= ep.doc_order.size()) fail(ds_->prefix().string(), ": internal: GPT sample ", index, " runs past the data");
    const uint64_t in_doc = pos - ep.doc_start[i];
    const uint64_t take = std::min(need, doc_tokens_[ep.doc_order[i]] - in_doc);
    read_document(*ds_, docs_.begin + ep.doc_order[i], in_doc, take, tokens, vocab_size_);
    tokens += take;
    need -= take;
    pos += take;
    ++i;
  }
}

// ---------------------------------------------------------------- BERT and T5

ChunkedSamples::ChunkedSamples(std::shared_ptr<const IndexedDataset> ds, DocumentRange docs,
                               const SpecialTokens& special, int64_t vocab_size, uint64_t seed)
    : ds_(std::move(ds)), special_(special), vocab_size_(vocab_size), seed_(seed) {
  check_range(*ds_, docs);
}

const SentenceChunk& ChunkedSamples::chunk(uint64_t index, std::vector<std::vector<int32_t>>& out) const {
  const SentenceChunk& c = chunks_[chunk_order(seed_, chunks_.size(), index)];
  out.resize(c.end - c.first);
  for (uint32_t s = c.first; s < c.end; ++s) out[s - c.first] = ds_->sequence(s, vocab_size_);
  return c;
}

namespace {

// A word: the positions [first, end) of a piece and the "##" pieces after it.
struct Word {
  uint32_t first, end;
};

// The words of `positions` (ascending) of `tokens`: runs of positions, each continuing piece
// joining the word just before it.
std::vector<Word> words_of(const std::vector<uint32_t>& positions, const int32_t* tokens,
                           const std::vector<uint8_t>& continues) {
  std::vector<Word> words;
  for (const uint32_t pos : positions) {
    const auto id = static_cast<size_t>(tokens[pos]);
    if (id < continues.size() && continues[id] && !words.empty() && words.back().end == pos)
      words.back().end = pos + 1;
    else
      words.push_back({pos, pos + 1});
  }
  return words;
}

// How an n-gram's n is drawn: BERT's, 1 to 3 with probability proportional to 1/n; T5's, a
// geometric distribution (p = 0.2) cut to 10 (SpanBERT's).
enum class NgramLengths { kBert, kT5 };

int draw_ngram_words(NgramLengths lengths, PhiloxStream& rng) {
  const double u = rng.uniform();
  if (lengths == NgramLengths::kBert) return u * 11 < 6 ? 1 : u * 11 < 9 ? 2 : 3;  // 6/11, 3/11, 2/11
  // P(n) = 0.8^(n-1) 0.2: the smallest n with 1 - 0.8^n > u
  const double n = std::floor(std::log1p(-u) / std::log(0.8)) + 1;
  return static_cast<int>(std::min(n, 10.0));
}

// Megatron's choice of masked n-grams: the words in a random order, each the first of an
// n-gram of n words (fewer at the end), shortened word by word until `fits(tokens, spans)` (the
// tokens and the n-grams masked with it), or left out when no length fits or a word of it is
// masked already; until `limit` tokens are masked. Each chosen n-gram [w, w_end) of words goes
// to `take` as it is chosen.
template <typename Fits, typename Take>
void choose_ngrams(const std::vector<Word>& words, NgramLengths lengths, double limit, PhiloxStream& rng,
                   const Fits& fits, const Take& take) {
  std::vector<uint32_t> order(words.size());
  std::iota(order.begin(), order.end(), 0u);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[static_cast<size_t>(rng.below(i))]);
  std::vector<uint8_t> taken(words.size(), 0);
  size_t masked = 0, spans = 0;
  for (const uint32_t w : order) {
    if (static_cast<double>(masked) >= limit) break;
    size_t w_end = std::min(words.size(), static_cast<size_t>(w) + static_cast<size_t>(draw_ngram_words(lengths, rng)));
    size_t count = 0;
    for (; w_end > w; --w_end) {
      count = 0;
      for (size_t k = w; k < w_end; ++k) count += words[k].end - words[k].first;
      if (static_cast<double>(masked + count) <= limit && fits(masked + count, spans + 1)) break;
    }
    if (w_end == w || std::any_of(taken.begin() + w, taken.begin() + static_cast<std::ptrdiff_t>(w_end),
                                  [](uint8_t t) { return t != 0; }))
      continue;
    std::fill(taken.begin() + w, taken.begin() + static_cast<std::ptrdiff_t>(w_end), 1);
    masked += count;
    ++spans;
    take(static_cast<size_t>(w), w_end);
  }
}

}  // namespace

double megatron_mask_count(double p, size_t tokens, size_t target) {
  return std::min(p * static_cast<double>(target),
                  std::max(1.0, static_cast<double>(std::lround(p * static_cast<double>(tokens)))));
}

// ---------------------------------------------------------------- BERT

BertSamples::BertSamples(std::shared_ptr<const IndexedDataset> ds, DocumentRange docs, const BertOptions& o,
                         const SpecialTokens& special, int64_t vocab_size, uint64_t seed)
    : ChunkedSamples(std::move(ds), docs, special, vocab_size, seed), opt_(o) {
  if (o.seq_length < 5) fail("BERT samples: seq_length must be at least 5, got ", o.seq_length);
  if (special.cls < 0 || special.sep < 0 || special.mask < 0 || special.pad < 0)
    fail("BERT samples need [CLS], [SEP], [MASK] and [PAD]; use a WordPiece tokenizer (BertWordPieceLowerCase)");
  chunks_ = build_chunks(*ds_, docs, static_cast<uint32_t>(o.seq_length - 3), o.short_seq_prob, o.binary_head ? 2 : 1,
                         seed, use_);
  if (chunks_.empty())
    fail(ds_->prefix().string(), ": no BERT sample can be built from the selected ", docs.end - docs.begin,
         " documents (each needs ", o.binary_head ? "at least 2 sentences" : "a sentence",
         "); build the dataset with --split-sentences, or use more data");
}

void BertSamples::get(uint64_t index, BertSample& out) const {
  std::vector<std::vector<int32_t>> sent;
  const SentenceChunk& c = chunk(index, sent);
  PhiloxStream rng(mix_key(seed_, kBertSample), index);
  const size_t ns = sent.size();
  size_t a_end = 1;
  if (ns >= 3) a_end = 1 + static_cast<size_t>(rng.below(ns - 1));
  std::vector<int32_t> a, b;
  for (size_t i = 0; i < ns; ++i) (i < a_end ? a : b).insert((i < a_end ? a : b).end(), sent[i].begin(), sent[i].end());
  out.is_random = 0;
  if (opt_.binary_head && rng.uniform() < 0.5) {
    std::swap(a, b);
    out.is_random = 1;
  }
  // Truncate the longer segment, from the front or the back at random, to the target.
  const size_t target = c.target;
  size_t a0 = 0, a1 = a.size(), b0 = 0, b1 = b.size();
  while ((a1 - a0) + (b1 - b0) > target) {
    const bool cut_a = (a1 - a0) > (b1 - b0);
    const bool front = rng.uniform() < 0.5;
    if (cut_a) (front ? ++a0 : --a1);
    else (front ? ++b0 : --b1);
  }
  const auto seq = static_cast<size_t>(opt_.seq_length);
  out.tokens.assign(seq, special_.pad);
  out.token_types.assign(seq, 0);
  out.labels.assign(seq, -1);
  out.loss_mask.assign(seq, 0);
  out.padding_mask.assign(seq, 0);
  std::vector<uint32_t> candidates;
  size_t p = 0;
  out.tokens[p++] = special_.cls;
  for (size_t i = a0; i < a1; ++i) candidates.push_back(static_cast<uint32_t>(p)), out.tokens[p++] = a[i];
  out.tokens[p++] = special_.sep;
  if (b1 > b0 || opt_.binary_head) {
    const size_t b_start = p;
    for (size_t i = b0; i < b1; ++i) candidates.push_back(static_cast<uint32_t>(p)), out.tokens[p++] = b[i];
    out.tokens[p++] = special_.sep;
    for (size_t i = b_start; i < p; ++i) out.token_types[i] = 1;
  }
  for (size_t i = 0; i < p; ++i) out.padding_mask[i] = 1;
  // 80% [MASK], 10% a random token, 10% unchanged
  auto mask = [&](uint32_t pos) {
    out.labels[pos] = out.tokens[pos];
    out.loss_mask[pos] = 1;
    const double r = rng.uniform();
    if (r < 0.8)
      out.tokens[pos] = special_.mask;
    else if (r >= 0.9)
      out.tokens[pos] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab_size_)));
  };
  if (opt_.whole_words.on) {
    const std::vector<Word> words = words_of(candidates, out.tokens.data(), opt_.whole_words.word_continues);
    choose_ngrams(
        words, NgramLengths::kBert, megatron_mask_count(opt_.masked_lm_prob, p, target), rng,
        [](size_t, size_t) { return true; },
        [&](size_t w, size_t w_end) {
          for (size_t k = w; k < w_end; ++k)
            for (uint32_t pos = words[k].first; pos < words[k].end; ++pos) mask(pos);
        });
    return;
  }
  // Mask round(masked_lm_prob) of the real tokens (at least one).
  const auto k = std::min<size_t>(
      candidates.size(), std::max<size_t>(1, static_cast<size_t>(std::lround(static_cast<double>(candidates.size()) *
                                                                             opt_.masked_lm_prob))));
  for (size_t i = 0; i < k; ++i) {  // partial Fisher-Yates: the first k are the chosen
    const size_t j = i + static_cast<size_t>(rng.below(candidates.size() - i));
    std::swap(candidates[i], candidates[j]);
    mask(candidates[i]);
  }
}

// ---------------------------------------------------------------- T5

std::vector<int32_t> random_segmentation(int32_t n, int32_t k, PhiloxStream& rng) {
  // Choose k-1 distinct cut points among the n-1 gaps between items.
  std::vector<int32_t> gaps(static_cast<size_t>(n - 1));
  std::iota(gaps.begin(), gaps.end(), 1);
  for (int32_t i = 0; i < k - 1; ++i) {
    const auto j = static_cast<size_t>(i) + static_cast<size_t>(rng.below(static_cast<uint64_t>(n - 1 - i)));
    std::swap(gaps[static_cast<size_t>(i)], gaps[j]);
  }
  std::vector<int32_t> cuts(gaps.begin(), gaps.begin() + (k - 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int32_t> lengths;
  int32_t prev = 0;
  for (const int32_t c : cuts) lengths.push_back(c - prev), prev = c;
  lengths.push_back(n - prev);
  return lengths;
}

namespace {
void t5_counts(int32_t n, const T5Options& o, int32_t& noise, int32_t& spans) {
  noise = static_cast<int32_t>(std::lround(static_cast<double>(n) * o.noise_density));
  noise = std::clamp(noise, 1, std::max(1, n - 1));
  spans = std::max(1, static_cast<int32_t>(std::lround(static_cast<double>(noise) / o.mean_span_length)));
  spans = std::min({spans, noise, std::max(1, n - noise)});
}
}  // namespace

T5Fit t5_fit(const T5Options& o, int32_t sentinels) {
  T5Fit fit;
  for (int32_t n = 2; n <= 4 * o.encoder_seq_length; ++n) {
    T5Fit f{n, 0, 0};
    t5_counts(n, o, f.noise, f.spans);
    if (f.encoder() <= o.encoder_seq_length && f.decoder() <= o.decoder_seq_length && f.spans <= sentinels) fit = f;
  }
  return fit;
}

T5Samples::T5Samples(std::shared_ptr<const IndexedDataset> ds, DocumentRange docs, const T5Options& o,
                     const SpecialTokens& special, int64_t vocab_size, uint64_t seed)
    : ChunkedSamples(std::move(ds), docs, special, vocab_size, seed), opt_(o) {
  if (special.bos < 0 || special.eos < 0 || special.pad < 0 || special.num_sentinels < 1)
    fail("T5 samples need [BOS], [EOS], [PAD] and sentinel tokens; use a WordPiece tokenizer with "
         "--vocab-extra-ids 100");
  if (o.whole_words.on) {
    // Megatron's: the encoder's length less 2 (its room for a [BOS] and an [EOS]); a span needs
    // 3 decoder positions (its sentinel, a token, [EOS])
    if (o.encoder_seq_length < 3 || o.decoder_seq_length < 3)
      fail("T5 samples: encoder length ", o.encoder_seq_length, " and decoder length ", o.decoder_seq_length,
           " leave no room for a corrupted span (each needs 3 or more)");
    max_raw_ = o.encoder_seq_length - 2;
  } else {
    max_raw_ = t5_fit(o, special.num_sentinels).raw;
    if (max_raw_ < 2)
      fail("T5 samples: encoder length ", o.encoder_seq_length, " and decoder length ", o.decoder_seq_length,
           " leave no room for a corrupted span at --mask-prob ", o.noise_density,
           "; increase --decoder-seq-length (or lower --mask-prob)");
  }
  chunks_ = build_chunks(*ds_, docs, static_cast<uint32_t>(max_raw_), o.short_seq_prob, 1, seed, use_);
  if (chunks_.empty())
    fail(ds_->prefix().string(), ": no T5 sample can be built from the selected ", docs.end - docs.begin,
         " documents (all empty); use more data");
}

void T5Samples::corrupt_spans(const std::vector<int32_t>& tokens, PhiloxStream& rng, std::vector<int32_t>& e,
                              std::vector<int32_t>& t, T5Sample& out) const {
  const auto len = static_cast<int32_t>(tokens.size());
  if (len < 2) {  // a one-token chunk: nothing to corrupt
    e = tokens;
    return;
  }
  int32_t noise, spans;
  t5_counts(len, opt_, noise, spans);
  const auto noise_len = random_segmentation(noise, spans, rng);
  const auto keep_len = random_segmentation(len - noise, spans, rng);
  auto pos = tokens.begin();
  for (int32_t k = 0; k < spans; ++k) {
    e.insert(e.end(), pos, pos + keep_len[static_cast<size_t>(k)]);
    pos += keep_len[static_cast<size_t>(k)];
    e.push_back(special_.sentinel(k));
    t.push_back(special_.sentinel(k));
    t.insert(t.end(), pos, pos + noise_len[static_cast<size_t>(k)]);
    pos += noise_len[static_cast<size_t>(k)];
  }
  out.num_spans = spans;
  out.num_noise_tokens = noise;
}

void T5Samples::corrupt_whole_words(const std::vector<int32_t>& tokens, size_t chunk_target, PhiloxStream& rng,
                                    std::vector<int32_t>& e, std::vector<int32_t>& t, T5Sample& out) const {
  std::vector<uint32_t> positions(tokens.size());
  std::iota(positions.begin(), positions.end(), 0u);
  const std::vector<Word> words = words_of(positions, tokens.data(), opt_.whole_words.word_continues);
  const double limit = megatron_mask_count(opt_.noise_density, tokens.size(), chunk_target);
  // the decoder's target holds each span's sentinel and tokens, then [EOS]
  const auto sentinels = static_cast<size_t>(special_.num_sentinels);
  const auto decoder = static_cast<size_t>(opt_.decoder_seq_length);
  const auto fits = [&](size_t masked, size_t spans) { return spans <= sentinels && masked + spans + 1 <= decoder; };
  std::vector<Word> spans;  // [first, end) positions
  choose_ngrams(words, NgramLengths::kT5, limit, rng, fits, [&](size_t w, size_t w_end) {
    spans.push_back({words[w].first, words[w_end - 1].end});
  });
  std::sort(spans.begin(), spans.end(), [](const Word& a, const Word& b) { return a.first < b.first; });
  uint32_t at = 0;
  for (size_t k = 0; k < spans.size(); ++k) {
    const auto sentinel = special_.sentinel(static_cast<int32_t>(k));
    e.insert(e.end(), tokens.begin() + at, tokens.begin() + spans[k].first);
    e.push_back(sentinel);
    t.push_back(sentinel);
    t.insert(t.end(), tokens.begin() + spans[k].first, tokens.begin() + spans[k].end);
    out.num_noise_tokens += static_cast<int32_t>(spans[k].end - spans[k].first);
    at = spans[k].end;
  }
  e.insert(e.end(), tokens.begin() + at, tokens.end());
  out.num_spans = static_cast<int32_t>(spans.size());
}

void T5Samples::get(uint64_t index, T5Sample& out) const {
  std::vector<std::vector<int32_t>> sent;
  const SentenceChunk& c = chunk(index, sent);
  PhiloxStream rng(mix_key(seed_, kT5Sample), index);
  std::vector<int32_t> tokens;
  for (const auto& s : sent) tokens.insert(tokens.end(), s.begin(), s.end());
  tokens.resize(std::min<size_t>(tokens.size(), std::min<size_t>(c.target, static_cast<size_t>(max_raw_))));

  const auto enc = static_cast<size_t>(opt_.encoder_seq_length), dec = static_cast<size_t>(opt_.decoder_seq_length);
  out.encoder_tokens.assign(enc, special_.pad);
  out.decoder_input.assign(dec, special_.pad);
  out.decoder_target.assign(dec, special_.pad);
  out.encoder_mask.assign(enc, 0);
  out.decoder_mask.assign(dec, 0);
  out.loss_mask.assign(dec, 0);
  out.raw_length = static_cast<int32_t>(tokens.size());
  out.num_spans = 0;
  out.num_noise_tokens = 0;
  std::vector<int32_t> e, t;
  if (opt_.whole_words.on)
    corrupt_whole_words(tokens, c.target, rng, e, t, out);
  else
    corrupt_spans(tokens, rng, e, t, out);
  t.push_back(special_.eos);
  if (e.size() > enc || t.size() > dec) fail("internal: T5 sample ", index, " exceeds the sequence lengths");
  std::copy(e.begin(), e.end(), out.encoder_tokens.begin());
  std::fill(out.encoder_mask.begin(), out.encoder_mask.begin() + static_cast<ptrdiff_t>(e.size()), 1);
  out.decoder_input[0] = special_.bos;
  std::copy(t.begin(), t.end() - 1, out.decoder_input.begin() + 1);
  std::copy(t.begin(), t.end(), out.decoder_target.begin());
  std::fill(out.decoder_mask.begin(), out.decoder_mask.begin() + static_cast<ptrdiff_t>(t.size()), 1);
  std::fill(out.loss_mask.begin(), out.loss_mask.begin() + static_cast<ptrdiff_t>(t.size()), 1);
}

}  // namespace megabatch::data
