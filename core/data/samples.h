// Sample builders for GPT, BERT and T5 over Megatron indexed datasets.
//
// Every sample is a pure function of (dataset, documents, settings, seed, sample index):
// shuffles and masks draw from Philox streams keyed by the seed and the index, so a
// loader's whole state is the number of samples it has consumed, resuming is exact, and
// no result depends on thread count. Indices past one epoch continue into the next
// epoch with a new shuffle (and new masks).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "core/data/indexed_dataset.h"
#include "core/data/tokenizer.h"
#include "core/util/philox.h"

namespace megabatch::data {

// The documents [begin, end) of a dataset (a train/validation/test split).
struct DocumentRange {
  size_t begin = 0, end = 0;
  static DocumentRange all(const IndexedDataset& ds) { return {0, ds.num_documents()}; }
};

// ---------------------------------------------------------------- GPT

// Windows of seq_length + 1 tokens over the documents (each already ending with the
// end-of-document token when the dataset was built with --append-eod) joined in a
// per-epoch shuffled order; the windows of an epoch are then shuffled. Consecutive
// windows share one token (the label of the last position).
class GptSamples {
 public:
  GptSamples(std::shared_ptr<const IndexedDataset> ds, DocumentRange docs, int seq_length, uint64_t seed,
             int64_t vocab_size);
  uint64_t samples_per_epoch() const { return samples_per_epoch_; }
  int seq_length() const { return seq_length_; }
  // Writes the seq_length + 1 tokens of sample `index` (any index; epochs repeat).
  void get(uint64_t index, int32_t* tokens) const;

 private:
  struct Epoch {
    uint64_t number = ~uint64_t{0};
    std::vector<uint32_t> doc_order;   // document ids in stream order
    std::vector<uint64_t> doc_start;   // token offset of each doc_order entry, plus the total
    std::vector<uint32_t> sample_order;  // shuffled window indices
  };
  const Epoch& epoch(uint64_t e) const;
  std::shared_ptr<const IndexedDataset> ds_;
  DocumentRange docs_;
  int seq_length_;
  uint64_t seed_;
  int64_t vocab_size_;
  std::vector<uint64_t> doc_tokens_;  // tokens of each document in the range
  uint64_t samples_per_epoch_ = 0;
  mutable std::mutex mu_;
  mutable Epoch cached_;
};

// Consecutive sentences [first, end) of one document, grouped for one BERT or T5 sample
// with the target length drawn for it.
struct SentenceChunk {
  uint32_t first, end, target;
};

// The common part of BERT and T5 samples: sentence chunks served in an epoch-shuffled
// order, each sample's randomness keyed by its index.
class ChunkedSamples {
 public:
  uint64_t samples_per_epoch() const { return chunks_.size(); }
  // The documents' tokens and sequences, and the tokens one epoch of samples takes: a chunk's
  // sentences up to its target length, what is past it cut off. Most of the text where the
  // sequences are sentences; little where each is a whole document (a dataset made without
  // --split-sentences), or where documents are too short for a sample.
  struct TextUse {
    uint64_t tokens = 0, sequences = 0, taken = 0;
  };
  TextUse text_use() const { return use_; }

 protected:
  ChunkedSamples(std::shared_ptr<const IndexedDataset> ds, DocumentRange docs, const SpecialTokens& special,
                 int64_t vocab_size, uint64_t seed);
  // The chunk of sample `index`, its sentences read into `out` (ids checked against the vocabulary).
  const SentenceChunk& chunk(uint64_t index, std::vector<std::vector<int32_t>>& out) const;

  std::shared_ptr<const IndexedDataset> ds_;
  SpecialTokens special_;
  int64_t vocab_size_;
  uint64_t seed_;
  std::vector<SentenceChunk> chunks_;
  TextUse use_;
};

// Megatron's masking of BERT and T5 samples: whole words (a word's "##" pieces with it) in
// n-grams of words. It needs word_continues: 1 for each id whose piece continues the word
// before it ("##...").
struct WholeWordMasking {
  bool on = false;
  std::vector<uint8_t> word_continues;
};
// Megatron's count of the tokens its masking takes from a sample: p of its tokens (at least
// one), at most p of its target length.
double megatron_mask_count(double p, size_t tokens, size_t target);

// ---------------------------------------------------------------- BERT

struct BertOptions {
  int seq_length = 128;
  double short_seq_prob = 0.1;   // probability of a shorter target length
  double masked_lm_prob = 0.15;  // fraction of tokens predicted
  bool binary_head = true;       // sentence-order prediction (needs 2+ sentences)
  // Megatron's masking instead of per token: n-grams of 1 to 3 words, n drawn with
  // probability proportional to 1/n
  WholeWordMasking whole_words;
};

struct BertSample {
  std::vector<int32_t> tokens;        // [seq] [CLS] A [SEP] B [SEP] [PAD]...
  std::vector<int32_t> token_types;   // [seq] 0 for A (and [CLS], first [SEP]), 1 for B
  std::vector<int32_t> labels;        // [seq] original id at masked positions, -1 elsewhere
  std::vector<uint8_t> loss_mask;     // [seq] 1 at masked positions
  std::vector<uint8_t> padding_mask;  // [seq] 1 at real tokens
  int32_t is_random = 0;              // sentence-order label: 1 when A and B were swapped
};

// Sentence pairs as Megatron builds them: each document's sentences are grouped into
// chunks up to a target length (seq_length - 3, shorter with probability short_seq_prob);
// a chunk is split at a random sentence into A and B, swapped with probability 0.5, and
// truncated (randomly from the front or back of the longer part) to the target length;
// masked_lm_prob of the tokens (15%; at least one) are masked: 80% [MASK], 10% a random token,
// 10% unchanged. With whole_words, Megatron's rule instead: whole words in n-grams, taken
// in a random order of the words until the count min(p x target, max(1, round(p x tokens)))
// (tokens with [CLS] and the [SEP]s) is reached, an n-gram that would pass it shortened to
// fewer words, or left out (as one overlapping a masked one).
class BertSamples : public ChunkedSamples {
 public:
  BertSamples(std::shared_ptr<const IndexedDataset> ds, DocumentRange docs, const BertOptions& options,
              const SpecialTokens& special, int64_t vocab_size, uint64_t seed);
  void get(uint64_t index, BertSample& out) const;

