// The GPT model: its gradient against finite differences (every layer composed, dropout
// on), the chunked LM head, parameter counts against GPT-2's published sizes, and the
// golden test against an independent PyTorch implementation (tests/reference/gpt_torch.py):
// same weights and batch -> same loss and every gradient; ten AdamW steps -> the same
// loss trajectory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>

#include "core/comm/communicator.h"
#include "core/data/indexed_dataset.h"
#include "core/device/runtime.h"
#include "core/optim/optimizer.h"
#include "core/train/train_schema.h"
#include "core/train/trainer.h"
#include "models/gpt.h"
#include "models/model_flags.h"
#include "models/registry.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/model_checks.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
using mb::testing::H5File;

namespace {

mb::models::ModelConfig tiny(double dropout = 0.0) {
  mb::models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 24;
  c.num_attention_heads = 3;
  c.seq_length = 11;
  c.vocab_size = 203;  // padded to 256
  c.hidden_dropout = c.attention_dropout = dropout;
  return c;
}

mb::train::Batch random_batch(int B, int T, int V, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> tok(0, V - 1);
  mb::train::Batch b;
  b.batch = B;
  b.seq = T;
  for (int i = 0; i < B * T; ++i) {
    b.tokens.push_back(tok(g));
    b.labels.push_back(tok(g));
  }
  return b;
}

}  // namespace

TEST(Gpt, DirectionalDerivativeMatchesFiniteDifferences) {
  mb::comm::LocalCommunicator tp;
  auto cfg = tiny(0.2);
  // A larger init keeps the residual stream (and so LayerNorm) far from its curvature at
  // the finite-difference step: with std 0.02 a step of 1e-2 on a bias would be a large
  // relative change of the activations.
  cfg.init_method_std = 0.1;
  auto model = mb::models::make_model(cfg, tp, 7);
  const auto batch = random_batch(3, 11, 203, 1);
  // dropout on, fixed masks; fp32 losses (|L| ~ 5.5, ~1e-6 relative) over 2h, plus O(h^2) curvature
  mb::testing::expect_directional_derivatives(*model, batch, {5, 3, 0, true}, 3e-3f, 2e-3, 5e-4);
}

TEST(Gpt, HeadChunkingDoesNotChangeLossOrGradients) {
  mb::comm::LocalCommunicator tp;
  const auto batch = random_batch(3, 11, 203, 2);
  std::vector<float> grads[2];
  double loss[2];
  for (int k = 0; k < 2; ++k) {
    mb::models::Gpt model(tiny(), tp);
    model.parameters().finalize();
    model.parameters().initialize(11);
    model.set_head_chunk(k == 0 ? 1000 : 7);  // one chunk vs 5 uneven chunks
    loss[k] = model.forward(batch, {1, 1, 0, true}, 1.0f).read().mean();
    model.backward();
    grads[k] = mb::to_host_f32(model.parameters().grads());
  }
  EXPECT_NEAR(loss[0], loss[1], 1e-6);
  for (size_t i = 0; i < grads[0].size(); ++i) ASSERT_NEAR(grads[0][i], grads[1][i], 1e-6) << i;
}

// The LM head's chunks: 256 rows on the CPU; on a GPU as few even chunks as keep one chunk's
// logits within 1 GiB (GPT-2's 50,304 bf16 logits are 100,608 bytes a row: 10,672 rows).
TEST(Gpt, HeadChunksAreSmallOnTheCpuAndFewOnAGpu) {
  using mb::models::head_chunk_rows;
  const auto cpu = mb::Device::cpu(), gpu = mb::Device::cuda(0);
  EXPECT_EQ(head_chunk_rows(8192, 50304, mb::DType::kBF16, cpu), 256);
  EXPECT_EQ(head_chunk_rows(8192, 50304, mb::DType::kBF16, gpu), 8192);        // one chunk
  EXPECT_EQ(head_chunk_rows(16384, 50304, mb::DType::kBF16, gpu), 8192);       // two even ones
  EXPECT_EQ(head_chunk_rows(10672, 50304, mb::DType::kBF16, gpu), 10672);      // exactly the budget
  EXPECT_EQ(head_chunk_rows(10673, 50304, mb::DType::kBF16, gpu), 5337);       // one row past it: two
  EXPECT_EQ(head_chunk_rows(8192, 50304, mb::DType::kF32, gpu), 4096);         // f32 logits: twice the bytes
  EXPECT_EQ(head_chunk_rows(3, 50304, mb::DType::kBF16, gpu), 3);
  EXPECT_EQ(head_chunk_rows(100000, 8'000'000, mb::DType::kBF16, gpu), 256);  // never below 256 rows
}

namespace {
constexpr int32_t kEod = 7;

// 60 documents of 3 to 9 tokens (ids 10 to 199), each ending in kEod, at `prefix`.
std::shared_ptr<const mb::data::IndexedDataset> short_documents(const std::filesystem::path& prefix, uint32_t seed) {
  {
    mb::data::IndexedDatasetBuilder b(prefix, mb::data::DType::kI32);
    std::mt19937 g(seed);
    for (int d = 0; d < 60; ++d) {
      std::vector<int32_t> doc(2 + g() % 7);
      for (auto& t : doc) t = 10 + static_cast<int32_t>(g() % 190);
      doc.push_back(kEod);
      b.add_sequence(doc);
      b.end_document();
    }
    b.finalize();
  }
  return std::make_shared<const mb::data::IndexedDataset>(prefix);
}
// Batches of 8 rows of T = 11 tokens from short documents (seed `seed`): `a` as the batch source
// gives them plain, `b` from one given `ends` (kEod's uses).
void plain_and_with(const std::filesystem::path& dir, uint32_t seed, mb::models::GptDocumentEnds ends,
                    mb::train::Batch& a, mb::train::Batch& b) {
  const auto ds = short_documents(dir / "d", seed);
  const auto docs = mb::data::DocumentRange::all(*ds);
  mb::models::GptBatchSource plain(ds, docs, 11, 3, 256), with(ds, docs, 11, 3, 256, ends);
  plain.fill(0, 8, a);
  with.fill(0, 8, b);
}
}  // namespace

// --eod-mask-loss (Megatron's loss mask): a position whose input token is the end of a document
// gets no label, every other position the same token and label as without it; the GPT's loss
// counts the labelled positions only. Documents of 3 to 9 tokens, each ending in EOD (7).
TEST(GptBatchSource, EodMaskLossDropsTheLabelsWhoseInputIsTheEndOfADocument) {
  mb::testing::TempDir dir;
  mb::train::Batch a, b;
  plain_and_with(dir.path(), 5, {kEod, true, false, false}, a, b);
  ASSERT_EQ(a.tokens, b.tokens);
  int dropped = 0;
  for (size_t i = 0; i < a.labels.size(); ++i) {
    const bool after_eod = a.tokens[i] == kEod;
    EXPECT_EQ(b.labels[i], after_eod ? mb::train::kIgnoreLabel : a.labels[i]) << "position " << i;
    dropped += after_eod;
  }
  EXPECT_GT(dropped, 8) << "documents of at most 10 tokens: about one position in six";
  mb::comm::LocalCommunicator tp;
  auto model = mb::models::make_model(tiny(), tp, 1, mb::DType::kF32, mb::Device::cpu());
  const auto loss = model->forward(b, {1, 0, 0, false}, 0.0f);
  EXPECT_EQ(loss.count, static_cast<int64_t>(b.labels.size()) - dropped);
}

