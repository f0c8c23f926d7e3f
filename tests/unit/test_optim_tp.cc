// Tensor-parallel correctness of every per-tensor norm the optimizer plugins take: a GPT
// split two ways (two ranks as threads of this process, sharing a ThreadGroup) must see
// the same global gradient norm, the same weight, gradient and update norms and trust
// ratio for every tensor, and parameters that stay slices of the unsplit run's. A sharded
// tensor whose norm were not reduced over the group, or a replicated one reduced, would
// report a different norm.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/thread_communicator.h"
#include "core/ops/elementwise.h"
#include "core/optim/optimizer.h"
#include "core/train/grad_buckets.h"
#include "core/util/error.h"
#include "core/util/philox.h"
#include "models/presets.h"
#include "models/registry.h"

namespace mb = megabatch;

namespace {

mb::models::ModelConfig config(int tp) {
  mb::models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 8;
  c.vocab_size = 203;  // padded to 256 at TP 1 and 2
  c.tensor_model_parallel_size = tp;
  c.hidden_dropout = c.attention_dropout = 0.0;
  return c;
}

// Gradient element = a normal draw keyed by (parameter name, index in the full tensor),
// so each shard's gradient is exactly its slice of the unsplit gradient.
void fill_grads(mb::nn::ParameterStore& store, double scale) {
  for (size_t i = 0; i < store.count(); ++i) {
    const auto& info = store.info(static_cast<int>(i));
    const uint64_t key = mb::name_key(info.name.data(), info.name.size());
    float* g = store.grad(static_cast<int>(i)).data();
    for (size_t j = 0; j < info.numel; ++j)
      g[j] = static_cast<float>(scale * mb::philox_normal(key, static_cast<uint64_t>(info.full_index(static_cast<int64_t>(j)))));
  }
}

struct RunResult {
  std::vector<double> grad_norms;                                 // per step
  // "series/tensor name" -> per step, for every diagnostic (trust_ratio, weight_norm, ...)
  std::map<std::string, std::vector<double>> diag;
  std::map<std::string, std::vector<float>> params;               // final values (local)
  std::map<std::string, const mb::nn::ParamInfo*> info;
  std::unique_ptr<mb::train::Model> model;
};

// This step's per-tensor diagnostics, and (at the end) the parameters, into `out`.
void record_diagnostics(const mb::optim::PluginOptimizer& opt, RunResult& out) {
  const auto& store = out.model->parameters();
  for (const auto& [series, values] : opt.diagnostics())
    for (size_t i = 0; i < store.count(); ++i)
      out.diag[series + "/" + store.info(static_cast<int>(i)).name].push_back(values[i]);
}
void record_params(RunResult& out) {
  const auto& store = out.model->parameters();
  for (size_t i = 0; i < store.count(); ++i) {
    const auto& info = store.info(static_cast<int>(i));
    out.params[info.name] = mb::to_host_f32(store.param(static_cast<int>(i)));
    out.info[info.name] = &info;
  }
}

void run(const std::string& plugin_name, const nlohmann::json& hp, int64_t global_batch, mb::comm::Communicator& tp,
         int tp_size, RunResult& out) {
  const auto plugin = mb::optim::load_plugin(plugin_name, mb::optim::plugin_search_path({MEGABATCH_TEST_PLUGIN_DIR}));
  out.model = mb::models::make_model(config(tp_size), tp, 11);
  auto& store = out.model->parameters();
  mb::optim::PluginOptimizer opt(plugin, store, tp, mb::optim::resolve_hparams(plugin, hp, "test"), 5);
  for (int step = 1; step <= 3; ++step) {
    fill_grads(store, 0.05 * step);
    const double norm = mb::optim::grad_norm(store, tp);
    out.grad_norms.push_back(norm);
    opt.step(step, 0.01, global_batch, norm, true);
    ASSERT_FALSE(opt.diagnostics().empty()) << plugin_name << " reports no diagnostics";
    record_diagnostics(opt, out);
  }
  record_params(out);
}

void expect_split_equals_whole(const std::string& plugin_name, const nlohmann::json& hp, int64_t global_batch = 64) {
  mb::comm::LocalCommunicator local;
  RunResult whole;
  run(plugin_name, hp, global_batch, local, 1, whole);

  mb::comm::ThreadGroup group(2);
  RunResult split[2];
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r)
    ranks[r] = std::thread([&, r] { run(plugin_name, hp, global_batch, group.rank(r), 2, split[r]); });
  for (auto& t : ranks) t.join();

