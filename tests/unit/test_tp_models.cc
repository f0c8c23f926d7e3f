// Tensor parallelism of the models: GPT, BERT and T5 split two ways (two ranks as threads
// sharing a ThreadGroup, the same layers and collectives an MPI run uses) give the loss of
// the unsplit model, and every rank's gradient shard equals its slice of the unsplit
// gradient, to fp32 tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "core/comm/thread_communicator.h"
#include "models/registry.h"

namespace mb = megabatch;

namespace {

// family: gpt, bert, t5, gpt-untied (a GPT with an output layer of its own, and documents packed in
// its rows attending within themselves: --reset-attention-mask), gpt-swiglu (its MLP
// gated: fc1's (gate, up) pairs split over the ranks), gpt-rope (rotary positions, each rank
// turning its heads), t5-no-bias (a T5 whose linear layers have no biases but the QKV
// projections'), bert-gqa (grouped-query attention, 4 heads in 2 key/value groups: a group a
// rank at TP 2), gpt-qknorm (a norm over each head's query and key, its weights shared by the
// heads of both ranks), gpt-gqa (grouped-query attention with rotary positions and q/k norms,
// all three on the grouped layout) or t5-resnorm (each sub-layer's residual its norm's output:
// --apply-residual-connection-post-layernorm)
mb::models::ModelConfig config(const std::string& family, int tp) {
  mb::models::ModelConfig c;
  c.family = family.substr(0, family.find('-'));
  c.group_query_attention = family == "bert-gqa" || family == "gpt-gqa";
  c.qk_layernorm = family == "gpt-qknorm" || family == "gpt-gqa";
  c.num_query_groups = 2;
  c.swiglu = family == "gpt-swiglu";
  c.rope = family == "gpt-rope" || family == "gpt-gqa";
  c.untie_embeddings_and_output_weights = c.reset_attention_mask = family == "gpt-untied";
  c.disable_bias_linear = c.add_qkv_bias = family == "t5-no-bias";
  c.residual_post_norm = family == "t5-resnorm";
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 64;
  c.seq_length = 9;
  c.vocab_size = 203;  // padded to 256 at TP 1 and 2
  c.decoder_num_layers = 2;
  c.decoder_seq_length = 5;
  c.tensor_model_parallel_size = tp;
  c.hidden_dropout = c.attention_dropout = 0.1;  // dropout keyed by global head and element: the same split or not
  return c;
}

mb::train::Batch batch_for(const std::string& family) {
  std::mt19937 g(7);
  std::uniform_int_distribution<int> tok(0, 202);
  mb::train::Batch b;
  b.batch = 2;
  b.seq = 9;
  for (int i = 0; i < 18; ++i) {
    b.tokens.push_back(tok(g));
    b.padding_mask.push_back(i % 9 < 8 - (i / 9) * 2 ? 1 : 0);
  }
  if (family.rfind("gpt", 0) == 0) {
    for (int i = 0; i < 18; ++i) b.labels.push_back(tok(g));
    b.padding_mask.clear();
    if (family == "gpt-untied") b.documents = {0, 0, 0, 1, 1, 1, 1, 2, 2, 0, 0, 0, 0, 0, 1, 1, 1, 1};
  } else if (family.rfind("bert", 0) == 0) {
    for (int i = 0; i < 18; ++i) {
      b.labels.push_back(i % 3 == 1 ? tok(g) : mb::train::kIgnoreLabel);
      b.token_types.push_back(i % 9 >= 4 ? 1 : 0);
    }
    b.sample_labels = {0, 1};
  } else {
    b.decoder_seq = 5;
    for (int i = 0; i < 10; ++i) {
      b.decoder_tokens.push_back(tok(g));
      b.decoder_padding_mask.push_back(i % 5 < 4 ? 1 : 0);
      b.labels.push_back(i % 5 < 4 ? tok(g) : mb::train::kIgnoreLabel);
    }
  }
  return b;
}

struct Result {
  double objective = 0;
  std::unique_ptr<mb::train::Model> model;
};

void run(const std::string& family, mb::comm::Communicator& tp, int size, Result& out) {
  out.model = mb::models::make_model(config(family, size), tp, 17);
  const auto batch = batch_for(family);
  out.model->parameters().zero_grad();
  // two micro-batches (the same one twice, dropout keyed alike): the gradients accumulate, and a
  // layer whose TP reduction took the earlier micro-batch's gradient again would count it twice
  for (int k = 0; k < 2; ++k) {
    out.objective = out.model->forward(batch, {3, 2, 1, true}, 0.5f).read().objective();
    out.model->backward();
  }
}

void expect_split_equals_whole(const std::string& family) {
  mb::comm::LocalCommunicator local;
  Result whole;
  run(family, local, 1, whole);
  mb::comm::ThreadGroup group(2);
  Result split[2];
  std::thread t0([&] { run(family, group.rank(0), 2, split[0]); });
  std::thread t1([&] { run(family, group.rank(1), 2, split[1]); });
  t0.join();
  t1.join();
  auto& W = whole.model->parameters();
  int sharded = 0;
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(split[r].objective, whole.objective, 2e-6 * std::abs(whole.objective)) << family << " rank " << r;
    auto& P = split[r].model->parameters();
    ASSERT_EQ(P.count(), W.count());
    for (size_t id = 0; id < P.count(); ++id) {
      const auto& info = P.info(static_cast<int>(id));
      const int w = W.find(info.name);
      ASSERT_GE(w, 0) << info.name;
      sharded += info.sharding.sharded;
      float scale = 0;
      for (size_t j = 0; j < W.info(w).numel; ++j) scale = std::max(scale, std::abs(W.grad(w)[j]));
      for (size_t j = 0; j < info.numel; ++j) {
        const float ref = W.grad(w)[static_cast<size_t>(info.full_index(static_cast<int64_t>(j)))];
        // fp32: the split changes the order of the sums (all-reduced partial products)
        ASSERT_NEAR(P.grad(static_cast<int>(id))[j], ref, 2e-5f * scale + 1e-9f)
            << family << ": " << info.name << "[" << j << "] on rank " << r;
      }
    }
  }
  EXPECT_GT(sharded, 0);
}

}  // namespace