// --reset-position-ids: each document of a sample takes positions from 0, the end-of-document
// token keeping its own document's (Megatron's get_ltor_masks_and_position_ids, as written
// there: subtract at each end of document); tokens and labels as without it.
TEST(GptBatchSource, ResetPositionIdsStartEachDocumentOfASampleAtZero) {
  mb::testing::TempDir dir;
  constexpr int T = 11;
  mb::train::Batch a, b;
  plain_and_with(dir.path(), 6, {kEod, false, true, false}, a, b);
  ASSERT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.labels, b.labels);
  EXPECT_TRUE(a.position_ids.empty());
  ASSERT_EQ(b.position_ids.size(), a.tokens.size());
  int restarts = 0;
  for (int r = 0; r < 8; ++r) {
    std::vector<int32_t> want(T);
    std::iota(want.begin(), want.end(), 0);
    for (int i = 0, prev = 0; i < T; ++i)
      if (a.tokens[static_cast<size_t>(r * T + i)] == kEod) {
        for (int j = i + 1; j < T; ++j) want[static_cast<size_t>(j)] -= i + 1 - prev;
        prev = i + 1;
        restarts += i + 1 < T;
      }
    EXPECT_EQ(std::vector<int32_t>(b.position_ids.begin() + r * T, b.position_ids.begin() + (r + 1) * T), want)
        << "row " << r;
  }
  EXPECT_GT(restarts, 8) << "documents of at most 10 tokens: a restart in most rows";
}

// --reset-attention-mask: each position's document in its sample is the count of end-of-document
// input tokens before it (the token itself keeps its own document's, as Megatron's mask lets it
// see its document); tokens, labels and positions as without it.
TEST(GptBatchSource, ResetAttentionMaskNumbersTheDocumentsOfEachSample) {
  mb::testing::TempDir dir;
  constexpr int T = 11;
  mb::train::Batch a, b;
  plain_and_with(dir.path(), 8, {kEod, false, false, true}, a, b);
  ASSERT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.labels, b.labels);
  EXPECT_TRUE(b.position_ids.empty());
  EXPECT_TRUE(a.documents.empty());
  ASSERT_EQ(b.documents.size(), a.tokens.size());
  int several = 0;
  for (int r = 0; r < 8; ++r) {
    std::vector<int32_t> want(T);
    for (int i = 0; i < T; ++i)
      want[static_cast<size_t>(i)] = static_cast<int32_t>(
          std::count(a.tokens.begin() + r * T, a.tokens.begin() + r * T + i, kEod));  // ends before position i
    EXPECT_EQ(std::vector<int32_t>(b.documents.begin() + r * T, b.documents.begin() + (r + 1) * T), want)
        << "row " << r;
    several += want.back() > 0;
  }
  EXPECT_GT(several, 4) << "documents of at most 10 tokens: several in most rows";
}

TEST(Gpt, ParameterCountsMatchPublishedGpt2Sizes) {
  // Hugging Face's GPT-2 checkpoints (vocabulary 50257, not padded): 124,439,808 and 354,823,168.
  for (auto [name, published] : {std::pair{"gpt2-124m", 124439808LL}, std::pair{"gpt2-350m", 354823168LL}}) {
    auto c = mb::models::preset(name);
    c.make_vocab_size_divisible_by = 1;
    EXPECT_EQ(mb::models::size_report(c).parameters, published) << name;
  }
  // Padding to 128: GPT-2's 50257 becomes 50304, Megatron's GPT table pads to 51200 at TP 8.
  EXPECT_EQ(mb::models::preset("gpt2-124m").padded_vocab_size(), 50304);
  auto big = mb::models::preset("gpt-7.5b");
  big.tensor_model_parallel_size = 8;
  EXPECT_EQ(big.padded_vocab_size(), 51200);
  mb::testing::expect_error([] { mb::models::preset("gpt2-125m"); }, "did you mean 'gpt2-124m'");
}

// Megatron's FLOP count in the form its older releases wrote it:
// 60 B s L h^2 (1 + g / (5 a) + s / (5 h) + V / (10 L h)) with g = a query groups.
TEST(Gpt, FlopsFollowMegatronsFormula) {
  for (const char* name : {"gpt2-124m", "gpt-7.5b", "bert-large"}) {
    const auto c = mb::models::preset(name);
    const double B = 512, s = static_cast<double>(c.seq_length), L = static_cast<double>(c.num_layers),
                 h = static_cast<double>(c.hidden_size), V = static_cast<double>(c.padded_vocab_size());
    const double megatron = 60 * B * s * L * h * h * (1 + 1.0 / 5 + s / (5 * h) + V / (10 * L * h));
    EXPECT_NEAR(mb::models::megatron_flops(c, 512), megatron, 1e-9 * megatron) << name;
  }
  // --swiglu, in the form of its newer releases: 12 B s L h^2 ((1 + g / a + s / h) + ffn / h x 3/2 +
  // V / (2 L h)), the gated MLP's fc1 twice as wide (gated_linear_multiplier 3/2); ffn 5,461
  // as a LLaMA-style script gives it
  auto c = mb::models::preset("gpt2-124m");
  c.swiglu = true;
  c.ffn_hidden_size = 5461;
  const double B = 512, s = static_cast<double>(c.seq_length), L = static_cast<double>(c.num_layers),
               h = static_cast<double>(c.hidden_size), V = static_cast<double>(c.padded_vocab_size());
  const double gated = 12 * B * s * L * h * h * ((1 + 1 + s / h) + 5461 / h * 1.5 + V / (2 * L * h));
  EXPECT_NEAR(mb::models::megatron_flops(c, 512), gated, 1e-9 * gated);
  // --group-query-attention --num-query-groups 4 of 12 heads: the key and value projections a
  // third as wide, g / a = 1/3
  c.group_query_attention = true;
  c.num_query_groups = 4;
  const double grouped = 12 * B * s * L * h * h * ((1 + 1.0 / 3 + s / h) + 5461 / h * 1.5 + V / (2 * L * h));
  EXPECT_NEAR(mb::models::megatron_flops(c, 512), grouped, 1e-9 * grouped);
  // GPT-2 124M at batch 8 x 1024: 6 N per token plus attention, about 6.1e12 per iteration
  const double f = mb::models::megatron_flops(mb::models::preset("gpt2-124m"), 8);
  EXPECT_GT(f, 6 * 124e6 * 8 * 1024);
  EXPECT_LT(f, 8 * 124e6 * 8 * 1024);
}