  int sharded = 0;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(split[r].diag.size(), whole.diag.size());
    for (size_t s = 0; s < whole.grad_norms.size(); ++s)
      EXPECT_NEAR(split[r].grad_norms[s], whole.grad_norms[s], 1e-9 * whole.grad_norms[s]) << "step " << s + 1;
    for (const auto& [key, values] : whole.diag) {
      const std::string name = key.substr(key.find('/') + 1);
      const bool is_sharded = split[r].info.at(name)->sharding.sharded;
      for (size_t s = 0; s < values.size(); ++s)  // norms in double: only summation order differs
        EXPECT_NEAR(split[r].diag.at(key)[s], values[s], 1e-6 * std::abs(values[s]))
            << plugin_name << ": " << key << (is_sharded ? " (sharded)" : " (replicated)") << " on rank " << r
            << " at step " << s + 1;
    }
    for (const auto& [name, full] : whole.params) {
      const auto& info = *split[r].info.at(name);
      sharded += info.sharding.sharded;
      const auto& p = split[r].params.at(name);
      for (size_t j = 0; j < p.size(); ++j) {  // fp32 updates; the float cast of lr x ratio may differ by an ulp
        const float ref = full[static_cast<size_t>(info.full_index(static_cast<int64_t>(j)))];
        ASSERT_NEAR(p[j], ref, 4e-6f * std::max(1.0f, std::abs(ref))) << name << "[" << j << "] on rank " << r;
      }
    }
  }
  EXPECT_GT(sharded, 0) << "the model has no sharded tensors at TP 2";
}

}  // namespace

TEST(TensorParallelNorms, LambNormsAndTrustRatiosOfSplitTensorsEqualTheWholeTensors) {
  expect_split_equals_whole("lamb", {{"max_grad_norm", 1.0}});
}

TEST(TensorParallelNorms, NvlambNormsAndTrustRatiosOfSplitTensorsEqualTheWholeTensors) {
  expect_split_equals_whole("lamb", {{"nvlamb", true}, {"max_grad_norm", 0.0}});
}

TEST(TensorParallelNorms, LarsNormsAndTrustRatiosOfSplitTensorsEqualTheWholeTensors) {
  expect_split_equals_whole("lars", {{"weight_decay", 0.01}, {"trust_coefficient", 0.02}});
}

TEST(TensorParallelNorms, LambNoiseIsIdenticalUnderASplit) {
  expect_split_equals_whole("lamb_noise", {{"ref_batch", 16}, {"scale", 1.0}}, 256);
}

TEST(TensorParallelNorms, AdafactorFactoredStateOfSplitTensorsEqualsTheWholeTensors) {
  // the example plugin: per-row and per-column statistics of matrices split by rows or columns
  expect_split_equals_whole("adafactor", {{"weight_decay", 0.01}});
}

TEST(TensorParallelNorms, LambEmbscaleNormsAndTrustRatiosOfSplitTensorsEqualTheWholeTensors) {
  expect_split_equals_whole("lamb_embscale", {{"ref_batch", 16}, {"alpha", 1.0}}, 256);
}

