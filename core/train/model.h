// The interface between the one training loop and a model (GPT, later BERT and T5).
// A model declares its parameters in a ParameterStore, computes the loss of a
// micro-batch in forward and accumulates parameter gradients in backward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/nn/parameters.h"

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
};

// A further term of a model's objective (BERT's "sop loss"): a sum over count items.
struct LossTerm {
  std::string name;
  double sum = 0;
  int64_t count = 0;
  double mean() const { return count ? sum / static_cast<double>(count) : 0.0; }
};

struct LossOutput {
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

class Model {
 public:
  virtual ~Model() = default;
  virtual nn::ParameterStore& parameters() = 0;
  // Computes the loss. With grad_scale != 0 it also prepares backward for the objective
  // grad_scale * (mean lm loss over the batch's counted tokens + each extra term's mean).
  virtual LossOutput forward(const Batch& batch, const StepContext& ctx, float grad_scale) = 0;
  // Accumulates into parameters().grads(); after a forward with grad_scale != 0.
  virtual void backward() = 0;
  virtual std::string summary() const = 0;
};

}  // namespace megabatch::train