namespace {

// Writes the model's weights and the batch(es) for gpt_torch.py.
// attention_eod >= 0: the end-of-document token after which the reference masks the attention
// (--reset-attention-mask).
void write_reference_input(const std::string& path, mb::train::Model& model, const mb::models::ModelConfig& c,
                           const std::vector<mb::train::Batch>& batches, int32_t attention_eod = -1) {
  H5File f(path, H5File::kCreate);
  mb::testing::write_parameters(f, model.parameters());
  std::vector<int32_t> tokens, labels;
  for (const auto& b : batches) {
    tokens.insert(tokens.end(), b.tokens.begin(), b.tokens.end());
    labels.insert(labels.end(), b.labels.begin(), b.labels.end());
  }
  std::vector<hsize_t> dims = {static_cast<hsize_t>(batches[0].batch), static_cast<hsize_t>(batches[0].seq)};
  if (batches.size() > 1) dims.insert(dims.begin(), batches.size());
  f.write("tokens", tokens, dims);
  f.write("labels", labels, dims);
  if (batches.size() == 1 && !batches[0].position_ids.empty()) f.write("positions", batches[0].position_ids, dims);
  f.attr("layers", static_cast<double>(c.num_layers));
  f.attr("heads", static_cast<double>(c.num_attention_heads));
  f.attr("eps", c.layernorm_epsilon);
  f.attr("swiglu", c.swiglu ? 1.0 : 0.0);
  f.attr("rotary_dim", c.rope ? static_cast<double>(c.rotary_dim()) : 0.0);
  f.attr("rotary_base", c.rotary_base);
  f.attr("query_groups", static_cast<double>(c.query_groups()));
  f.attr("layernorm_1p", c.apply_layernorm_1p ? 1.0 : 0.0);
  f.attr("squared_relu", c.squared_relu ? 1.0 : 0.0);
  f.attr("rotary_interleaved", c.rotary_interleaved ? 1.0 : 0.0);
  f.attr("rotary_factor", static_cast<double>(c.rotary_interpolation));
  f.attr("residual_post_norm", c.residual_post_norm ? 1.0 : 0.0);
  if (attention_eod >= 0) f.attr("reset_attention_eod", static_cast<double>(attention_eod));
}

std::string torch_ref() { return mb::testing::reference("gpt_torch.py"); }

// The model's loss and every gradient on `batch` against gpt_torch.py's (the same weights, the
// config's variant); the fp32 loss within 1e-5 of the reference's, each gradient as
// expect_gradients_match bounds it.
void expect_matches_torch(mb::train::Model& model, const mb::models::ModelConfig& c, const mb::train::Batch& batch,
                          int32_t attention_eod = -1) {
  mb::testing::TempDir tmp;
  write_reference_input((tmp / "in.h5").string(), model, c, {batch}, attention_eod);
  const auto r =
      mb::testing::run_command(torch_ref() + " grads " + (tmp / "in.h5").string() + " " + (tmp / "out.h5").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double loss = mb::testing::loss_and_gradients(model, batch).mean();
  H5File out((tmp / "out.h5").string(), H5File::kRead);
  EXPECT_NEAR(loss, out.attr("loss"), 1e-5 * std::abs(loss));
  mb::testing::expect_gradients_match(model.parameters(), out);
}

// Adds normal noise of std `std` to parameter `id` (norm weights start at exact 1 or 0, where a
// wrong affine would not show).
void nudge(mb::nn::ParameterStore& P, int id, std::mt19937& g, float std) {
  std::normal_distribution<float> nd(0.0f, std);
  std::vector<float> v = mb::to_host_f32(P.param(id));
  for (float& x : v) x += nd(g);
  mb::copy(P.param(id), mb::from_host(v, P.param(id).shape()));
}

}  // namespace

TEST(GptTorch, LossAndEveryGradientMatchPyTorch) {
  mb::comm::LocalCommunicator tp;
  const auto c = tiny();
  auto model = mb::models::make_model(c, tp, 21);
  auto batch = random_batch(3, 11, 203, 4);
  batch.labels[5] = mb::train::kIgnoreLabel;  // an ignored position
  expect_matches_torch(*model, c, batch);
}

// Megatron's --norm-epsilon reaches every LayerNorm: read from the flag as train reads it, a
// GPT at epsilon 0.25 (large enough to move every norm's output: its rows' variances at
// initialization are about 1) gives PyTorch's loss and gradients at that epsilon.
TEST(GptTorch, TheNormEpsilonFlagReachesEveryLayerNormAsPyTorchsEpsilon) {
  std::vector<std::string> args = {"train", "--num-layers",   "2",   "--hidden-size",    "24", "--num-attention-heads",
                                   "3",     "--seq-length",   "11",  "--hidden-dropout", "0",  "--attention-dropout",
                                   "0",     "--norm-epsilon", "0.25"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  auto c = mb::models::model_config(
      mb::config::resolve(mb::train::train_schema(), static_cast<int>(argv.size()), argv.data(), 1));
  c.vocab_size = 203;  // as tiny()'s (the tokenizer's, which train sets from the data)
  ASSERT_EQ(c.layernorm_epsilon, 0.25);
  mb::comm::LocalCommunicator tp;
  auto model = mb::models::make_model(c, tp, 23);
  const auto batch = random_batch(2, 11, 203, 5);
  expect_matches_torch(*model, c, batch);
}

// Megatron's untied output layer (--untie-embeddings-and-output-weights): output_layer.weight
// is the head's own, so the word embeddings' gradient comes from the input lookup alone; loss
// and every gradient, both tables' included, are PyTorch's.
TEST(GptTorch, AnUntiedOutputLayerGivesPyTorchsLossAndGradients) {
  mb::comm::LocalCommunicator tp;
  auto c = tiny();
  c.untie_embeddings_and_output_weights = true;
  auto model = mb::models::make_model(c, tp, 24);
  ASSERT_GE(model->parameters().find("output_layer.weight"), 0);
  const auto batch = random_batch(2, 11, 203, 6);
  expect_matches_torch(*model, c, batch);
}

// Megatron's --disable-bias-linear with --add-qkv-bias (as Qwen's configurations set them): the
// projections and the MLP have no biases, the QKV projection keeps its own, the LayerNorms keep
// theirs; loss and every gradient are PyTorch's. --add-qkv-bias alone is refused by name.
TEST(GptTorch, LinearLayersWithoutBiasesButTheQkvsGivePyTorchsLossAndGradients) {
  mb::comm::LocalCommunicator tp;
  auto c = tiny();
  c.add_qkv_bias = true;
  try {
    c.validate();
    ADD_FAILURE() << "--add-qkv-bias without --disable-bias-linear was taken";
  } catch (const mb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--add-qkv-bias keeps the QKV biases of --disable-bias-linear"),
              std::string::npos)
        << e.what();
  }
  c.disable_bias_linear = true;
  auto model = mb::models::make_model(c, tp, 25);
  const auto& P = model->parameters();
  EXPECT_GE(P.find("decoder.layers.1.self_attention.linear_qkv.bias"), 0);
  EXPECT_GE(P.find("decoder.layers.1.input_layernorm.bias"), 0);
  for (const char* gone : {"self_attention.linear_proj.bias", "mlp.linear_fc1.bias", "mlp.linear_fc2.bias"})
    EXPECT_LT(P.find(std::string("decoder.layers.1.") + gone), 0) << gone;
  const auto batch = random_batch(2, 11, 203, 7);
  expect_matches_torch(*model, c, batch);
}

// Megatron's --swiglu: fc1 gives 2 ffn outputs, (gate, up) pairs, and fc2 takes silu(gate) up;
// loss and every gradient are PyTorch's (F.silu over the gates of the pairs).
TEST(GptTorch, ASwigluMlpGivesPyTorchsLossAndGradients) {
  mb::comm::LocalCommunicator tp;
  auto c = tiny();
  c.swiglu = true;
  c.ffn_hidden_size = 40;
  auto model = mb::models::make_model(c, tp, 26);
  const int w = model->parameters().find("decoder.layers.0.mlp.linear_fc1.weight");
  ASSERT_GE(w, 0);
  EXPECT_EQ(model->parameters().info(w).full_shape, (std::vector<int64_t>{80, 24})) << "2 ffn rows";
  const auto batch = random_batch(2, 11, 203, 8);
  expect_matches_torch(*model, c, batch);
}

// Megatron's --position-embedding-type rope with --rotary-percent 0.5 and --rotary-base 500: no
// learned positions; 4 of each head's 8 channels of q and k turned (rotate-half form); loss and
// every gradient are PyTorch's.
TEST(GptTorch, RotaryPositionsGivePyTorchsLossAndGradients) {
  mb::comm::LocalCommunicator tp;
  auto c = tiny();
  c.rope = true;
  c.rotary_percent = 0.5;
  c.rotary_base = 500;
  auto model = mb::models::make_model(c, tp, 27);
  EXPECT_LT(model->parameters().find("embedding.position_embeddings.weight"), 0) << "no learned positions";
  const auto batch = random_batch(2, 11, 203, 9);
  expect_matches_torch(*model, c, batch);
}

// Megatron's --group-query-attention --num-query-groups 1 and 3 over 6 heads (multi-query and
// grouped): the QKV projection gives (6 + 2 g) x 4 outputs, Megatron's groups of [6/g queries, a
// key, a value]; loss and every gradient are PyTorch's (which repeats each group's key and value
// for its heads); and at 2 groups with rotary positions and q/k norms, which read that layout in
// place too. A group count that does not divide the heads is refused by name.
TEST(GptTorch, GroupedQueryAttentionGivesPyTorchsLossAndGradients) {
  mb::comm::LocalCommunicator tp;
  auto c = tiny();
  c.num_attention_heads = 6;  // head dim 4
  c.group_query_attention = true;
  for (const int64_t groups : {1, 3}) {
    SCOPED_TRACE("groups " + std::to_string(groups));
    c.num_query_groups = groups;
    auto model = mb::models::make_model(c, tp, 28);
    const int w = model->parameters().find("decoder.layers.1.self_attention.linear_qkv.weight");
    ASSERT_GE(w, 0);
    EXPECT_EQ(model->parameters().info(w).full_shape, (std::vector<int64_t>{(6 + 2 * groups) * 4, 24}));
    const auto batch = random_batch(2, 11, 203, 10);
    expect_matches_torch(*model, c, batch);
  }
  {  // rotary positions and q/k norms on the grouped layout: 6 queries turned and normed, and 2 keys
    SCOPED_TRACE("groups 2, rope, qk-layernorm");
    auto g = c;
    g.num_query_groups = 2;
    g.rope = true;
    g.qk_layernorm = true;
    auto model = mb::models::make_model(g, tp, 30);
    auto& P = model->parameters();
    std::mt19937 rng(4);
    for (const char* n : {"q_layernorm.weight", "q_layernorm.bias", "k_layernorm.weight", "k_layernorm.bias"})
      for (int l = 0; l < 2; ++l) {
        const int id = P.find("decoder.layers." + std::to_string(l) + ".self_attention." + n);
        ASSERT_GE(id, 0) << n;
        nudge(P, id, rng, 0.5f);
      }
    expect_matches_torch(*model, g, random_batch(2, 11, 204, 10));
  }
  c.num_query_groups = 4;
  mb::testing::expect_error([&] { c.validate(); }, "--num-query-groups 4 does not divide the 6 attention heads");
}

// Megatron's --qk-layernorm with rotary positions: a LayerNorm of D channels over each head's
// query and key (q_layernorm and k_layernorm, shared by the heads), before the rotary turn; loss
// and every gradient, the norms' weights and biases included, are PyTorch's. The norms' weights
// start at 1 and their biases at 0, so they are set off it here (else a wrong affine would not
// show). T5 is refused by name.
TEST(GptTorch, QueryKeyLayerNormsGivePyTorchsLossAndGradients) {
  mb::comm::LocalCommunicator tp;
  auto c = tiny();
  c.qk_layernorm = true;
  c.rope = true;
  auto model = mb::models::make_model(c, tp, 29);
  auto& P = model->parameters();
  std::mt19937 g(3);
  for (const char* n : {"q_layernorm.weight", "q_layernorm.bias", "k_layernorm.weight", "k_layernorm.bias"}) {
    const int id = P.find(std::string("decoder.layers.1.self_attention.") + n);
    ASSERT_GE(id, 0) << n;
    EXPECT_EQ(P.info(id).full_shape, (std::vector<int64_t>{8})) << n << ": the head dim";
    nudge(P, id, g, 0.5f);
  }
  const auto batch = random_batch(2, 11, 203, 11);
  expect_matches_torch(*model, c, batch);
  c.family = "t5";
  mb::testing::expect_error([&] { c.validate(); },
                            "--qk-layernorm: megabatch's T5 has no norm on its queries and keys");
}

// Megatron's --no-position-embedding (NoPE): no position table; the causal mask alone orders the
// tokens. Loss and every gradient are PyTorch's without positions.
TEST(GptTorch, NoPositionEmbeddingsGivePyTorchsLossAndGradients) {
  mb::comm::LocalCommunicator tp;
  auto c = tiny();
  c.no_position_embedding = true;
  auto model = mb::models::make_model(c, tp, 30);
  EXPECT_LT(model->parameters().find("embedding.position_embeddings.weight"), 0) << "no learned positions";
  const auto batch = random_batch(2, 11, 203, 12);
  expect_matches_torch(*model, c, batch);
}

// Megatron's --apply-residual-connection-post-layernorm: each sub-layer adds its output to its
// norm's output. Loss and every gradient are PyTorch's; and they are not the default blocks'
// (the flag reaches the stack).
TEST(GptTorch, ResidualsTakenAfterTheNormsGivePyTorchsLossAndGradients) {
  mb::comm::LocalCommunicator tp;
  auto c = tiny();
  c.residual_post_norm = true;
  auto model = mb::models::make_model(c, tp, 32);
  auto plain = mb::models::make_model(tiny(), tp, 32);
  const auto batch = random_batch(2, 11, 203, 14);
  EXPECT_NE(mb::testing::loss_and_gradients(*model, batch).mean(),
            mb::testing::loss_and_gradients(*plain, batch).mean());
  expect_matches_torch(*model, c, batch);
  c.family = "bert";
  c.post_layernorm = true;  // BERT's original blocks: the other arrangement
  mb::testing::expect_error(
      [&] { c.validate(); },
      "--apply-residual-connection-post-layernorm takes a pre-LN block's residual after its norm, "
      "and --post-layernorm's blocks norm after the residual add; give one of them");
}

// A batch's own position ids (--reset-position-ids: documents packed in a row, each from 0) reach
// the learned position table: loss and every gradient are PyTorch's with those positions (and
// not the row's 0 .. T-1).
TEST(GptTorch, ABatchsOwnPositionIdsGivePyTorchsLossAndGradients) {
  mb::comm::LocalCommunicator tp;
  const auto c = tiny();
  auto model = mb::models::make_model(c, tp, 33);
  auto batch = random_batch(2, 11, 203, 15);
  const double rows = mb::testing::loss_and_gradients(*model, batch).mean();
  batch.position_ids = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_NE(mb::testing::loss_and_gradients(*model, batch).mean(), rows);
  expect_matches_torch(*model, c, batch);
  mb::models::ModelConfig rotary = c;
  rotary.rope = rotary.reset_position_ids = true;
  mb::testing::expect_error([&] { rotary.validate(); },
                            "--reset-position-ids restarts the learned position embeddings at each document, and this "
                            "GPT has rotary positions, which it would leave as they are (as Megatron's); drop it");
}

// --reset-attention-mask: a batch from the batch source, whose rows hold several short documents,
// keeps each document's attention within it; loss and every gradient are PyTorch's with
// Megatron's mask (built there from the tokens' ends of documents, as Megatron builds it), through
// the explicit attention and through the flash algorithm (the CPU's reference of it), and differ
// from attending across the documents.
TEST(GptTorch, DocumentsAttendingWithinThemselvesGivePyTorchsLossAndGradients) {
  mb::testing::TempDir dir;
  const auto ds = short_documents(dir / "d", 9);
  mb::models::GptBatchSource source(ds, mb::data::DocumentRange::all(*ds), 11, 4, 256, {kEod, false, false, true});
  mb::train::Batch batch;
  source.fill(0, 3, batch);
  ASSERT_GT(*std::max_element(batch.documents.begin(), batch.documents.end()), 0);
  mb::comm::LocalCommunicator tp;
  for (const char* backend : {"local", "flash"}) {
    SCOPED_TRACE(backend);
    auto c = tiny();
    c.reset_attention_mask = true;
    c.attention_backend = backend;
    auto model = mb::models::make_model(c, tp, 35);
    mb::train::Batch across = batch;
    across.documents.clear();
    EXPECT_NE(mb::testing::loss_and_gradients(*model, across).mean(),
              mb::testing::loss_and_gradients(*model, batch).mean());
    expect_matches_torch(*model, c, batch, kEod);
  }
}

// Megatron's --apply-layernorm-1p, with the query-key norms: every norm's weight starts at 0 and
// scales by 1 + w; set off 0 here, loss and every gradient are PyTorch's with 1 + w.
TEST(GptTorch, NormWeightsAppliedAsOnePlusWGivePyTorchsLossAndGradients) {
  mb::comm::LocalCommunicator tp;
  auto c = tiny();
  c.apply_layernorm_1p = true;
  c.qk_layernorm = true;
  auto model = mb::models::make_model(c, tp, 31);
  auto& P = model->parameters();
  std::mt19937 g(4);
  int norms = 0;
  for (int id = 0; id < static_cast<int>(P.count()); ++id) {
    const auto& info = P.info(id);
    if (info.name.find("layernorm.weight") == std::string::npos) continue;
    for (float x : mb::to_host_f32(P.param(id))) EXPECT_EQ(x, 0.0f) << info.name << ": zero-centred at the start";
    nudge(P, id, g, 0.3f);
    ++norms;
  }
  EXPECT_EQ(norms, 2 * 4 + 1) << "two layers' four norms and the final one";
  const auto batch = random_batch(2, 11, 203, 13);
  expect_matches_torch(*model, c, batch);
}

// Megatron's --squared-relu: the MLP's activation max(x, 0)^2; loss and every gradient are
// PyTorch's. Beside --swiglu it is refused by name.
TEST(GptTorch, ASquaredReluMlpGivesPyTorchsLossAndGradients) {
  mb::comm::LocalCommunicator tp;
  auto c = tiny();
  c.squared_relu = true;
  auto model = mb::models::make_model(c, tp, 32);
  const auto batch = random_batch(2, 11, 203, 14);
  expect_matches_torch(*model, c, batch);
  c.swiglu = true;
  mb::testing::expect_error([&] { c.validate(); }, "--swiglu and --squared-relu each choose the MLP's activation");
}

// Megatron's --rotary-interleaved with --rotary-seq-len-interpolation-factor 4: the pairs (2i,
// 2i + 1) of each head's q and k turned at a quarter of the position's angle; loss and every
// gradient are PyTorch's (the interleaved form of Megatron's _rotate_half).
TEST(GptTorch, InterleavedInterpolatedRotaryPositionsGivePyTorchsLossAndGradients) {
  mb::comm::LocalCommunicator tp;
  auto c = tiny();
  c.rope = true;
  c.rotary_interleaved = true;
  c.rotary_interpolation = 4;
  c.rotary_base = 50;
  auto model = mb::models::make_model(c, tp, 33);
  const auto batch = random_batch(2, 11, 203, 15);
  expect_matches_torch(*model, c, batch);
}

TEST(GptTorch, TenAdamWStepsFollowThePyTorchLossTrajectory) {
  mb::testing::TempDir tmp;
  mb::comm::LocalCommunicator tp;
  const auto c = tiny();
  auto model = mb::models::make_model(c, tp, 22);
  std::vector<mb::train::Batch> batches;
  for (int s = 0; s < 10; ++s) batches.push_back(random_batch(3, 11, 40, 100 + s));  // a learnable sub-vocabulary
  write_reference_input((tmp / "in.h5").string(), *model, c, batches);
  const double lr = 3e-3, wd = 0.1, clip = 1.0;
  {  // hyperparameters as attributes
    H5File f((tmp / "in.h5").string(), H5File::kAppend);
    for (auto [k, v] : {std::pair{"lr", lr}, std::pair{"beta1", 0.9}, std::pair{"beta2", 0.95},
                        std::pair{"adam_eps", 1e-8}, std::pair{"weight_decay", wd}, std::pair{"clip", clip}})
      f.attr(k, v);
  }
  const auto r = mb::testing::run_command(torch_ref() + " adamw " + (tmp / "in.h5").string() + " " +
                                          (tmp / "out.h5").string() + " 10");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const auto plugin = mb::optim::load_plugin("adamw", mb::optim::plugin_search_path());
  const auto hp = mb::optim::resolve_hparams(plugin, {{"beta2", 0.95}, {"weight_decay", wd}}, "test");
  mb::optim::PluginOptimizer opt(plugin, model->parameters(), tp, hp, 0);
  H5File out((tmp / "out.h5").string(), H5File::kRead);
  const auto ref = out.read<double>("losses");
  ASSERT_EQ(ref.size(), 10u);
  for (int s = 0; s < 10; ++s) {
    model->parameters().zero_grad();
    const double loss = model->forward(batches[s], {0, s + 1, 0, false}, 1.0f).read().mean();
    model->backward();
    const double norm = mb::optim::grad_norm(model->parameters(), tp);
    const double coeff = mb::optim::clip_coefficient(norm, clip);
    float* g = model->parameters().grads().data();
    for (size_t i = 0; i < model->parameters().flat_size(); ++i) g[i] *= static_cast<float>(coeff);
    opt.step(s + 1, lr, 3);
    EXPECT_NEAR(loss, ref[s], 1e-4 * std::abs(ref[s])) << "step " << s + 1;
  }
  EXPECT_LT(ref[9], ref[0]) << "the reference run should learn something";
}

namespace {
// Serves a fixed list of samples, repeating: sample i is batch-row i mod rows of `all`.
class FixedSource final : public mb::train::BatchSource {
 public:
  explicit FixedSource(mb::train::Batch all) : all_(std::move(all)) {}
  void fill(uint64_t first, int64_t count, mb::train::Batch& out) override {
    out.batch = count;
    out.seq = all_.seq;
    out.tokens.clear();
    out.labels.clear();
    for (int64_t r = 0; r < count; ++r) {
      const int64_t row = static_cast<int64_t>((first + static_cast<uint64_t>(r)) % samples_per_epoch());
      const auto b = all_.tokens.begin() + row * all_.seq;
      const auto l = all_.labels.begin() + row * all_.seq;
      out.tokens.insert(out.tokens.end(), b, b + all_.seq);
      out.labels.insert(out.labels.end(), l, l + all_.seq);
    }
  }
  uint64_t samples_per_epoch() const override { return static_cast<uint64_t>(all_.batch); }

