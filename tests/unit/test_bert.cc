// BERT: the gradient of the whole objective (lm + sop) against finite differences for
// every parameter (pre-LN and post-LN, dropout on, padding masks), and the losses and every
// gradient against an independent PyTorch implementation (tests/reference/bert_torch.py).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "models/bert.h"
#include "models/registry.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/model_checks.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
using mb::testing::H5File;

namespace {

mb::models::ModelConfig tiny_bert(bool post_ln, double dropout = 0.0) {
  mb::models::ModelConfig c;
  c.family = "bert";
  c.num_layers = 2;
  c.hidden_size = 24;
  c.num_attention_heads = 3;
  c.seq_length = 11;
  c.vocab_size = 203;  // padded to 256
  c.post_layernorm = post_ln;
  c.hidden_dropout = c.attention_dropout = dropout;
  return c;
}

// Three rows: token types 0 then 1, trailing padding of 0, 3 and 5 positions, about a
// third of the real positions masked (with a label), sentence-order labels 0, 1, 1.
mb::train::Batch bert_batch(uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> tok(0, 202);
  std::uniform_real_distribution<double> u(0, 1);
  mb::train::Batch b;
  b.batch = 3;
  b.seq = 11;
  const int pads[3] = {0, 3, 5};
  for (int r = 0; r < 3; ++r)
    for (int t = 0; t < 11; ++t) {
      const bool real = t < 11 - pads[r];
      b.tokens.push_back(real ? tok(g) : 0);
      b.token_types.push_back(real && t >= 4 ? 1 : 0);
      b.padding_mask.push_back(real ? 1 : 0);
      b.labels.push_back(real && t > 0 && u(g) < 0.35 ? tok(g) : mb::train::kIgnoreLabel);
    }
  b.sample_labels = {0, 1, 1};
  return b;
}

void expect_gradient_matches_finite_differences(bool post_ln) {
  mb::comm::LocalCommunicator tp;
  auto model = mb::models::make_model(tiny_bert(post_ln, 0.1), tp, 7);
  auto& P = model->parameters();
  // Larger values than the 0.02 initialization, so that every path carries gradient and
  // the embeddings are not so small that the LayerNorms after them make a step of h
  // nonlinear.
  for (size_t id = 0; id < P.count(); ++id) {
    std::mt19937 g(static_cast<uint32_t>(id));
    std::normal_distribution<float> nd(0.0f, 0.3f);
    if (P.info(static_cast<int>(id)).role != mb::nn::Role::kNorm)
      for (size_t j = 0; j < P.info(static_cast<int>(id)).numel; ++j) P.param(static_cast<int>(id))[j] += nd(g);
  }
  const auto batch = bert_batch(1);
  const auto out = model->forward(batch, {5, 3, 0, true}, 0.0f);
  ASSERT_EQ(out.extra.size(), 1u);
  EXPECT_EQ(out.extra[0].first, "sop loss");
  // dropout on, fixed masks. fp32 losses (~6, ~1e-6 relative) over 2h, plus O(h^2)
  // curvature (a step of 3e-3 was already too nonlinear for post-LN attention here).
  mb::testing::expect_directional_derivatives(*model, batch, {5, 3, 0, true}, 1e-3f, 3e-3, 5e-4,
                                              post_ln ? " (post-LN)" : "");
}

void expect_matches_torch(bool post_ln) {
  mb::testing::TempDir tmp;
  mb::comm::LocalCommunicator tp;
  const auto c = tiny_bert(post_ln);
  auto model = mb::models::make_model(c, tp, 21);
  auto& P = model->parameters();
  mb::testing::perturb_parameters(P, 100, 0.1f);  // non-trivial biases and norms too
  const auto batch = bert_batch(4);
  {
    H5File f((tmp / "in.h5").string(), H5File::kCreate);
    mb::testing::write_parameters(f, P);
    const std::vector<hsize_t> bt = {3, 11};
    f.write("tokens", batch.tokens, bt);
    f.write("token_types", batch.token_types, bt);
    f.write("labels", batch.labels, bt);
    f.write("padding_mask", std::vector<int32_t>(batch.padding_mask.begin(), batch.padding_mask.end()), bt);
    f.write("sop_labels", batch.sample_labels, {3});
    f.attr("layers", static_cast<double>(c.num_layers));
    f.attr("heads", static_cast<double>(c.num_attention_heads));
    f.attr("eps", c.layernorm_epsilon);
    f.attr("post_ln", post_ln ? 1.0 : 0.0);
  }
  const auto r = mb::testing::run_command(mb::testing::reference("bert_torch.py") + " grads " + (tmp / "in.h5").string() + " " +
                                          (tmp / "out.h5").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto out = mb::testing::loss_and_gradients(*model, batch);
  H5File ref((tmp / "out.h5").string(), H5File::kRead);
  EXPECT_NEAR(out.mean(), ref.attr("lm_loss"), 1e-5 * ref.attr("lm_loss"));
  EXPECT_NEAR(out.extra[0].mean(), ref.attr("sop_loss"), 1e-5 * ref.attr("sop_loss"));
  mb::testing::expect_gradients_match(P, ref, post_ln ? " (post-LN)" : "");
}

}  // namespace

TEST(Bert, GradientMatchesFiniteDifferences) { expect_gradient_matches_finite_differences(false); }
TEST(Bert, PostLayerNormGradientMatchesFiniteDifferences) { expect_gradient_matches_finite_differences(true); }
TEST(BertTorch, LossesAndEveryGradientMatchPyTorch) { expect_matches_torch(false); }
TEST(BertTorch, PostLayerNormLossesAndEveryGradientMatchPyTorch) { expect_matches_torch(true); }

// --bert-no-binary-head: the objective is the lm loss alone (no sentence-order term: one loss
// slot, which the trainer weighs; it had two, and every step failed), the same lm loss as the
// model with the head (the shared weights are drawn alike, by name), and its gradient matches
// finite differences.
TEST(Bert, WithoutTheSentenceOrderHeadTheObjectiveIsTheLmLossAlone) {
  mb::comm::LocalCommunicator tp;
  auto c = tiny_bert(false);
  auto with_head = mb::models::make_model(c, tp, 7);
  c.binary_head = false;
  auto model = mb::models::make_model(c, tp, 7);
  EXPECT_EQ(model->parameters().find("binary_head.weight"), -1);
  EXPECT_EQ(model->parameters().find("pooler.dense.weight"), -1);
  auto batch = bert_batch(2);
  const auto both = with_head->forward(batch, {5, 3, 0, false}, 0.0f);
  const std::vector<double> lm_with_head = mb::to_host_f64(both.sums);
  batch.sample_labels.clear();  // (a batch source without the head makes none)
  const auto out = model->forward(batch, {5, 3, 0, false}, 0.0f);
  EXPECT_TRUE(out.extra.empty());
  ASSERT_EQ(out.sums.numel(), 1u) << "one loss slot: the lm loss";
  EXPECT_EQ(mb::to_host_f64(out.sums)[0], lm_with_head[0]);
  mb::testing::expect_directional_derivatives(*model, batch, {5, 3, 0, true}, 1e-3f, 3e-3, 5e-4, " (no binary head)");
}

TEST(Bert, PresetsDeclareTheStudiedSizes) {
  // BERT-large: 24 layers, hidden 1024, WordPiece 30522 (padded 30592): about 336 M
  // parameters with Megatron's heads (the original's 335 M plus the padded rows).
  const auto large = mb::models::size_report(mb::models::preset("bert-large"));
  EXPECT_GT(large.parameters, 330000000);
  EXPECT_LT(large.parameters, 340000000);
  EXPECT_EQ(mb::models::preset("bert-1b").num_layers, 85);
  EXPECT_EQ(mb::models::preset("bert4").hidden_size, 1024);
  EXPECT_EQ(mb::models::preset("bert-mini").family, "bert");
}
