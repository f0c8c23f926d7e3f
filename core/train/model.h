// The interface between the one training loop and a model (GPT, BERT, T5).
// A model declares its parameters in a ParameterStore, computes the loss of a
// micro-batch in forward and accumulates parameter gradients in backward. Everything it
// computes stays on the parameters' device: the losses too, which the host reads only
// when it logs (LossOutput::read()).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/nn/parameters.h"
#include "core/tensor/tensor.h"

namespace megabatch::train {

inline constexpr int32_t kIgnoreLabel = -1;

// One micro-batch, (B, T) row-major.
struct Batch {
  int64_t batch = 0, seq = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> labels;        // kIgnoreLabel = no loss at this position
  std::vector<uint8_t> padding_mask;  // 1 = real token; empty = no padding
  std::vector<int32_t> token_types;   // (B, T) BERT segment ids; empty for other models
  std::vector<int32_t> sample_labels; // (B) BERT sentence-order labels; empty for other models
  std::vector<int32_t> position_ids;  // (B, T) GPT's with --reset-position-ids; empty: 0 .. T-1 in each row
  std::vector<int32_t> documents;     // (B, T) GPT's with --reset-attention-mask: the document of each position in
                                      // its row (attention within a document only); empty: one a row
  // T5: tokens / padding_mask above are the encoder's (B, seq); the decoder's are (B, decoder_seq)
  // and labels are then (B, decoder_seq).
  int64_t decoder_seq = 0;
  std::vector<int32_t> decoder_tokens;
  std::vector<uint8_t> decoder_padding_mask;
};

// Where in training a forward pass happens: the dropout masks are keyed by it.
struct StepContext {
  uint64_t seed = 0;
  int64_t iteration = 0;
  int64_t micro_batch = 0;
  bool training = true;  // false: no dropout
  // fp16 dynamic loss scaling: a one-element f32 tensor on the model's device that backward
  // multiplies the loss gradient by (undefined: 1). It lives on the device so that the
  // scaler can change it without the host waiting.
  Tensor loss_scale = {};
  // What the lm loss's sum is divided by: 0, the micro-batch's counted tokens (its mean);
  // --calculate-per-token-loss, the global batch's counted tokens over its micro-batches, so that
  // with grad_scale 1 / micro-batches every token of the global batch weighs the same.
  double lm_divisor = 0;
  double lm_divisor_for(int64_t count) const { return lm_divisor > 0 ? lm_divisor : static_cast<double>(count); }
};

// The tokens of a batch that carry the lm loss (labels other than kIgnoreLabel), as every model
// counts them (LossOutput::count).
int64_t counted_tokens(const Batch& batch);

// A further term of a model's objective (BERT's "sop loss"): a sum over count items.
struct LossTerm {
  std::string name;
  double sum = 0;
  int64_t count = 0;
  double mean() const { return count ? sum / static_cast<double>(count) : 0.0; }
};

// The losses of a forward, read back to the host.
struct LossValues {
  double loss_sum = 0;  // summed per-token language-model loss ("lm loss")
  int64_t count = 0;    // tokens that carry a loss
  std::vector<LossTerm> extra;  // further terms; the objective is the sum of all means
  double mean() const { return count ? loss_sum / static_cast<double>(count) : 0.0; }
  double objective() const {
    double o = mean();
    for (const auto& t : extra) o += t.mean();
    return o;
  }
};

// The losses of a forward as they are computed: sums on the device, counts on the host
// (they follow from the batch's labels).
struct LossOutput {
  Tensor sums;          // f32 (1 + extra terms) on the model's device: "lm loss" first
  int64_t count = 0;    // tokens that carry the lm loss
  std::vector<std::pair<std::string, int64_t>> extra;  // further terms: name and item count
  // Weights turning sums into the objective's terms (1 / count each; 0 for an empty term).
  std::vector<double> mean_weights() const;
  // Copies the sums to the host (waits for the device).
  LossValues read() const;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual nn::ParameterStore& parameters() = 0;
  // Computes the loss. With grad_scale != 0 it also prepares backward for the objective
  // grad_scale * (lm loss sum / ctx.lm_divisor_for(count) + each extra term's mean), times
  // ctx.loss_scale when it is defined (the lm term is the mean over the batch's counted tokens
  // unless ctx.lm_divisor says otherwise).
  virtual LossOutput forward(const Batch& batch, const StepContext& ctx, float grad_scale) = 0;
  // Accumulates into parameters().grads(); after a forward with grad_scale != 0.
  virtual void backward() = 0;
  virtual std::string summary() const = 0;
};

}  // namespace megabatch::train