 private:
  mb::train::Batch all_;
};

// One step of plain SGD at a constant lr, without clipping or evaluation: what the trainer
// tests below start from.
mb::train::TrainOptions one_sgd_step(int64_t micro_batch, int64_t global_batch, double lr) {
  mb::train::TrainOptions o;
  o.micro_batch_size = micro_batch;
  o.global_batch_size = global_batch;
  o.train_iters = 1;
  o.schedule.max_lr = o.schedule.min_lr = lr;
  o.schedule.style = mb::optim::DecayStyle::kConstant;
  o.clip_grad = 0;
  o.eval_iters = 0;
  return o;
}
}  // namespace

TEST(Trainer, AccumulatedMicroBatchesGiveTheMeanGradientOfTheGlobalBatch) {
  // One SGD step over a global batch of 8: as one micro-batch of 8, and as 4 micro-batches
  // of 2. The optimizer must see the same (mean) gradient, so the parameters agree.
  mb::comm::LocalCommunicator tp;
  const auto plugin = mb::optim::load_plugin("sgd", mb::optim::plugin_search_path());
  const auto hp = mb::optim::resolve_hparams(plugin, {{"momentum", 0.0}}, "test");
  std::vector<float> params[2];
  for (int k = 0; k < 2; ++k) {
    auto model = mb::models::make_model(tiny(), tp, 5);
    mb::optim::PluginOptimizer opt(plugin, model->parameters(), tp, hp, 0);
    FixedSource src(random_batch(8, 11, 203, 9));
    const mb::train::TrainOptions o = one_sgd_step(k == 0 ? 8 : 2, 8, 0.5);
    std::ostringstream console;
    mb::train::Trainer t(o, *model, opt, tp, src, nullptr, nullptr, console);
    t.run();
    params[k] = mb::to_host_f32(model->parameters().params());
  }
  double moved = 0;
  auto init = mb::models::make_model(tiny(), tp, 5);
  for (size_t i = 0; i < params[0].size(); ++i) {
    ASSERT_NEAR(params[0][i], params[1][i], 1e-6f) << i;
    moved = std::max(moved, static_cast<double>(std::abs(params[0][i] - init->parameters().params()[i])));
  }
  EXPECT_GT(moved, 1e-3) << "the step changed the parameters";
}

// The noise scale's small-batch term against a reference computed apart: each micro-batch's
// gradient by a forward and backward pass of its own from zeroed gradients, the mean of their
// squared norms (and the global batch's squared norm). With an EMA of 0 the estimator holds
// one step's estimates, from which both terms follow. (The first version read each
// micro-batch's gradient as the sum's growth over its backward pass and missed the LM head's
// weight gradient, which the forward pass adds: 100x too small in the embedding.)
TEST(Trainer, NoiseScaleSmallBatchTermIsTheMeanOverMicroBatchesOfEachOnesSquaredGradientNorm) {
  mb::comm::LocalCommunicator tp;
  const auto plugin = mb::optim::load_plugin("sgd", mb::optim::plugin_search_path());
  const auto hp = mb::optim::resolve_hparams(plugin, {{"momentum", 0.0}}, "test");
  const mb::train::Batch all = random_batch(8, 11, 203, 9);
  auto model = mb::models::make_model(tiny(), tp, 5);
  mb::optim::PluginOptimizer opt(plugin, model->parameters(), tp, hp, 0);
  FixedSource src(all);
  mb::train::TrainOptions o = one_sgd_step(2, 8, 0.0);
  o.noise_scale = true;
  o.noise_scale_ema = 0.0;
  std::ostringstream console;
  mb::train::Trainer t(o, *model, opt, tp, src, nullptr, nullptr, console);
  t.run();
  const double b = 2, B = 8, g2 = t.noise_scale().grad_sq_norm(), tr = t.noise_scale().trace_cov();
  const double d = tr * (1 / b - 1 / B), big = g2 + b * d / (B - b), small = big + d;

  auto ref = mb::models::make_model(tiny(), tp, 5);
  mb::nn::ParameterStore& P = ref->parameters();
  auto sq = [&] {
    double q = 0;
    for (float g : mb::to_host_f32(P.grads())) q += static_cast<double>(g) * g;
    return q;
  };
  double mean_small = 0;
  std::vector<double> sum(P.flat_size(), 0.0);
  for (int64_t m = 0; m < 4; ++m) {
    mb::train::Batch mbatch;
    src.fill(static_cast<uint64_t>(m * 2), 2, mbatch);
    P.zero_grad();
    ref->forward(mbatch, {o.seed, 1, m, true}, 1.0f);
    ref->backward();
    mean_small += sq() / 4;
    const auto g = mb::to_host_f32(P.grads());
    for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i] / 4.0;
  }
  double big_ref = 0;
  for (double x : sum) big_ref += x * x;
  EXPECT_NEAR(small, mean_small, 1e-4 * mean_small);
  EXPECT_NEAR(big, big_ref, 1e-4 * big_ref);
}

