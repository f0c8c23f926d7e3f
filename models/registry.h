// Building a model by family, and the batch source that feeds it from the data layer.
#pragma once

#include <memory>

#include "core/comm/communicator.h"
#include "core/data/indexed_dataset.h"
#include "core/data/samples.h"
#include "core/data/tokenizer.h"
#include "core/train/memory_check.h"
#include "core/train/model.h"
#include "core/train/batch_source.h"
#include "models/presets.h"

namespace megabatch::models {

// Declares, allocates and initializes (from `seed`) the model of config.family.
// Parameters in `dtype` (f32, bf16, f16) on `device`.
std::unique_ptr<train::Model> make_model(const ModelConfig& config, comm::Communicator& tp, uint64_t seed,
                                         DType dtype = DType::kF32, Device device = Device::cpu());
// Declares the model's parameters only (nothing allocated): for counting any size.
std::unique_ptr<train::Model> declare_model(const ModelConfig& config, comm::Communicator& tp);

// The batch source of the model's family over documents `docs` of `ds`, its sample order
// drawn from `seed`.
std::unique_ptr<train::BatchSource> make_batch_source(const ModelConfig& config,
                                                      std::shared_ptr<const data::IndexedDataset> ds,
                                                      data::DocumentRange docs, const data::Tokenizer& tokenizer,
                                                      uint64_t seed);
// Where a T5 run's samples leave a quarter or more of the encoder as padding because their
// corrupted spans fill the decoder first (a large --mask-prob), a warning that says so and what
// --decoder-seq-length fills the encoder; with --t5-masking whole-word (whose samples fill the
// encoder), where the decoder cannot hold the share --mask-prob asks of a full sample; "" otherwise,
// and for GPT and BERT.
std::string sample_fill_warning(const ModelConfig& config, const data::Tokenizer& tokenizer);

// Whether the model's attention runs the flash kernels, which keep no (T, T) probabilities:
// flash_attention_chosen (models/transformer.h) by the config's --attention-backend.
bool uses_flash_attention(const ModelConfig& config, DType dtype, Device device);
// What the memory check needs of the model, per rank.
train::ModelMemory model_memory(const ModelConfig& config, DType dtype, Device device);
// Tokens a sample feeds the model (T5: encoder and decoder), for tokens/s.
int64_t tokens_per_sample(const ModelConfig& config);

// What GPT samples make of their input tokens `eod` (the tokenizer's end of document), by
// Megatron's flags. As Megatron's get_ltor_masks_and_position_ids, the end-of-document token
// keeps its document's position and its document.
struct GptDocumentEnds {
  int32_t eod = -1;
  bool mask_loss = false;        // --eod-mask-loss: no label where the input is eod
  bool reset_positions = false;  // --reset-position-ids: Batch::position_ids, from 0 again after each
  bool reset_attention = false;  // --reset-attention-mask: Batch::documents, a new one after each
};

// GPT samples: tokens [0, T) and labels [1, T].
class GptBatchSource final : public train::BatchSource {
 public:
  GptBatchSource(std::shared_ptr<const data::IndexedDataset> ds, data::DocumentRange docs, int seq_length,
                 uint64_t seed, int64_t vocab_size, GptDocumentEnds ends = {})
      : samples_(std::move(ds), docs, seq_length, seed, vocab_size), seq_(seq_length), ends_(ends) {}
  void fill(uint64_t first, int64_t count, train::Batch& out) override;
  uint64_t samples_per_epoch() const override { return samples_.samples_per_epoch(); }

 private:
  data::GptSamples samples_;
  int seq_;
  GptDocumentEnds ends_;
  std::vector<int32_t> window_;
};

// BERT samples: sentence pairs with masked tokens, token types and sentence-order labels.
class BertBatchSource final : public train::BatchSource {
 public:
  BertBatchSource(std::shared_ptr<const data::IndexedDataset> ds, data::DocumentRange docs,
                  const data::BertOptions& options, const data::SpecialTokens& special, int64_t vocab_size,
                  uint64_t seed);
  void fill(uint64_t first, int64_t count, train::Batch& out) override;
  uint64_t samples_per_epoch() const override { return samples_.samples_per_epoch(); }
  std::string unused_text_warning() const override;

 private:
  data::BertSamples samples_;
  int seq_;
  data::BertSample sample_;
};

// T5 samples: span corruption with sentinels (encoder input, decoder input and target).
class T5BatchSource final : public train::BatchSource {
 public:
  T5BatchSource(std::shared_ptr<const data::IndexedDataset> ds, data::DocumentRange docs,
                const data::T5Options& options, const data::SpecialTokens& special, int64_t vocab_size, uint64_t seed);
  void fill(uint64_t first, int64_t count, train::Batch& out) override;
  uint64_t samples_per_epoch() const override { return samples_.samples_per_epoch(); }
  std::string unused_text_warning() const override;

 private:
  data::T5Samples samples_;
  int enc_, dec_;
  data::T5Sample sample_;
};

}  // namespace megabatch::models
