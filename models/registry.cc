#include "models/registry.h"

#include <algorithm>

#include "core/util/error.h"
#include "core/util/numbers.h"
#include "models/bert.h"
#include "models/gpt.h"
#include "models/t5.h"
#include "models/transformer.h"

namespace megabatch::models {

std::unique_ptr<train::Model> declare_model(const ModelConfig& config, comm::Communicator& tp) {
  if (config.family == "gpt") return std::make_unique<Gpt>(config, tp);
  if (config.family == "bert") return std::make_unique<Bert>(config, tp);
  if (config.family == "t5") return std::make_unique<T5>(config, tp);
  fail("model family '", config.family, "' is not available (gpt, bert, t5)");
}

std::unique_ptr<train::Model> make_model(const ModelConfig& config, comm::Communicator& tp, uint64_t seed, DType dtype,
                                         Device device) {
  std::unique_ptr<train::Model> m = declare_model(config, tp);
  m->parameters().finalize(dtype, device);
  m->parameters().initialize(seed, config.init_method_xavier_uniform);
  return m;
}

void GptBatchSource::fill(uint64_t first, int64_t count, train::Batch& out) {
  out.batch = count;
  out.seq = seq_;
  out.tokens.resize(count * seq_);
  out.labels.resize(count * seq_);
  out.padding_mask.clear();
  out.position_ids.resize(ends_.reset_positions ? static_cast<size_t>(count * seq_) : 0);
  out.documents.resize(ends_.reset_attention ? static_cast<size_t>(count * seq_) : 0);
  const bool any = ends_.mask_loss || ends_.reset_positions || ends_.reset_attention;
  window_.resize(seq_ + 1);
  for (int64_t b = 0; b < count; ++b) {
    samples_.get(first + static_cast<uint64_t>(b), window_.data());
    std::copy(window_.begin(), window_.end() - 1, out.tokens.begin() + b * seq_);
    std::copy(window_.begin() + 1, window_.end(), out.labels.begin() + b * seq_);
    if (!any) continue;
    for (int t = 0, start = 0, doc = 0; t < seq_; ++t) {
      const size_t at = static_cast<size_t>(b * seq_ + t);
      const bool end = window_[static_cast<size_t>(t)] == ends_.eod;
      if (ends_.mask_loss && end) out.labels[at] = train::kIgnoreLabel;  // Megatron's loss mask
      if (ends_.reset_positions) out.position_ids[at] = t - start;
      if (ends_.reset_attention) out.documents[at] = doc;
      if (end) start = t + 1, ++doc;
    }
  }
}

BertBatchSource::BertBatchSource(std::shared_ptr<const data::IndexedDataset> ds, data::DocumentRange docs,
                                 const data::BertOptions& options, const data::SpecialTokens& special,
                                 int64_t vocab_size, uint64_t seed)
    : samples_(std::move(ds), docs, options, special, vocab_size, seed), seq_(options.seq_length) {}

void BertBatchSource::fill(uint64_t first, int64_t count, train::Batch& out) {
  const size_t T = static_cast<size_t>(seq_);
  out.batch = count;
  out.seq = seq_;
  for (auto* v : {&out.tokens, &out.labels, &out.token_types}) v->resize(static_cast<size_t>(count) * T);
  out.padding_mask.resize(static_cast<size_t>(count) * T);
  out.sample_labels.resize(static_cast<size_t>(count));
  for (int64_t b = 0; b < count; ++b) {
    samples_.get(first + static_cast<uint64_t>(b), sample_);
    const size_t at = static_cast<size_t>(b) * T;
    std::copy(sample_.tokens.begin(), sample_.tokens.end(), out.tokens.begin() + at);
    std::copy(sample_.token_types.begin(), sample_.token_types.end(), out.token_types.begin() + at);
    std::copy(sample_.padding_mask.begin(), sample_.padding_mask.end(), out.padding_mask.begin() + at);
    for (size_t t = 0; t < T; ++t) out.labels[at + t] = sample_.loss_mask[t] ? sample_.labels[t] : train::kIgnoreLabel;
    out.sample_labels[static_cast<size_t>(b)] = sample_.is_random;
  }
}

namespace {
// BertBatchSource's and T5BatchSource's unused_text_warning: `longest` is the most text a sample takes.
std::string unused_text(const char* family, const data::ChunkedSamples::TextUse& u, int64_t longest,
                        const char* too_short) {
  if (u.tokens == 0 || 2 * u.taken >= u.tokens) return "";
  const auto n = [](uint64_t x) { return std::to_string(x); };
  const uint64_t mean = u.tokens / std::max<uint64_t>(u.sequences, 1);
  std::string out = std::string(family) + " samples take " + n(100 * u.taken / u.tokens) + "% of the " + n(u.tokens) +
                    " tokens of their documents: a sample takes a document's sequences up to " + n(longest) +
                    " tokens and cuts off the rest of its last one, and these sequences average " + n(mean) + " tokens";
  if (mean > static_cast<uint64_t>(longest))
    return out +
           ": whole documents, not sentences. Make the dataset with preprocess --split-sentences, as Megatron's BERT "
           "and T5 expect";
  return out + "; " + too_short;
}
}  // namespace

std::string BertBatchSource::unused_text_warning() const {
  return unused_text("BERT", samples_.text_use(), seq_ - 3,
                     "most documents hold too few sentences for a sample (a sentence pair needs 2; "
                     "--bert-no-binary-head takes 1)");
}

std::string T5BatchSource::unused_text_warning() const {
  return unused_text("T5", samples_.text_use(), samples_.max_raw_length(),
                     "they are long beside a sample: a longer --seq-length (or --decoder-seq-length) takes more");
}

T5BatchSource::T5BatchSource(std::shared_ptr<const data::IndexedDataset> ds, data::DocumentRange docs,
                             const data::T5Options& options, const data::SpecialTokens& special, int64_t vocab_size,
                             uint64_t seed)
    : samples_(std::move(ds), docs, options, special, vocab_size, seed),
      enc_(options.encoder_seq_length),
      dec_(options.decoder_seq_length) {}

void T5BatchSource::fill(uint64_t first, int64_t count, train::Batch& out) {
  const size_t Te = static_cast<size_t>(enc_), Td = static_cast<size_t>(dec_), n = static_cast<size_t>(count);
  out.batch = count;
  out.seq = enc_;
  out.decoder_seq = dec_;
  out.tokens.resize(n * Te);
  out.padding_mask.resize(n * Te);
  out.decoder_tokens.resize(n * Td);
  out.decoder_padding_mask.resize(n * Td);
  out.labels.resize(n * Td);
  out.token_types.clear();
  out.sample_labels.clear();
  for (size_t b = 0; b < n; ++b) {
    samples_.get(first + b, sample_);
    std::copy(sample_.encoder_tokens.begin(), sample_.encoder_tokens.end(), out.tokens.begin() + b * Te);
    std::copy(sample_.encoder_mask.begin(), sample_.encoder_mask.end(), out.padding_mask.begin() + b * Te);
    std::copy(sample_.decoder_input.begin(), sample_.decoder_input.end(), out.decoder_tokens.begin() + b * Td);
    std::copy(sample_.decoder_mask.begin(), sample_.decoder_mask.end(), out.decoder_padding_mask.begin() + b * Td);
    for (size_t t = 0; t < Td; ++t)
      out.labels[b * Td + t] = sample_.loss_mask[t] ? sample_.decoder_target[t] : train::kIgnoreLabel;
  }
}

namespace {
// Megatron's whole-word masking where `on`: a word's pieces are those after it that start with "##"
data::WholeWordMasking whole_words(bool on, const data::Tokenizer& tokenizer) {
  data::WholeWordMasking w;
  w.on = on;
  if (on) {
    w.word_continues.resize(static_cast<size_t>(tokenizer.vocab_size()));
    for (int32_t id = 0; id < static_cast<int32_t>(tokenizer.vocab_size()); ++id)
      w.word_continues[static_cast<size_t>(id)] = tokenizer.token_text(id).rfind("##", 0) == 0;
  }
  return w;
}

// (the words of whole-word masking are only found where `tokenizer` is given)
data::T5Options t5_options(const ModelConfig& c, const data::Tokenizer* tokenizer = nullptr) {
  data::T5Options o;
  o.encoder_seq_length = static_cast<int>(c.seq_length);
  o.decoder_seq_length = static_cast<int>(c.decoder_seq());
  o.noise_density = c.mask_prob;
  o.short_seq_prob = c.short_seq_prob;
  if (tokenizer) o.whole_words = whole_words(c.t5_masking == "whole-word", *tokenizer);
  return o;
}
}  // namespace

std::string sample_fill_warning(const ModelConfig& c, const data::Tokenizer& tokenizer) {
  if (c.family != "t5") return "";
  const auto n = [](int64_t x) { return std::to_string(x); };
  if (c.t5_masking == "whole-word") {
    // a full sample: encoder length - 2 tokens, of them at most floor(min(p x that, round(p x that)))
    // masked; each span takes a sentinel more in the decoder, and [EOS] one
    const int64_t text = c.seq_length - 2;
    const auto most = static_cast<int64_t>(
        data::megatron_mask_count(c.mask_prob, static_cast<size_t>(text), static_cast<size_t>(text)));
    if (most + 2 <= c.decoder_seq()) return "";
    return "T5 whole-word masking at --mask-prob " + shortest(c.mask_prob) + " masks up to " + n(most) +
           " of a sample's " + n(text) + " tokens, but the decoder's " + n(c.decoder_seq()) +
           " positions hold at most " + n(c.decoder_seq() - 2) +
           " of them (with a sentinel per span and [EOS]), so fewer are masked. Raise "
           "--decoder-seq-length past " +
           n(most + 1) + " (a position more per span), or lower --mask-prob";
  }
  data::T5Options o = t5_options(c);
  const int32_t sentinels = tokenizer.special().num_sentinels;
  const data::T5Fit fit = data::t5_fit(o, sentinels);
  o.decoder_seq_length = 8 * o.encoder_seq_length;  // the decoder unbounded: what fills the encoder
  const data::T5Fit full = data::t5_fit(o, sentinels);
  if (fit.raw < 2 || 4 * fit.encoder() >= 3 * o.encoder_seq_length) return "";
  return "T5 samples at --mask-prob " + shortest(c.mask_prob) + " take at most " + n(fit.raw) + " tokens of text (" +
         n(fit.noise) + " corrupted, in " + n(fit.spans) + " spans), whose targets fill the decoder's " +
         n(c.decoder_seq()) + " positions but only " + n(fit.encoder()) + " of the encoder's " +
         n(o.encoder_seq_length) + ": the rest is padding. " +
         (4 * full.encoder() >= 3 * o.encoder_seq_length
              ? "--decoder-seq-length " + n(full.decoder()) + " fills " + n(full.encoder()) + " (with " + n(full.raw) +
                    " tokens of text), or lower --mask-prob"
              : std::string("Lower --mask-prob"));
}

std::unique_ptr<train::BatchSource> make_batch_source(const ModelConfig& c, std::shared_ptr<const data::IndexedDataset> ds,
                                                      data::DocumentRange docs, const data::Tokenizer& tokenizer,
                                                      uint64_t seed) {
  const int seq = static_cast<int>(c.seq_length);
  if (c.family == "t5")
    return std::make_unique<T5BatchSource>(std::move(ds), docs, t5_options(c, &tokenizer), tokenizer.special(),
                                           tokenizer.vocab_size(), seed);
  if (c.family == "bert") {
    data::BertOptions o;
    o.seq_length = seq;
    o.binary_head = c.binary_head;
    o.masked_lm_prob = c.mask_prob;
    o.short_seq_prob = c.short_seq_prob;
    o.whole_words = whole_words(c.bert_masking == "whole-word", tokenizer);
    return std::make_unique<BertBatchSource>(std::move(ds), docs, o, tokenizer.special(), tokenizer.vocab_size(), seed);
  }
  for (const auto& [on, flag] : {std::pair{c.eod_mask_loss, "--eod-mask-loss"},
                                 {c.reset_position_ids, "--reset-position-ids"},
                                 {c.reset_attention_mask, "--reset-attention-mask"}})
    check(!on || tokenizer.special().eod >= 0, flag, ": tokenizer ", tokenizer.type(), " has no end-of-document token");
  return std::make_unique<GptBatchSource>(
      std::move(ds), docs, seq, seed, c.padded_vocab_size(),
      GptDocumentEnds{tokenizer.special().eod, c.eod_mask_loss, c.reset_position_ids, c.reset_attention_mask});
}

bool uses_flash_attention(const ModelConfig& c, DType dtype, Device device) {
  return flash_attention_chosen(c.attention_backend, device, dtype, c.hidden_size / c.num_attention_heads);
}

train::ModelMemory model_memory(const ModelConfig& c, DType dtype, Device device) {
  const SizeReport r = size_report(c);
  // the head runs on the decoder's tokens (T5), on every token (GPT) or on the masked ones
  // (BERT: counted as every token, an upper bound)
  const int64_t head_rows = c.family == "t5" ? c.decoder_seq() : c.seq_length;
  const int64_t vocab = c.padded_vocab_size() / std::max<int64_t>(c.tensor_model_parallel_size, 1);
  const double row_bytes = static_cast<double>(vocab) * static_cast<double>(dtype_size(dtype));
  const int64_t most_rows = head_chunk_limit(vocab, dtype, device);
  return {r.parameters_per_rank,
          r.activation_bytes,
          r.attention_score_bytes,
          uses_flash_attention(c, dtype, device),
          static_cast<double>(head_rows) * row_bytes,
          static_cast<double>(most_rows) * row_bytes};
}

int64_t tokens_per_sample(const ModelConfig& c) { return c.seq_length + (c.family == "t5" ? c.decoder_seq() : 0); }

}  // namespace megabatch::models