TEST(Trainer, EvalSamplesCoverASmallerSplitOnceAndEvalItersRepeatItAsMegatronDoes) {
  // A held-out split of 7 samples, micro-batches of 4. --eval-samples 16 must give the mean
  // token loss of the 7 samples, each once (the last micro-batch has 3); Megatron's
  // --eval-iters 2 x global batch 8 cycles through the split (rows 0..15 mod 7, so rows 0
  // and 1 count three times). References: one forward over exactly those rows.
  mb::comm::LocalCommunicator tp;
  auto model = mb::models::make_model(tiny(), tp, 8);
  const auto plugin = mb::optim::load_plugin("sgd", mb::optim::plugin_search_path());
  mb::optim::PluginOptimizer opt(plugin, model->parameters(), tp, mb::optim::resolve_hparams(plugin, {}, "t"), 0);
  FixedSource split(random_batch(7, 11, 203, 11));
  auto mean_over = [&](int64_t rows) {
    mb::train::Batch b;
    split.fill(0, rows, b);
    const auto out = model->forward(b, {0, 0, 0, false}, 0.0f);
    return out.read().mean();
  };
  const double once = mean_over(7), cycled = mean_over(16);
  ASSERT_GT(std::abs(once - cycled), 1e-4) << "the two references must differ for the test to tell them apart";
  for (const bool by_samples : {true, false}) {
    mb::train::TrainOptions o;
    o.micro_batch_size = 4;
    o.global_batch_size = 8;
    o.eval_samples = by_samples ? 16 : 0;
    o.eval_iters = by_samples ? 0 : 2;
    std::ostringstream console;
    mb::train::Trainer t(o, *model, opt, tp, split, &split, nullptr, console);
    EXPECT_EQ(t.eval_sample_count(split), by_samples ? 7 : 16);
    const double loss = t.evaluate(split).at(0).second;
    // f32 sums of 77 or 176 token losses (~5.3 each) against the reference's own f32 sum
    EXPECT_NEAR(loss, by_samples ? once : cycled, 1e-5 * std::abs(loss)) << (by_samples ? "eval_samples" : "eval_iters");
  }
}