TEST(TensorParallelModels, GptSplitTwoWaysMatchesTheWholeModel) { expect_split_equals_whole("gpt"); }
TEST(TensorParallelModels, GptWithRotaryPositionsSplitTwoWaysMatchesTheWholeModel) {
  expect_split_equals_whole("gpt-rope");
}
TEST(TensorParallelModels, GptWithQueryKeyNormsSplitTwoWaysMatchesTheWholeModel) {
  expect_split_equals_whole("gpt-qknorm");
}
TEST(TensorParallelModels, GptWithASwigluMlpSplitTwoWaysMatchesTheWholeModel) {
  expect_split_equals_whole("gpt-swiglu");
}
TEST(TensorParallelModels, GptWithAnUntiedOutputLayerSplitTwoWaysMatchesTheWholeModel) {
  expect_split_equals_whole("gpt-untied");
}
TEST(TensorParallelModels, BertSplitTwoWaysMatchesTheWholeModel) { expect_split_equals_whole("bert"); }
TEST(TensorParallelModels, BertWithGroupedQueryAttentionSplitTwoWaysMatchesTheWholeModel) {
  expect_split_equals_whole("bert-gqa");
}
TEST(TensorParallelModels, GptWithGroupedQueryAttentionRopeAndQueryKeyNormsSplitTwoWaysMatchesTheWholeModel) {
  expect_split_equals_whole("gpt-gqa");
}
TEST(TensorParallelModels, T5SplitTwoWaysMatchesTheWholeModel) { expect_split_equals_whole("t5"); }
TEST(TensorParallelModels, T5WithoutLinearBiasesSplitTwoWaysMatchesTheWholeModel) {
  expect_split_equals_whole("t5-no-bias");
}
TEST(TensorParallelModels, T5WithResidualsAfterTheNormsSplitTwoWaysMatchesTheWholeModel) {
  expect_split_equals_whole("t5-resnorm");
}