// ---- the distributed optimizer: data-parallel pieces ------------------------------------
// TP x DP ranks as threads: each DP rank holds a share of the gradient (shares summing to
// the whole run's), reduce-scatters it in buckets into its shards, steps only its pieces
// and all-gathers the masters. Every rank must end with the whole run's parameters, see its
// norms and trust ratios, and hold (gathered) its optimizer state.
namespace {

// Runs rank(tp, dp, index) on TP x DP threads, each in its own TP group (of its DP index) and
// DP group (of its TP index), index = d x TP + t, and waits for all of them.
template <class Rank>
void on_tp_by_dp(int tp_size, int dp_size, Rank rank) {
  std::vector<std::unique_ptr<mb::comm::ThreadGroup>> tp_groups, dp_groups;
  for (int d = 0; d < dp_size; ++d) tp_groups.push_back(std::make_unique<mb::comm::ThreadGroup>(tp_size));
  for (int t = 0; t < tp_size; ++t) dp_groups.push_back(std::make_unique<mb::comm::ThreadGroup>(dp_size));
  std::vector<std::thread> threads;
  for (int d = 0; d < dp_size; ++d)
    for (int t = 0; t < tp_size; ++t)
      threads.emplace_back([&, d, t] {
        rank(tp_groups[static_cast<size_t>(d)]->rank(t), dp_groups[static_cast<size_t>(t)]->rank(d),
             static_cast<size_t>(d * tp_size + t));
      });
  for (auto& th : threads) th.join();
}

struct ShardedRun {
  RunResult result;
  mb::optim::OptimizerState whole_state;
  int64_t piece_elements = 0;
};

void run_sharded(const std::string& plugin_name, const nlohmann::json& hp, int64_t global_batch, mb::comm::Communicator& tp,
                 int tp_size, mb::comm::Communicator& dp, ShardedRun& out) {
  const auto plugin = mb::optim::load_plugin(plugin_name, mb::optim::plugin_search_path({MEGABATCH_TEST_PLUGIN_DIR}));
  RunResult& res = out.result;
  res.model = mb::models::make_model(config(tp_size), tp, 11);
  auto& store = res.model->parameters();
  // small buckets: several per run, and (at DP 3) buckets that are no multiple of DP
  mb::optim::DpShards shards(store, mb::train::bucket_ranges(store, 3000), dp);
  out.piece_elements = shards.piece_elements();
  mb::optim::PluginOptimizer opt(plugin, store, tp, mb::optim::resolve_hparams(plugin, hp, "test"), 5, {}, &shards);
  const double share = static_cast<double>(dp.rank() + 1) / (dp.size() * (dp.size() + 1) / 2.0);
  for (int step = 1; step <= 3; ++step) {
    fill_grads(store, 0.05 * step * share);  // this rank's share of the gradient
    for (size_t b = 0; b < shards.buckets(); ++b) shards.start_reduce_scatter(b);
    dp.wait_all();
    opt.step(step, 0.01, global_batch, -1.0, true);  // the norm from the shards
    record_diagnostics(opt, res);
  }
  record_params(res);
  out.whole_state = opt.whole_state();
}

void expect_pieces_equal_whole(const std::string& plugin_name, const nlohmann::json& hp, int tp_size, int dp_size,
                               int64_t global_batch = 64) {
  SCOPED_TRACE(plugin_name + " at TP " + std::to_string(tp_size) + " x DP " + std::to_string(dp_size));
  mb::comm::LocalCommunicator local;
  RunResult whole;
  run(plugin_name, hp, global_batch, local, 1, whole);
  // the whole run's optimizer state, for the gathered pieces
  std::unique_ptr<mb::train::Model> ref = mb::models::make_model(config(1), local, 11);
  const auto plugin = mb::optim::load_plugin(plugin_name, mb::optim::plugin_search_path({MEGABATCH_TEST_PLUGIN_DIR}));
  mb::optim::PluginOptimizer ref_opt(plugin, ref->parameters(), local, mb::optim::resolve_hparams(plugin, hp, "test"), 5);
  for (int step = 1; step <= 3; ++step) {
    fill_grads(ref->parameters(), 0.05 * step);
    ref_opt.step(step, 0.01, global_batch, mb::optim::grad_norm(ref->parameters(), local), false);
  }

  std::vector<ShardedRun> runs(static_cast<size_t>(tp_size * dp_size));
  on_tp_by_dp(tp_size, dp_size, [&](mb::comm::Communicator& tp, mb::comm::Communicator& dp, size_t i) {
    run_sharded(plugin_name, hp, global_batch, tp, tp_size, dp, runs[i]);
  });

  for (int t = 0; t < tp_size; ++t) {  // each TP rank's pieces over DP: every element once
    int64_t pieces = 0;
    for (int d = 0; d < dp_size; ++d) pieces += runs[static_cast<size_t>(d * tp_size + t)].piece_elements;
    EXPECT_EQ(pieces, runs[static_cast<size_t>(t)].result.model->parameters().num_parameters()) << "TP rank " << t;
  }
  for (size_t k = 0; k < runs.size(); ++k) {
    const RunResult& r = runs[k].result;
    SCOPED_TRACE("rank " + std::to_string(k));
    ASSERT_EQ(r.diag.size(), whole.diag.size());
    for (const auto& [key, values] : whole.diag)
      for (size_t s = 0; s < values.size(); ++s)  // norms in double: only summation order differs
        EXPECT_NEAR(r.diag.at(key)[s], values[s], 1e-6 * std::abs(values[s])) << key << " at step " << s + 1;
    for (const auto& [name, full] : whole.params) {
      const auto& info = *r.info.at(name);
      const auto& p = r.params.at(name);
      for (size_t j = 0; j < p.size(); ++j) {  // fp32; the gradient shares add in another order
        const float want = full[static_cast<size_t>(info.full_index(static_cast<int64_t>(j)))];
        ASSERT_NEAR(p[j], want, 4e-6f * std::max(1.0f, std::abs(want))) << name << "[" << j << "]";
      }
    }
    // the gathered state is the whole run's (this TP rank's slice of it)
    const int tp_rank = static_cast<int>(k) % tp_size;
    for (const auto& [key, ref_state] : ref_opt.state()) {
      if (!ref_state.checkpointed) continue;
      const auto it = runs[k].whole_state.find(key);
      ASSERT_NE(it, runs[k].whole_state.end()) << key.first << "/" << key.second;
      const std::vector<float> mine = mb::to_host_f32(it->second.tensor), want = mb::to_host_f32(ref_state.tensor);
      ASSERT_EQ(it->second.full_shape(tp_size), ref_state.tensor.shape()) << key.first << "/" << key.second;
      for (size_t j = 0; j < mine.size(); ++j) {
        const float w = want[static_cast<size_t>(it->second.full_index(static_cast<int64_t>(j), tp_rank, tp_size))];
        ASSERT_NEAR(mine[j], w, 1e-5f * std::max(1e-3f, std::abs(w))) << key.first << "/" << key.second << "[" << j << "]";
      }
    }
  }
}

}  // namespace