TEST(ParameterStore, ShardsInitializeToSlicesOfTheFullTensor) {
  // The same parameters declared whole and as each shard of a 2-way split: every shard
  // must hold exactly its slice of the whole initialization.
  auto declare = [](mb::nn::ParameterStore& s, mb::nn::Sharding row, mb::nn::Sharding col, mb::nn::Sharding vec) {
    s.add({"rows", mb::nn::Role::kWeight, 0, {6, 5}, row, mb::nn::Init::normal(1.0)});
    s.add({"cols", mb::nn::Role::kWeight, 0, {5, 6}, col, mb::nn::Init::normal(1.0)});
    s.add({"vec", mb::nn::Role::kBias, 0, {8}, vec, mb::nn::Init::normal(1.0)});
    s.finalize();
    s.initialize(17);
  };
  mb::nn::ParameterStore whole;
  declare(whole, {}, {}, {});
  for (int rank = 0; rank < 2; ++rank) {
    mb::nn::ParameterStore shard;
    declare(shard, mb::nn::Sharding::split(0, rank, 2), mb::nn::Sharding::split(1, rank, 2),
            mb::nn::Sharding::split(0, rank, 2));
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 5; ++c) EXPECT_EQ(shard.param(0)[r * 5 + c], whole.param(0)[(rank * 3 + r) * 5 + c]);
    for (int r = 0; r < 5; ++r)
      for (int c = 0; c < 3; ++c) EXPECT_EQ(shard.param(1)[r * 3 + c], whole.param(1)[r * 6 + rank * 3 + c]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(shard.param(2)[i], whole.param(2)[rank * 4 + i]);
  }
}