 private:
  BertOptions opt_;
};

// ---------------------------------------------------------------- T5

struct T5Options {
  int encoder_seq_length = 512;
  int decoder_seq_length = 128;
  double noise_density = 0.15;      // fraction of tokens corrupted
  double mean_span_length = 3.0;    // mean length of a corrupted span
  double short_seq_prob = 0.1;
  // Megatron's corruption instead of T5's: each span an n-gram of whole words, n drawn from a
  // geometric distribution (p = 0.2, SpanBERT's) and cut to at most 10 words
  WholeWordMasking whole_words;
};

struct T5Sample {
  std::vector<int32_t> encoder_tokens;  // [enc] text with each span replaced by its sentinel
  std::vector<int32_t> decoder_input;   // [dec] [BOS] <extra_id_0> span0 <extra_id_1> span1 ...
  std::vector<int32_t> decoder_target;  // [dec] <extra_id_0> span0 <extra_id_1> span1 ... [EOS]
  std::vector<uint8_t> encoder_mask;    // [enc] 1 at real tokens
  std::vector<uint8_t> decoder_mask;    // [dec] 1 at real tokens
  std::vector<uint8_t> loss_mask;       // [dec] 1 where decoder_target is a real token
  int32_t num_spans = 0;
  int32_t num_noise_tokens = 0;
  int32_t raw_length = 0;               // tokens taken from the document
};

// Span corruption as in T5 (Raffel et al. 2020): of a chunk of n tokens, round(noise_density n)
// are corrupted in round(noise / 3) spans whose lengths (and the gaps between them) are
// a uniformly random composition; the longest n whose corrupted forms fit the encoder
// and decoder lengths is used. With whole_words, Megatron's instead: a chunk of up to
// encoder_seq_length - 2 tokens, corrupted by BertSamples' whole-word rule (words in a random
// order, each the start of an n-gram, to min(p x target, max(1, round(p x tokens))) tokens),
// each n-gram a span of its own; an n-gram whose span would overflow the decoder (with its
// sentinel and [EOS]) or need a sentinel more than there are is shortened or left out.
class T5Samples : public ChunkedSamples {
 public:
  T5Samples(std::shared_ptr<const IndexedDataset> ds, DocumentRange docs, const T5Options& options,
            const SpecialTokens& special, int64_t vocab_size, uint64_t seed);
  int max_raw_length() const { return max_raw_; }
  void get(uint64_t index, T5Sample& out) const;

 private:
  void corrupt_spans(const std::vector<int32_t>& tokens, PhiloxStream& rng, std::vector<int32_t>& encoder,
                     std::vector<int32_t>& target, T5Sample& out) const;
  void corrupt_whole_words(const std::vector<int32_t>& tokens, size_t chunk_target, PhiloxStream& rng,
                           std::vector<int32_t>& encoder, std::vector<int32_t>& target, T5Sample& out) const;
  T5Options opt_;
  int max_raw_ = 0;
};

// The longest chunk of text a T5 sample takes (raw tokens; 0 where none fits): its corrupted
// form, the kept tokens and a sentinel per span, fits the encoder, and its spans with their
// sentinels and [EOS] fit the decoder, in no more spans than there are sentinels.
struct T5Fit {
  int32_t raw = 0, noise = 0, spans = 0;  // tokens of text; of them corrupted; in spans
  int32_t encoder() const { return raw - noise + spans; }
  int32_t decoder() const { return noise + spans + 1; }
};
T5Fit t5_fit(const T5Options& options, int32_t sentinels);

// Splits n items into k non-empty segments uniformly at random (T5's random
// segmentation); returns the k lengths. Exposed for tests.
std::vector<int32_t> random_segmentation(int32_t n, int32_t k, PhiloxStream& rng);

// ---------------------------------------------------------------- loader

// Hands out consecutive sample indices in batches; its state is one number.
class SampleCursor {
 public:
  explicit SampleCursor(uint64_t consumed = 0) : consumed_(consumed) {}
  // The indices of the next batch: [consumed, consumed + n).
  uint64_t take(uint64_t n) {
    const uint64_t first = consumed_;
    consumed_ += n;
    return first;
  }
  uint64_t consumed() const { return consumed_; }  // save this to resume
  void seek(uint64_t consumed) { consumed_ = consumed; }

 private:
  uint64_t consumed_;
};

}  // namespace megabatch::data