TEST(DistributedOptimizer, LambPiecesOverDataParallelRanksStepAsTheWholeTensors) {
  for (const auto& [tp, dp] : std::vector<std::pair<int, int>>{{1, 2}, {1, 3}, {2, 2}, {1, 4}})
    expect_pieces_equal_whole("lamb", {{"max_grad_norm", 1.0}}, tp, dp);
}

TEST(DistributedOptimizer, LarsAndLambNoisePiecesStepAsTheWholeTensors) {
  expect_pieces_equal_whole("lars", {{"weight_decay", 0.01}, {"trust_coefficient", 0.02}}, 2, 2);
  // noise drawn for each piece at its elements' indices in the full tensor
  expect_pieces_equal_whole("lamb_noise", {{"ref_batch", 16}, {"scale", 1.0}}, 1, 3, 256);
}

TEST(DistributedOptimizer, APluginWithoutTheFlagIsRefusedByName) {
  mb::comm::LocalCommunicator local;
  auto model = mb::models::make_model(config(1), local, 11);
  mb::comm::ThreadGroup one(1);
  mb::optim::DpShards shards(model->parameters(), mb::train::bucket_ranges(model->parameters(), 1u << 20), one.rank(0));
  const auto plugin = mb::optim::load_plugin("adafactor", mb::optim::plugin_search_path({MEGABATCH_TEST_PLUGIN_DIR}));
  try {
    mb::optim::PluginOptimizer opt(plugin, model->parameters(), local, mb::optim::resolve_hparams(plugin, {}, "test"), 5, {},
                                   &shards);
    FAIL() << "adafactor (factored state) ran on pieces";
  } catch (const mb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer plugin 'adafactor'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--use-distributed-optimizer: it does not declare MB_PLUGIN_DP_SHARDS"),
              std::string::npos) << e.what();
  }
}