// Megatron's --init-method-xavier-uniform: each normal-initialized 2-D parameter draws from
// U(-a, a), a = sqrt(6 / (rows + columns)) of its full shape: every value within a, the variance
// a^2 / 3 (to 2%, some 10 standard errors over 120,000 draws), the mean 0; a shard holds its
// slice of the whole draw; 1-D and constant parameters are initialized as without it; and a
// model's word embedding (padded vocabulary x hidden) takes its own bound.
TEST(ParameterStore, XavierUniformDrawsEachWeightWithinItsFanBoundAndShardsAreSlices) {
  auto declare = [](mb::nn::ParameterStore& s, mb::nn::Sharding split, bool xavier) {
    s.add({"w", mb::nn::Role::kWeight, 0, {400, 300}, split, mb::nn::Init::normal(1.0)});
    s.add({"b", mb::nn::Role::kBias, 0, {8}, {}, mb::nn::Init::normal(1.0)});
    s.add({"g", mb::nn::Role::kNorm, 0, {8}, {}, mb::nn::Init::ones()});
    s.finalize();
    s.initialize(17, xavier);
  };
  mb::nn::ParameterStore whole, normal;
  declare(whole, {}, true);
  declare(normal, {}, false);
  const double a = std::sqrt(6.0 / 700.0);
  const std::vector<float> w = mb::to_host_f32(whole.param(0));
  double sum = 0, squares = 0, largest = 0;
  for (float x : w) {
    ASSERT_LT(std::abs(x), a);
    sum += x;
    squares += static_cast<double>(x) * x;
    largest = std::max(largest, static_cast<double>(std::abs(x)));
  }
  const double n = static_cast<double>(w.size()), mean = sum / n, variance = squares / n - mean * mean;
  EXPECT_LT(std::abs(mean), 4 * a / std::sqrt(3 * n));
  EXPECT_NEAR(variance, a * a / 3, 0.02 * a * a / 3);
  EXPECT_GT(largest, 0.999 * a);
  EXPECT_EQ(mb::to_host_f32(whole.param(1)), mb::to_host_f32(normal.param(1))) << "a bias stays normal";
  EXPECT_EQ(mb::to_host_f32(whole.param(2)), std::vector<float>(8, 1.0f));
  for (int rank = 0; rank < 2; ++rank) {
    mb::nn::ParameterStore shard;
    declare(shard, mb::nn::Sharding::split(1, rank, 2), true);
    const std::vector<float> part = mb::to_host_f32(shard.param(0));
    for (int r = 0; r < 400; ++r)
      for (int c = 0; c < 150; ++c)
        ASSERT_EQ(part[static_cast<size_t>(r * 150 + c)], w[static_cast<size_t>(r * 300 + rank * 150 + c)]);
  }
  mb::comm::LocalCommunicator tp;
  auto c = tiny();
  c.init_method_xavier_uniform = true;
  auto model = mb::models::make_model(c, tp, 3);
  const int wte = model->parameters().find("embedding.word_embeddings.weight");
  const double bound = std::sqrt(6.0 / static_cast<double>(c.padded_vocab_size() + c.hidden_size));
  double top = 0;
  for (float x : mb::to_host_f32(model->parameters().param(wte))) top = std::max(top, static_cast<double>(std::abs(x)));
  EXPECT_LT(top, bound);
  EXPECT_GT(top, 0.9 * bound);
}

// Megatron's --embedding-init-method-std: the word, position (and BERT's token-type) embeddings
// are drawn at their own std, the other weights (an untied output layer among them) at
// --init-method-std; under --init-method-xavier-uniform such embeddings stay normal (values past
// their xavier bound) while the weights are uniform; and given equal to --init-method-std it
// changes nothing, the embeddings following the weights' method, xavier included.
TEST(Gpt, EmbeddingInitMethodStdDrawsTheEmbeddingsAtTheirOwnStd) {
  mb::comm::LocalCommunicator tp;
  auto stats = [](const mb::nn::ParameterStore& p, const char* name) {  // {sample std, largest |x|}
    const std::vector<float> v = mb::to_host_f32(p.param(p.find(name)));
    double squares = 0, top = 0;
    for (float x : v) squares += static_cast<double>(x) * x, top = std::max(top, static_cast<double>(std::abs(x)));
    return std::pair{std::sqrt(squares / static_cast<double>(v.size())), top};
  };
  const char* kWords = "embedding.word_embeddings.weight";
  const char* kPositions = "embedding.position_embeddings.weight";
  const char* kQkv = "decoder.layers.0.self_attention.linear_qkv.weight";
  auto c = tiny();
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.seq_length = 64;
  c.vocab_size = 1000;  // padded to 1024
  c.untie_embeddings_and_output_weights = true;
  c.init_method_std = 0.02;
  c.embedding_init_method_std = 0.1;
  auto model = mb::models::make_model(c, tp, 3);
  const auto& p = model->parameters();
  // sample stds to some 3 standard errors: words and the output layer 65,536 draws, the
  // positions 4,096, the QKV 12,288
  EXPECT_NEAR(stats(p, kWords).first, 0.1, 0.001);
  EXPECT_NEAR(stats(p, kPositions).first, 0.1, 0.004);
  EXPECT_NEAR(stats(p, kQkv).first, 0.02, 0.0004);
  EXPECT_NEAR(stats(p, "output_layer.weight").first, 0.02, 0.0002);

  c.init_method_xavier_uniform = true;
  auto xavier = mb::models::make_model(c, tp, 3);
  const auto& x = xavier->parameters();
  const double word_bound = std::sqrt(6.0 / static_cast<double>(c.padded_vocab_size() + c.hidden_size));
  EXPECT_NEAR(stats(x, kWords).first, 0.1, 0.001) << "normal at its own std";
  EXPECT_GT(stats(x, kWords).second, 2 * word_bound);
  const double qkv_bound = std::sqrt(6.0 / static_cast<double>(3 * c.hidden_size + c.hidden_size));
  EXPECT_LT(stats(x, kQkv).second, qkv_bound) << "the weights uniform";
  c.embedding_init_method_std = c.init_method_std;
  auto same = mb::models::make_model(c, tp, 3);
  EXPECT_LT(stats(same->parameters(), kWords).second, word_bound) << "equal to --init-method-std: xavier's";

  mb::models::ModelConfig b = mb::models::preset("bert-mini");
  b.embedding_init_method_std = 0.1;
  auto bert = mb::models::make_model(b, tp, 3);
  EXPECT_NEAR(stats(bert->parameters(), "embedding.tokentype_embeddings.weight").first, 0.1, 0.01);  // 512 draws
  EXPECT_NEAR(stats(bert->parameters(), kWords).first, 0.1, 0.001);
  EXPECT_NEAR(stats(bert->parameters(), "lm_head.dense.weight").first, 0.02, 0.0003);
}

TEST(Trainer, ClipsTheGlobalGradientNormBeforeTheOptimizerStep) {
  // Plain SGD moves the parameters by lr * g: after clipping to norm c the step has norm lr * c.
  mb::comm::LocalCommunicator tp;
  const auto plugin = mb::optim::load_plugin("sgd", mb::optim::plugin_search_path());
  auto model = mb::models::make_model(tiny(), tp, 6);
  const std::vector<float> before = mb::to_host_f32(model->parameters().params());
  mb::optim::PluginOptimizer opt(plugin, model->parameters(), tp, mb::optim::resolve_hparams(plugin, {{"momentum", 0.0}}, "t"), 0);
  FixedSource src(random_batch(4, 11, 203, 10));
  mb::train::TrainOptions o = one_sgd_step(4, 4, 0.1);
  o.clip_grad = 0.05;  // far below the gradient norm of a fresh model (about 1)
  std::ostringstream console;
  mb::train::Trainer t(o, *model, opt, tp, src, nullptr, nullptr, console);
  t.run();
  double step = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    const double d = model->parameters().params()[i] - before[i];
    step += d * d;
  }
  EXPECT_NEAR(std::sqrt(step), 0.1 * 0.05, 1e-4);
  EXPECT_NE(console.str().find("grad norm:"), std::string::npos);
}

// A step without a log line or diagnostics reads nothing back from the device, so that on a
// GPU it never waits for it (test_gpu.cc checks the waiting itself there): the host's reads of
// device values are counted (runtime::host_reads) on the CPU as on a GPU. LAMB (its norms and
// trust ratios stay on the device), two micro-batches a step, dropout, clipping and the noise
// scale, in f32 and bf16 (fp16 on the CPU reads its overflow flag at once, by design; a GPU
// reads it a step late).
TEST(Trainer, StepsBetweenLogLinesReadNothingBackFromTheDevice) {
  mb::comm::LocalCommunicator tp;
  const auto plugin = mb::optim::load_plugin("lamb", mb::optim::plugin_search_path());
  for (const mb::DType dt : {mb::DType::kF32, mb::DType::kBF16}) {
    SCOPED_TRACE(mb::dtype_name(dt));
    auto model = mb::models::make_model(tiny(0.1), tp, 6, dt, mb::Device::cpu());
    mb::optim::PluginOptimizer opt(plugin, model->parameters(), tp, mb::optim::resolve_hparams(plugin, {}, "t"), 0);
    FixedSource src(random_batch(8, 11, 203, 12));
    const mb::train::TrainOptions o = mb::testing::steady_state_options();
    std::ostringstream console;
    mb::train::Trainer t(o, *model, opt, tp, src, nullptr, nullptr, console);
    for (int s = 1; s <= 8; ++s) t.train_step();  // iterations 1, 4 and 8 log
    const int64_t before = mb::runtime::host_reads();
    for (int s = 9; s <= 11; ++s) t.train_step();
    EXPECT_EQ(mb::runtime::host_reads(), before) << "iterations 9 to 11 read device values back";
    t.train_step();  // iteration 12: its log line and diagnostics read back
    EXPECT_GT(mb::runtime::host_reads(), before) << "the count missed the log line's reads";
    EXPECT_EQ(t.losses().size(), 12u);
  }
}