// Mixed precision: a rank keeps the fp32 masters of its shards only (the store's whole
// copy is released), steps them, and all-gathers the half parameters its peers rounded
// from theirs. bf16 at TP 1 x DP 2 and 3 and TP 2 x DP 2: the gathered masters are the whole
// run's, every rank's parameters are exactly those masters rounded, and masters restored
// from whole tensors (a checkpoint) land in the pieces and the parameters.
namespace {

struct HalfRun {
  std::vector<float> params, masters;  // flat, TP-local: bf16 values widened, fp32 masters
  size_t flat = 0, buckets = 0, master_elements = 0;
  bool refused_whole_masters = false;
  std::vector<float> restored_params, restored_pieces, pieces_want;
};

std::vector<float> flat_of(const mb::nn::ParameterStore& store, const std::vector<mb::Tensor>& per_param) {
  std::vector<float> out;
  for (size_t i = 0; i < store.count(); ++i) {
    const auto v = mb::to_host_f32(per_param[i]);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<float> params_of(const mb::nn::ParameterStore& store) {
  std::vector<mb::Tensor> p;
  for (size_t i = 0; i < store.count(); ++i) p.push_back(store.param(static_cast<int>(i)));
  return flat_of(store, p);
}

void run_half(const mb::optim::Plugin& plugin, const std::vector<double>& hp, mb::comm::Communicator& tp, int tp_size,
              mb::comm::Communicator* dp, HalfRun& out) {
  auto model = mb::models::make_model(config(tp_size), tp, 11, mb::DType::kBF16);
  auto& store = model->parameters();
  std::unique_ptr<mb::optim::DpShards> shards;
  if (dp) shards = std::make_unique<mb::optim::DpShards>(store, mb::train::bucket_ranges(store, 3000), *dp);
  mb::optim::PluginOptimizer opt(plugin, store, tp, hp, 5, {}, shards.get());
  const double share = dp ? static_cast<double>(dp->rank() + 1) / (dp->size() * (dp->size() + 1) / 2.0) : 1.0;
  for (int step = 1; step <= 3; ++step) {
    fill_grads(store, 0.05 * step * share);
    if (shards) {
      for (size_t b = 0; b < shards->buckets(); ++b) shards->start_reduce_scatter(b);
      dp->wait_all();
    }
    opt.step(step, 0.01, 64);
  }
  out.params = params_of(store);
  out.flat = store.flat_size();
  if (!shards) {
    std::vector<float> m;
    for (size_t i = 0; i < store.count(); ++i) {
      const auto v = mb::to_host_f32(store.master(static_cast<int>(i)));
      m.insert(m.end(), v.begin(), v.end());
    }
    out.masters = m;
    return;
  }
  out.master_elements = shards->master_elements();
  out.buckets = shards->buckets();
  try {
    (void)store.masters();
  } catch (const mb::Error&) {
    out.refused_whole_masters = true;
  }
  out.masters = flat_of(store, shards->whole_masters());
  // restore: masters of 1.5 x the current ones (as a checkpoint would bring other values)
  std::vector<mb::Tensor> other = shards->whole_masters();
  for (auto& t : other) mb::ops::scale(t, 1.5f);
  shards->restore_masters(other);
  out.restored_params = params_of(store);
  for (size_t i = 0; i < store.count(); ++i) {
    const auto id = static_cast<int>(i);
    const auto piece = mb::to_host_f32(shards->master_piece(id));
    out.restored_pieces.insert(out.restored_pieces.end(), piece.begin(), piece.end());
    const auto whole = mb::to_host_f32(other[i]);
    const auto& p = shards->piece(id);
    out.pieces_want.insert(out.pieces_want.end(), whole.begin() + p.begin, whole.begin() + p.end);
  }
}

}  // namespace

TEST(DistributedOptimizer, HalfPrecisionRanksKeepOnlyTheirShardOfTheMasters) {
  const auto plugin = mb::optim::load_plugin("lamb", mb::optim::plugin_search_path({MEGABATCH_TEST_PLUGIN_DIR}));
  const auto hp = mb::optim::resolve_hparams(plugin, {{"max_grad_norm", 1.0}}, "test");
  for (const auto& [tp_size, dp_size] : std::vector<std::pair<int, int>>{{1, 2}, {1, 3}, {2, 2}}) {
    SCOPED_TRACE("TP " + std::to_string(tp_size) + " x DP " + std::to_string(dp_size));
    // the whole run at this TP size, no DP
    mb::comm::ThreadGroup whole_tp(tp_size);
    std::vector<HalfRun> whole(static_cast<size_t>(tp_size));
    {
      std::vector<std::thread> threads;
      for (int t = 0; t < tp_size; ++t)
        threads.emplace_back([&, t] { run_half(plugin, hp, whole_tp.rank(t), tp_size, nullptr, whole[static_cast<size_t>(t)]); });
      for (auto& th : threads) th.join();
    }
    std::vector<HalfRun> runs(static_cast<size_t>(tp_size * dp_size));
    on_tp_by_dp(tp_size, dp_size, [&](mb::comm::Communicator& tp, mb::comm::Communicator& dp, size_t i) {
      run_half(plugin, hp, tp, tp_size, &dp, runs[i]);
    });
    for (size_t k = 0; k < runs.size(); ++k) {
      SCOPED_TRACE("rank " + std::to_string(k));
      const HalfRun& r = runs[k];
      const HalfRun& want = whole[k % static_cast<size_t>(tp_size)];
      EXPECT_TRUE(r.refused_whole_masters) << "the store still hands out whole masters";
      // its shard of every bucket: 1/DP of the flat buffer, up to each bucket's padding to DP
      const size_t elems = want.masters.size(), D = static_cast<size_t>(dp_size);
      EXPECT_GE(r.master_elements * D, r.flat);
      EXPECT_LT(r.master_elements * D, r.flat + r.buckets * D) << "fp32 masters kept: " << r.master_elements << " of " << r.flat;
      ASSERT_EQ(r.masters.size(), elems);
      ASSERT_EQ(r.params.size(), elems);
      for (size_t j = 0; j < elems; ++j) {
        // fp32 masters: the gradient shares are summed in another order
        ASSERT_NEAR(r.masters[j], want.masters[j], 4e-6f * std::max(1.0f, std::abs(want.masters[j]))) << "master " << j;
        // the parameters this rank computes with are the (gathered) masters rounded, bit for bit
        ASSERT_EQ(r.params[j], mb::round_to(mb::DType::kBF16, r.masters[j])) << "parameter " << j;
        ASSERT_EQ(r.restored_params[j], mb::round_to(mb::DType::kBF16, 1.5f * r.masters[j])) << "restored parameter " << j;
      }
      // every DP rank gathers the same masters
      EXPECT_EQ(r.masters, runs[k % static_cast<size_t>(tp_size)].masters);
      ASSERT_EQ(r.restored_pieces.size(), r.pieces_want.size());
      EXPECT_EQ(r.restored_pieces, r.pieces_want);
    }
  }
}

// Gathering pieces into whole tensors (checkpoints of the state and the masters) is exact
// bit for bit, the sign of a zero included.
TEST(DistributedOptimizer, GatheredPiecesKeepEveryBitNegativeZeroIncluded) {
  mb::comm::ThreadGroup dp(2);
  std::vector<std::vector<float>> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      mb::comm::LocalCommunicator local;
      auto model = mb::models::make_model(config(1), local, 11);
      mb::optim::DpShards shards(model->parameters(), mb::train::bucket_ranges(model->parameters(), 3000), dp.rank(r));
      const std::vector<float> mine = r == 0 ? std::vector<float>{-0.0f, 1.0f, 0.0f} : std::vector<float>{-2.5e-38f, -0.0f};
      got[static_cast<size_t>(r)] = mb::to_host_f32(shards.gather_pieces(mb::from_host(mine, {static_cast<int64_t>(mine.size())}),
                                                                         r == 0 ? 0 : 3, {5}));
    });
  for (auto& th : threads) th.join();
  const std::vector<float> want{-0.0f, 1.0f, 0.0f, -2.5e-38f, -0.0f};
  for (const auto& g : got) {
    ASSERT_EQ(g.size(), want.size());
    for (size_t j = 0; j < want.size(); ++j) {
      EXPECT_EQ(g[j], want[j]) << j;
      EXPECT_EQ(std::signbit(g[j]), std::signbit(want[j])) << "element " << j;
    }
  }
}
