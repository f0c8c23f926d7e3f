// Optimizer plugins: the loader's errors (unknown name, wrong ABI, missing symbol, bad
// hyperparameters), the library's lifetime, sgd and adamw against torch.optim, and a
// plugin that throws mid-run: the run stops with its message and metrics.h5 stays readable.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>
#include <sstream>

#include "core/comm/communicator.h"
#include "core/nn/parameters.h"
#include "core/optim/optimizer.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
namespace fs = std::filesystem;
using mb::testing::expect_error;

namespace {
std::vector<fs::path> test_dirs() { return {MEGABATCH_TEST_PLUGIN_DIR}; }
std::vector<fs::path> default_dirs() { return mb::optim::plugin_search_path(); }
}  // namespace

TEST(PluginLoader, UnknownNameListsAvailablePluginsAndSearchedDirectories) {
  expect_error([] { mb::optim::load_plugin("adamx", default_dirs()); }, "did you mean 'adamw'");
  expect_error([] { mb::optim::load_plugin("adamx", default_dirs()); }, "available: adamw, lamb, lamb_embscale, lamb_noise, lars, sgd");
  expect_error([] { mb::optim::load_plugin("adamx", default_dirs()); }, "lib/megabatch/plugins");
  expect_error([] { mb::optim::load_plugin("adamx", default_dirs()); }, "--plugin-path");
  // a mistyped --plugin-path is pointed out; a directory that exists is not
  auto dirs = default_dirs();
  dirs.insert(dirs.begin(), "/nonexistent/plugins");
  expect_error([&] { mb::optim::load_plugin("adamx", dirs); }, "in /nonexistent/plugins (no such directory), ");
  try {
    mb::optim::load_plugin("adamx", dirs);
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()).find(default_dirs().front().string() + " (no such"), std::string::npos) << e.what();
  }
}

TEST(PluginLoader, WrongAbiVersionNamesBothVersions) {
  expect_error([] { mb::optim::load_plugin("bad_abi", test_dirs()); },
               "plugin ABI version 999 but this megabatch speaks ABI version " + std::to_string(MB_PLUGIN_ABI_VERSION));
}

// A schema at odds with itself is the plugin author's mistake: named when the plugin loads,
// with the file, the plugin and the entry, for each way a schema can contradict itself.
TEST(PluginLoader, ASchemaAtOddsWithItselfIsRefusedNamingTheEntry) {
  expect_error([] { mb::optim::load_plugin("bad_schema", test_dirs()); },
               "megabatch_bad_schema.so: plugin 'bad_schema', hyperparameter 0 ('beta') of its schema: default 2 is "
               "outside its range [0, 1]");
  auto check = [](const std::vector<mb_hparam_spec>& schema) {  // plugin 'mine' in mine.so with this schema
    mb_plugin_entry e{};
    e.name = "mine";
    e.hparams = schema.data();
    e.num_hparams = schema.size();
    mb::optim::check_plugin_schema(e, "mine.so");
  };
  auto refused = [&](const std::vector<mb_hparam_spec>& schema, const std::string& why) {
    expect_error([&] { check(schema); }, why);
  };
  const mb_hparam_spec beta{"beta", MB_HPARAM_FLOAT, 0.9, 0.0, 1.0, "momentum"};
  refused({beta, {"lr_scale", MB_HPARAM_FLOAT, 1.0, 0.0, 2.0, ""}, beta},
          "mine.so: plugin 'mine', hyperparameter 2 ('beta') of its schema: declared twice");
  refused({{"Beta 2", MB_HPARAM_FLOAT, 0.9, 0.0, 1.0, ""}}, "('Beta 2') of its schema: a name is snake_case");
  refused({{"a=b", MB_HPARAM_FLOAT, 0.9, 0.0, 1.0, ""}}, "('a=b') of its schema: a name is snake_case");
  refused({{nullptr, MB_HPARAM_FLOAT, 0.9, 0.0, 1.0, ""}}, "hyperparameter 0 (no name) of its schema: a name is");
  refused({{"beta", static_cast<mb_hparam_type>(3), 0.9, 0.0, 1.0, ""}}, "type 3 is none of MB_HPARAM_FLOAT");
  refused({{"beta", MB_HPARAM_FLOAT, 0.9, 1.0, 0.0, ""}}, "range [1, 0] is empty");
  refused({{"beta", MB_HPARAM_FLOAT, -0.5, 0.0, 1.0, ""}}, "default -0.5 is outside its range [0, 1]");
  refused({{"steps", MB_HPARAM_INT, 2.5, 0.0, 10.0, ""}}, "default 2.5 of an int is not a whole number");
  refused({{"on", MB_HPARAM_BOOL, 0.5, 0.0, 1.0, ""}}, "default 0.5 of a bool is neither 0 nor 1");
  EXPECT_NO_THROW(check({beta, {"warmup_steps", MB_HPARAM_INT, 0, 0, 1e6, ""}, {"nesterov", MB_HPARAM_BOOL, 1, 0, 1, ""}}));
}

TEST(PluginLoader, MissingEntrySymbolIsNamed) {
  expect_error([] { mb::optim::load_plugin("no_entry", test_dirs()); },
               "the symbol 'megabatch_optimizer_plugin' is missing");
}

// One broken file in the plugin path (a wrong ABI, no entry symbol, a bad schema, not a library)
// is listed as broken with why; the good plugins are still listed.
TEST(PluginLoader, ListOptimizersNamesBrokenFilesAndListsTheRest) {
  mb::testing::TempDir tmp;
  mb::testing::write_text(tmp / "megabatch_garbage.so", "not an ELF file");
  const auto r = mb::testing::run_command(mb::testing::bin_dir() + "/train --list-optimizers --plugin-path " +
                                          std::string(MEGABATCH_TEST_PLUGIN_DIR) + " " + tmp.path().string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("bad_abi  BROKEN: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("plugin ABI version 999"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no_entry  BROKEN: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("garbage  BROKEN: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cannot load the plugin library"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bad_schema  BROKEN: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("4 plugin file(s) could not be loaded"), std::string::npos) << r.output;
  for (const char* good : {"adamw 1.2.0", "lamb 1.2.0", "sgd 1.3.0", "adafactor "})
    EXPECT_NE(r.output.find(good), std::string::npos) << good << " is still listed:\n" << r.output;
  // what each takes, from its entry.flags: adamw all three, adafactor (factored state) all but the
  // distributed optimizer
  const auto block = [&](const std::string& name) {  // from its name line to its file line
    const size_t at = r.output.find(name + " ");
    return at == std::string::npos ? std::string() : r.output.substr(at, r.output.find("  file: ", at) - at);
  };
  EXPECT_NE(block("adamw").find("\n  takes: --use-distributed-optimizer --weight-decay-incr-style --decoupled-lr\n"),
            std::string::npos)
      << block("adamw");
  EXPECT_NE(block("adafactor").find("\n  takes: --weight-decay-incr-style --decoupled-lr\n"), std::string::npos)
      << block("adafactor");
  EXPECT_EQ(block("throwing").find("takes:"), std::string::npos) << block("throwing");
  EXPECT_NE(block("throwing"), "");
}

TEST(PluginLoader, HyperparametersAreCheckedAgainstTheSchema) {
  const auto p = mb::optim::load_plugin("adamw", default_dirs());
  expect_error([&] { mb::optim::resolve_hparams(p, {{"beta3", 0.9}}, "optimizer_params"); },
               "optimizer_params.beta3: plugin 'adamw' has no hyperparameter 'beta3'; did you mean 'beta1'?");
  expect_error([&] { mb::optim::resolve_hparams(p, {{"beta1", 1.5}}, "optimizer_params"); },
               "optimizer_params.beta1: 1.5 is out of range [0, 0.999999]");
  // A limit is shown as written: six digits would print beta2's 0.999999999 as 1, and refuse 1
  // as "out of range [0, 1]".
  expect_error(
      [&] {
        mb::optim::resolve_hparams(p, {{"beta2", 1.0}}, "optimizer_params");
      },
      "optimizer_params.beta2: 1.0 is out of range [0, 0.999999999]");
  const std::string listed = mb::optim::describe_hparams(p);
  EXPECT_NE(listed.find("beta2 (float, default 0.999, range [0, 0.999999999])"), std::string::npos) << listed;
  expect_error([&] { mb::optim::resolve_hparams(p, {{"eps", "small"}}, "optimizer_params"); },
               "optimizer_params.eps: expected a number");
  const auto s = mb::optim::load_plugin("sgd", default_dirs());
  expect_error([&] { mb::optim::resolve_hparams(s, {{"nesterov", 1}}, "x"); }, "x.nesterov: expected true or false");
  const auto v = mb::optim::resolve_hparams(p, {{"beta2", 0.95}}, "x");
  EXPECT_EQ(v, (std::vector<double>{0.9, 0.95, 1e-8, 0.01})) << "schema order, defaults filled in";
  EXPECT_EQ(mb::optim::hparam_index(p, "beta2"), 1);
  EXPECT_EQ(mb::optim::hparam_index(p, "momentum"), -1) << "adamw has no momentum";
  EXPECT_EQ(mb::optim::hparams_json(p, v),
            (nlohmann::json{{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}, {"weight_decay", 0.01}}));
  expect_error([&] { mb::optim::hparams_json(p, {0.9}); }, "1 hyperparameter values for a schema of 4");
}

TEST(PluginLoader, LibraryStaysLoadedWhileAnOptimizerFromItLives) {
  mb::comm::LocalCommunicator tp;
  mb::nn::ParameterStore store;
  store.add({"w", mb::nn::Role::kWeight, 0, {4}, {}, mb::nn::Init::ones()});
  store.finalize();
  store.initialize(1);
  const std::string file = (fs::path(MEGABATCH_TEST_PLUGIN_DIR) / "megabatch_throwing.so").string();
  auto loaded = [&] {
    void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (h) dlclose(h);
    return h != nullptr;
  };
  ASSERT_FALSE(loaded());
  {
    std::unique_ptr<mb::optim::PluginOptimizer> opt;
    {
      auto p = mb::optim::load_plugin("throwing", test_dirs());
      opt = std::make_unique<mb::optim::PluginOptimizer>(p, store, tp, std::vector<double>{5}, 0);
    }  // every Plugin copy gone
    EXPECT_TRUE(loaded());
    EXPECT_EQ(opt->plugin().library.use_count(), 1) << "the optimizer holds the library handle";
    store.grads()[0] = 1.0f;
    opt->step(1, 0.5, 1);  // code in the library still runs
    EXPECT_FLOAT_EQ(store.param(0)[0], 0.5f);
    expect_error([&] { opt->step(5, 0.5, 1); }, "optimizer plugin 'throwing' failed at step 5: deliberate failure at step 5");
  }
  // (glibc may keep a C++ library mapped after dlclose because of its unique symbols, so
  // unloading itself is not asserted.)
}

// ABI 5: the step's numbers reach the plugin in run's-device memory (host memory here), at
// one address for the whole run and holding what the host was given (the plugin's learning
// rate comes only from there); the global norm too. Scratch asked in the same sizes and order
// gets the same addresses once the host's block holds it all (from the second step on).
// These are what let a step launch the same kernels with the same arguments every step.
TEST(PluginHost, StepValuesKeepOneAddressAndRepeatedScratchTheSameAddresses) {
  mb::comm::LocalCommunicator tp;
  mb::nn::ParameterStore store;
  store.add({"w", mb::nn::Role::kWeight, 0, {4}, {}, mb::nn::Init::ones()});
  store.finalize();
  store.initialize(1);
  mb::optim::PluginOptimizer opt(mb::optim::load_plugin("step_values", test_dirs()), store, tp, {0.0, 0.25}, 0);
  float w = 1.0f;
  for (int s = 1; s <= 4; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    for (int64_t j = 0; j < 4; ++j) store.grads()[j] = 2.0f;
    const double lr = 0.125 * s;  // exact in binary: the expected weights are exact too
    // the weight decay: the plugin's weight_decay (0.25) until a schedule sets the step's
    const double wd = s <= 2 ? 0.25 : 0.0625 * s;
    if (s > 2) opt.set_weight_decay(wd);
    opt.step(s, lr, 8 * s, 0.5 + s, true);
    w -= static_cast<float>(lr) * 2.0f;
    const auto& d = opt.diagnostics();
    EXPECT_EQ(d.at("values_step")[0], s);
    EXPECT_EQ(d.at("values_lr")[0], lr);
    EXPECT_EQ(d.at("values_batch")[0], 8 * s);
    EXPECT_EQ(d.at("values_wd")[0], wd);
    EXPECT_EQ(d.at("info_wd")[0], wd);
    EXPECT_EQ(d.at("grad_norm")[0], 0.5 + s);
    EXPECT_EQ(d.at("values_moved")[0], 0.0) << "info.values and info.grad_norm keep their addresses";
    if (s >= 3) {
      EXPECT_EQ(d.at("scratch_moved")[0], 0.0) << "the same scratch requests, the same addresses";
    }
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(store.param(0)[j], w) << "the learning rate read through info.values";
  }
}

namespace {
// Runs `steps` of plugin `name` and of the PyTorch reference (tests/reference/optim_torch.py)
// on the same random parameters and gradients, and expects the same parameters, optimizer
// state and (where the plugin reports them) trust ratios. With `wd_steps`, step s decays by
// wd_steps[s] (a schedule's values; the reference sets its groups' weight decay each step).
void compare_with_torch(const std::string& name, const nlohmann::json& hp, const std::map<std::string, double>& attrs,
                        int steps, float grad_std = 1.0f, const std::vector<double>& wd_steps = {},
                        const std::vector<double>& decoupled_lr_steps = {}) {
  mb::testing::TempDir tmp;
  mb::comm::LocalCommunicator tp;
  mb::nn::ParameterStore store;
  store.add({"embedding.word_embeddings.weight", mb::nn::Role::kEmbedding, -1, {11, 6}, {}, mb::nn::Init::normal(1.0)});
  store.add({"layer.weight", mb::nn::Role::kWeight, 0, {7, 5}, {}, mb::nn::Init::normal(1.0)});
  store.add({"layer.bias", mb::nn::Role::kBias, 0, {7}, {}, mb::nn::Init::normal(1.0)});
  store.add({"ln.weight", mb::nn::Role::kNorm, 0, {13}, {}, mb::nn::Init::normal(1.0)});
  store.finalize();
  store.initialize(3);
  const int64_t global_batch = attrs.count("global_batch") ? static_cast<int64_t>(attrs.at("global_batch")) : 1;
  const auto plugin = mb::optim::load_plugin(name, default_dirs());
  mb::optim::PluginOptimizer opt(plugin, store, tp, mb::optim::resolve_hparams(plugin, hp, "test"), 77);
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.0f, grad_std);
  std::vector<std::vector<float>> grads(store.count()), noise(store.count());
  for (size_t i = 0; i < store.count(); ++i) {
    const size_t n = store.info(static_cast<int>(i)).numel;
    for (size_t k = 0; k < steps * n; ++k) grads[i].push_back(nd(g));
    noise[i].resize(steps * n);
    for (int s = 0; s < steps; ++s) opt.draw_normal(i, s + 1, noise[i].data() + s * n, n);
  }
  {
    mb::testing::H5File f((tmp / "in.h5").string(), mb::testing::H5File::kCreate);
    for (size_t i = 0; i < store.count(); ++i) {
      const auto& info = store.info(static_cast<int>(i));
      const float* p = store.param(static_cast<int>(i)).data();
      f.write("params/" + std::to_string(i), std::vector<float>(p, p + info.numel), {info.numel});
      f.write("grads/" + std::to_string(i), grads[i], {static_cast<hsize_t>(steps), info.numel});
      f.write("noise/" + std::to_string(i), noise[i], {static_cast<hsize_t>(steps), info.numel});
      f.write("role/" + std::to_string(i), std::vector<int32_t>{static_cast<int32_t>(info.role)}, {1});
    }
    for (const auto& [k, v] : attrs) f.attr(k, v);
    if (!attrs.count("global_batch")) f.attr("global_batch", 1.0);
    f.attr("steps", steps);
    f.attr("optimizer", name);
    if (!wd_steps.empty()) f.write("weight_decay_steps", wd_steps, {static_cast<hsize_t>(steps)});
    if (!decoupled_lr_steps.empty()) {  // Megatron decouples the word embeddings (the output layer shares them)
      f.write("decoupled_lr_steps", decoupled_lr_steps, {static_cast<hsize_t>(steps)});
      for (size_t i = 0; i < store.count(); ++i)
        f.write("decoupled/" + std::to_string(i),
                std::vector<int32_t>{store.info(static_cast<int>(i)).name == "embedding.word_embeddings.weight"}, {1});
    }
  }
  const auto r = mb::testing::run_command("/usr/bin/python3 " + mb::testing::source_dir() +
                                          "/tests/reference/optim_torch.py " + (tmp / "in.h5").string() + " " +
                                          (tmp / "out.h5").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::vector<double>> trust(store.count());
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < store.count(); ++i) {
      const size_t n = store.info(static_cast<int>(i)).numel;
      std::copy(grads[i].begin() + s * n, grads[i].begin() + (s + 1) * n, store.grad(static_cast<int>(i)).data());
    }
    if (!wd_steps.empty()) opt.set_weight_decay(wd_steps[s]);
    if (!decoupled_lr_steps.empty()) opt.set_decoupled_lr(decoupled_lr_steps[s]);
    opt.step(s + 1, attrs.at("lr"), global_batch, -1.0, true);
    if (opt.diagnostics().count("trust_ratio"))
      for (size_t i = 0; i < store.count(); ++i) trust[i].push_back(opt.diagnostics().at("trust_ratio")[i]);
  }
  mb::testing::H5File out((tmp / "out.h5").string(), mb::testing::H5File::kRead);
  // fp32 elementwise updates, a few roundings per step: 64 eps32 relative per step
  const float tol = 64.0f * static_cast<float>(steps) * FLT_EPSILON;
  for (size_t i = 0; i < store.count(); ++i) {
    const auto& info = store.info(static_cast<int>(i));
    const auto ref = out.read<float>("params/" + std::to_string(i));
    for (size_t j = 0; j < info.numel; ++j)
      EXPECT_NEAR(store.param(static_cast<int>(i))[j], ref[j], tol * std::max(1.0f, std::abs(ref[j])))
          << name << " " << info.name << "[" << j << "]";
    if (out.has("trust/" + std::to_string(i))) {
      const auto ref_trust = out.read<double>("trust/" + std::to_string(i));
      ASSERT_EQ(trust[i].size(), ref_trust.size()) << name << " reports no trust_ratio for " << info.name;
      for (size_t s = 0; s < ref_trust.size(); ++s)
        EXPECT_NEAR(trust[i][s], ref_trust[s], tol * std::max(1.0, std::abs(ref_trust[s])))
            << name << " trust ratio of " << info.name << " at step " << s + 1;
    }
  }
  for (const auto& [key, s] : opt.state()) {
    if (!s.checkpointed) continue;  // scratch (lamb_noise's draws)
    const mb::Tensor& t = s.tensor;
    const int i = store.find(key.first);
    const std::string ref_name = "state/" + std::to_string(i) + "/" + key.second;  // torch's state names
    ASSERT_TRUE(out.has(ref_name)) << key.second;
    const auto ref = out.read<float>(ref_name);
    for (size_t j = 0; j < ref.size(); ++j)
      EXPECT_NEAR(t[j], ref[j], tol * std::max(1.0f, std::abs(ref[j]))) << key.first << " " << key.second;
  }
}
}  // namespace

TEST(PluginNumerics, AdamwMatchesTorchAdamW) {
  compare_with_torch("adamw", {{"beta1", 0.8}, {"beta2", 0.99}, {"eps", 1e-6}, {"weight_decay", 0.1}},
                     {{"lr", 0.01}, {"beta1", 0.8}, {"beta2", 0.99}, {"eps", 1e-6}, {"weight_decay", 0.1}}, 5);
}

TEST(PluginNumerics, SgdNesterovMatchesTorchSgd) {
  compare_with_torch("sgd", {{"momentum", 0.9}, {"nesterov", true}, {"weight_decay", 0.05}},
                     {{"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0.0}, {"weight_decay", 0.05}, {"nesterov", 1}}, 5);
}

TEST(PluginNumerics, SgdDampenedMomentumMatchesTorchSgd) {
  compare_with_torch("sgd", {{"momentum", 0.5}, {"dampening", 0.3}},
                     {{"lr", 0.1}, {"momentum", 0.5}, {"dampening", 0.3}, {"weight_decay", 0.0}, {"nesterov", 0}}, 4);
}

namespace {
std::map<std::string, double> lamb_attrs(double lr, double wd, double max_grad_norm, bool nvlamb) {
  return {{"lr", lr}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-6}, {"weight_decay", wd},
          {"max_grad_norm", max_grad_norm}, {"nvlamb", nvlamb ? 1.0 : 0.0}};
}
nlohmann::json lamb_hp(double wd, double max_grad_norm, bool nvlamb) {
  return {{"weight_decay", wd}, {"max_grad_norm", max_grad_norm}, {"nvlamb", nvlamb}};
}
}  // namespace

// Gradients of norm ~10 > max_grad_norm 1: the pre-normalization is active.
TEST(PluginNumerics, LambMatchesApexSemanticsWithPreNormalization) {
  compare_with_torch("lamb", lamb_hp(0.01, 1.0, false), lamb_attrs(0.02, 0.01, 1.0, false), 6);
}

TEST(PluginNumerics, LambWithoutPreNormalizationAndWithNvlambMatches) {
  compare_with_torch("lamb", lamb_hp(0.1, 0.0, true), lamb_attrs(0.02, 0.1, 0.0, true), 6, 0.05f);
}

TEST(PluginNumerics, LambWithoutWeightDecayUsesNoTrustRatio) {
  compare_with_torch("lamb", lamb_hp(0.0, 1.0, false), lamb_attrs(0.02, 0.0, 1.0, false), 4);
}

// A weight-decay schedule's values, step by step, from 0: each plugin decays by the step's
// value, and LAMB's decayed tensors go without a trust ratio while it is 0 (as Apex's do in a
// group whose weight_decay is 0), then take it.
TEST(PluginNumerics, EachPluginDecaysByTheStepsWeightDecay) {
  const std::vector<double> wd = {0.0, 0.05, 0.1, 0.15, 0.2};
  compare_with_torch("adamw", {{"weight_decay", 0.01}},
                     {{"lr", 0.05}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 0.01}}, 5, 1.0f,
                     wd);
  compare_with_torch("sgd", {{"momentum", 0.9}},
                     {{"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0.0}, {"weight_decay", 0.0}, {"nesterov", 0}}, 5,
                     1.0f, wd);
  compare_with_torch("lamb", lamb_hp(0.01, 1.0, false), lamb_attrs(0.02, 0.01, 1.0, false), 5, 1.0f, wd);
  compare_with_torch(
      "lars", {{"momentum", 0.9}, {"trust_coefficient", 0.02}, {"eps", 1e-9}},
      {{"lr", 0.5}, {"momentum", 0.9}, {"trust_coefficient", 0.02}, {"weight_decay", 0.0}, {"eps", 1e-9}}, 5, 1.0f, wd);
}

// Megatron's --decoupled-lr: the word embeddings step at a learning rate of their own, here
// one that changes every step and is 0 at one (a frozen step), the other tensors at lr.
TEST(PluginNumerics, EachPluginStepsTheEmbeddingAtTheDecoupledLr) {
  auto times = [](double lr) {
    std::vector<double> out;
    for (double k : {3.0, 0.0, 0.5, 2.0, 1.0}) out.push_back(k * lr);
    return out;
  };
  compare_with_torch("adamw", {{"weight_decay", 0.01}},
                     {{"lr", 0.05}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 0.01}}, 5, 1.0f,
                     {}, times(0.05));
  compare_with_torch("sgd", {{"momentum", 0.9}, {"weight_decay", 0.01}},
                     {{"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0.0}, {"weight_decay", 0.01}, {"nesterov", 0}}, 5,
                     1.0f, {}, times(0.1));
  compare_with_torch("lamb", lamb_hp(0.01, 1.0, false), lamb_attrs(0.02, 0.01, 1.0, false), 5, 1.0f, {}, times(0.02));
  compare_with_torch(
      "lars", {{"momentum", 0.9}, {"trust_coefficient", 0.02}, {"weight_decay", 0.01}, {"eps", 1e-9}},
      {{"lr", 0.5}, {"momentum", 0.9}, {"trust_coefficient", 0.02}, {"weight_decay", 0.01}, {"eps", 1e-9}}, 5, 1.0f, {},
      times(0.5));
  auto hp = lamb_hp(0.01, 1.0, false);
  hp["multiplier"] = 3.5;
  auto attrs = lamb_attrs(0.02, 0.01, 1.0, false);
  attrs.insert({{"alpha", 1.0}, {"ref_batch", 512}, {"multiplier", 3.5}, {"global_batch", 64}});
  compare_with_torch("lamb_embscale", hp, attrs, 5, 1.0f, {}, times(0.02));  // the multiplier on the decoupled lr
}

TEST(PluginNumerics, LarsMatchesReference) {
  compare_with_torch("lars", {{"momentum", 0.9}, {"trust_coefficient", 0.02}, {"weight_decay", 0.01}, {"eps", 1e-9}},
                     {{"lr", 0.5}, {"momentum", 0.9}, {"trust_coefficient", 0.02}, {"weight_decay", 0.01}, {"eps", 1e-9}},
                     6);
}

TEST(PluginNumerics, LambEmbscaleScalesOnlyEmbeddingsByTheBatchRule) {
  auto hp = lamb_hp(0.01, 1.0, false);
  hp["alpha"] = 1.0;
  hp["ref_batch"] = 64;
  auto attrs = lamb_attrs(0.02, 0.01, 1.0, false);
  attrs.insert({{"alpha", 1.0}, {"ref_batch", 64}, {"multiplier", 0.0}, {"global_batch", 1024}});
  compare_with_torch("lamb_embscale", hp, attrs, 5);
}

TEST(PluginNumerics, LambEmbscaleExplicitMultiplierMatches) {
  auto hp = lamb_hp(0.01, 1.0, false);
  hp["multiplier"] = 3.5;
  auto attrs = lamb_attrs(0.02, 0.01, 1.0, false);
  attrs.insert({{"alpha", 1.0}, {"ref_batch", 512}, {"multiplier", 3.5}, {"global_batch", 64}});
  compare_with_torch("lamb_embscale", hp, attrs, 4);
}

TEST(PluginNumerics, LambNoiseMatchesReferenceGivenTheSameDraws) {
  auto hp = lamb_hp(0.01, 1.0, false);
  hp["scale"] = 0.7;
  hp["ref_batch"] = 32;
  hp["decay"] = 0.5;
  auto attrs = lamb_attrs(0.02, 0.01, 1.0, false);
  attrs.insert({{"scale", 0.7}, {"ref_batch", 32}, {"decay", 0.5}, {"global_batch", 512}});
  compare_with_torch("lamb_noise", hp, attrs, 5);
}

namespace {
std::string train_cmd(const fs::path& data, const fs::path& run, const std::string& extra) {
  return mb::testing::bin_dir() + "/train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 "
         "--micro-batch-size 2 --train-iters 6 --lr 1e-3 --log-interval 1 --eval-iters 0 --threads 1 --data-path " +
         (data / "brown_gpt2_text_document").string() + " --run-dir " + run.string() + " " + extra;
}
}  // namespace

TEST(PluginRun, ThrowingStepStopsTheRunWithItsMessageAndMetricsStayReadable) {
  mb::testing::TempDir tmp;
  ASSERT_EQ(mb::testing::run_command(mb::testing::bin_dir() + "/preprocess brown --output-dir " + (tmp / "data").string()).exit_code, 0);
  const auto r = mb::testing::run_command(train_cmd(tmp / "data", tmp / "run",
                                                    "--optimizer throwing --optimizer-params fail_at=4 --plugin-path " +
                                                        std::string(MEGABATCH_TEST_PLUGIN_DIR)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("train: error: optimizer plugin 'throwing' failed at step 4: deliberate failure at step 4"),
            std::string::npos) << r.output;
  // h5py, a reader independent of our writer, sees the three finished iterations.
  const auto py = mb::testing::run_command(
      "/usr/bin/python3 -c \"import h5py; f = h5py.File('" + (tmp / "run" / "metrics.h5").string() +
      "', 'r'); print(list(f['train/iteration'][()]), f.attrs['optimizer'])\"");
  EXPECT_EQ(py.exit_code, 0) << py.output;
  EXPECT_NE(py.output.find("[1.0, 2.0, 3.0] throwing"), std::string::npos) << py.output;

  const auto abi = mb::testing::run_command(train_cmd(tmp / "data", tmp / "run2", "--optimizer bad_abi --plugin-path " +
                                                                                     std::string(MEGABATCH_TEST_PLUGIN_DIR)));
  EXPECT_EQ(abi.exit_code, 1);
  EXPECT_NE(abi.output.find("plugin ABI version 999 but this megabatch speaks ABI version " + std::to_string(MB_PLUGIN_ABI_VERSION)), std::string::npos)
      << abi.output;
}

// --weight-decay-incr-style: the schedule's value reaches the plugin at each iteration as
// Megatron's OptimizerParamScheduler computes it from the samples consumed before it, and
// metrics.h5 has it as train/weight_decay. A plugin that does not declare it takes no schedule,
// and a weight decay given beside one (which it would override) is refused, both before the
// run starts and by --check.
TEST(PluginRun, AWeightDecayScheduleReachesThePluginEachIterationAsMegatronComputesIt) {
  mb::testing::TempDir tmp;
  const fs::path data = mb::testing::brown_data();
  const std::string plugins = " --plugin-path " + std::string(MEGABATCH_TEST_PLUGIN_DIR);
  const std::string cosine = " --weight-decay-incr-style cosine --start-weight-decay 0.1 --end-weight-decay 0.3";
  auto r = mb::testing::run_command(
      train_cmd(data, tmp / "run", "--optimizer step_values --diagnostics-interval 1" + plugins + cosine));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(", weight decay 0.1 cosine to 0.3 over 12 samples"), std::string::npos) << r.output;
  const auto py = mb::testing::run_command(
      "/usr/bin/python3 -c \"import h5py\nf = h5py.File('" + (tmp / "run" / "metrics.h5").string() +
      "', 'r')\nfor a, b, c in zip(f['optimizer/values_wd'][:, 0], f['optimizer/info_wd'][:, 0], "
      "f['train/weight_decay'][()]): print(repr(a), repr(b), repr(c))\"");
  ASSERT_EQ(py.exit_code, 0) << py.output;
  std::istringstream rows(py.output);
  int iteration = 0;
  for (double plugin_values, plugin_info, logged; rows >> plugin_values >> plugin_info >> logged;) {
    ++iteration;
    // 2 samples an iteration, 12 in the run: r = samples before it / 12, from 0.1 to 0.3
    const double ratio = 2.0 * (iteration - 1) / 12.0;
    const double expected = 0.1 + 0.2 * (1.0 - std::cos(M_PI * ratio)) / 2.0;
    EXPECT_NEAR(plugin_values, expected, 1e-15) << "iteration " << iteration;
    EXPECT_EQ(plugin_info, plugin_values) << "iteration " << iteration;
    EXPECT_EQ(logged, plugin_values) << "iteration " << iteration;
  }
  EXPECT_EQ(iteration, 6) << py.output;

  for (const char* check : {"", " --check"}) {
    SCOPED_TRACE(check[0] ? "with --check" : "a run");
    r = mb::testing::run_command(train_cmd(data, tmp / "refused", "--optimizer throwing" + plugins + cosine + check));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("optimizer plugin 'throwing' (" + std::string(MEGABATCH_TEST_PLUGIN_DIR) +
                            "/megabatch_throwing.so) cannot take a weight-decay schedule (--weight-decay-incr-style): "
                            "it does not declare MB_PLUGIN_WD_SCHEDULE"),
              std::string::npos)
        << r.output;
    r = mb::testing::run_command(
        train_cmd(data, tmp / "refused",
                  "--optimizer step_values --optimizer-params weight_decay=0.2" + plugins + cosine + check));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("--weight-decay-incr-style cosine sets the weight decay from --start-weight-decay to "
                            "--end-weight-decay, so optimizer_params.weight_decay 0.2 would be ignored; drop it"),
              std::string::npos)
        << r.output;
  }
  EXPECT_FALSE(fs::exists(tmp / "refused" / "config.json")) << "refused before the run directory is written";
}

// Megatron's --decoupled-lr and --decoupled-min-lr: the word embeddings (and only they) step
// at a learning rate of their own, under the same warmup (from --lr-warmup-init) and decay;
// every iteration's value reaches the plugin (info and values), metrics.h5 and the log line
// as Megatron computes and prints it, and a resumed run goes on with it (another one refused).
TEST(PluginRun, ADecoupledLrReachesTheEmbeddingEachIterationAsMegatronComputesIt) {
  mb::testing::TempDir tmp;
  const fs::path data = mb::testing::brown_data();
  const std::string plugins = " --plugin-path " + std::string(MEGABATCH_TEST_PLUGIN_DIR);
  const std::string schedule = " --lr-decay-style cosine --min-lr 1e-4 --lr-warmup-iters 2 --lr-warmup-init 1e-5";
  const std::string decoupled = " --decoupled-lr 3e-3 --decoupled-min-lr 5e-4";
  const std::string ckpt = " --save " + (tmp / "ckpt").string() + " --load " + (tmp / "ckpt").string();
  auto r = mb::testing::run_command(train_cmd(data, tmp / "run",
                                              "--optimizer step_values --diagnostics-interval 1" + plugins + schedule +
                                                  decoupled + ckpt + " --exit-interval 3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(", embedding lr 0.003 to 0.0005 (--decoupled-lr)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" learning rate: 1.000000E-05 | decoupled learning rate: 1.000000E-05 | global batch"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(" learning rate: 1.000000E-03 | decoupled learning rate: 3.000000E-03 | global batch"),
            std::string::npos)
      << "iteration 3, the warmup's end: " << r.output;
  r = mb::testing::run_command(train_cmd(
      data, tmp / "run", "--optimizer step_values --diagnostics-interval 1" + plugins + schedule + decoupled + ckpt));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto py = mb::testing::run_command(
      "/usr/bin/python3 -c \"import h5py\nf = h5py.File('" + (tmp / "run" / "metrics.h5").string() +
      "', 'r')\nnames = [n.decode() for n in f['optimizer/tensor_names'][()]]\n"
      "print(' '.join(n for n, e in zip(names, f['optimizer/embedding_or_output'][0]) if e == 1))\n"
      "for a, b, c, d in zip(f['optimizer/values_dlr'][:, 0], f['optimizer/info_dlr'][:, 0], "
      "f['train/decoupled_learning_rate'][()], f['optimizer/values_lr'][:, 0]): print(repr(a), repr(b), repr(c), "
      "repr(d))\"");
  ASSERT_EQ(py.exit_code, 0) << py.output;
  std::istringstream rows(py.output);
  std::string decoupled_tensors;
  std::getline(rows, decoupled_tensors);
  EXPECT_EQ(decoupled_tensors, "embedding.word_embeddings.weight") << "Megatron's is_embedding_or_output_parameter";
  // 2 samples an iteration: warmup over 4 from 1e-5, then cosine over samples 4..12
  auto megatron = [](double max, double min, int iteration) {
    const double samples = 2.0 * (iteration - 1);
    if (samples <= 4) return 1e-5 + (max - 1e-5) * samples / 4.0;
    return min + (max - min) * 0.5 * (1.0 + std::cos(M_PI * (samples - 4) / 8.0));
  };
  int iteration = 0;
  for (double values, info, logged, lr; rows >> values >> info >> logged >> lr;) {
    ++iteration;
    EXPECT_NEAR(values, megatron(3e-3, 5e-4, iteration), 1e-15) << "iteration " << iteration;
    EXPECT_EQ(info, values) << "iteration " << iteration;
    EXPECT_EQ(logged, values) << "iteration " << iteration;
    EXPECT_NEAR(lr, megatron(1e-3, 1e-4, iteration), 1e-15) << "iteration " << iteration;
  }
  EXPECT_EQ(iteration, 6) << "3 iterations, stopped, and 3 resumed: " << py.output;

  // resumed with another decoupled lr, or none: refused, naming both
  for (const auto& [flags, said] :
       {std::pair{std::string(" --decoupled-lr 2e-3"), std::string("0.003 in the checkpoint, 0.002 in this run")},
        std::pair{std::string(), std::string("0.003 in the checkpoint, none in this run")}}) {
    r = mb::testing::run_command(
        train_cmd(data, tmp / "run", "--optimizer step_values --train-iters 8" + plugins + schedule + flags + ckpt));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("--decoupled-lr (after --lr-scaling) " + said), std::string::npos) << r.output;
  }
  for (const char* check : {"", " --check"}) {
    SCOPED_TRACE(check[0] ? "with --check" : "a run");
    r = mb::testing::run_command(
        train_cmd(data, tmp / "refused", "--optimizer throwing" + plugins + decoupled + check));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("optimizer plugin 'throwing' (" + std::string(MEGABATCH_TEST_PLUGIN_DIR) +
                            "/megabatch_throwing.so) cannot take --decoupled-lr: it does not declare "
                            "MB_PLUGIN_DECOUPLED_LR"),
              std::string::npos)
        << r.output;
    r = mb::testing::run_command(
        train_cmd(data, tmp / "refused", "--optimizer step_values --decoupled-min-lr 1e-4" + plugins + check));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("--decoupled-min-lr is the minimum of the learning rate that --decoupled-lr gives the "
                            "embedding and output layer, which is not given"),
              std::string::npos)
        << r.output;
    r = mb::testing::run_command(train_cmd(data, tmp / "refused",
                                           "--optimizer step_values --decoupled-lr 1e-6 --lr-warmup-iters 1 "
                                           "--lr-warmup-init 1e-5" +
                                               plugins + check));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("--lr-warmup-init (1e-05) is above --decoupled-lr (1e-06): the warmup, which both "
                            "learning rates share, would lower the embedding's"),
              std::string::npos)
        << r.output;
  }
  EXPECT_FALSE(fs::exists(tmp / "refused" / "config.json")) << "refused before the run directory is written";
}

TEST(PluginRun, KilledRunKeepsEveryFlushedIntervalReadable) {
  mb::testing::TempDir tmp;
  ASSERT_EQ(mb::testing::run_command(mb::testing::bin_dir() + "/preprocess brown --output-dir " + (tmp / "data").string()).exit_code, 0);
  // Start a long run, wait for its third iteration line, SIGKILL it.
  const std::string log = (tmp / "log").string(), pid = (tmp / "pid").string();
  const auto r = mb::testing::run_command(
      "(" + train_cmd(tmp / "data", tmp / "run", "--train-iters 100000") + " > " + log + " 2>&1 & echo $! > " + pid +
      "); " + mb::testing::wait_for_line(log, "iteration  *3/") + "kill -9 $(cat " + pid + "); while kill -0 $(cat " + pid +
      ") 2>/dev/null; do sleep 0.01; done; grep -c 'iteration  *[0-9]*/' " + log);
  const int lines = std::atoi(r.output.c_str());
  ASSERT_GE(lines, 3) << r.output;
  // An independent reader opens the killed run's file and finds at least the logged rows.
  const auto py = mb::testing::run_command(
      "/usr/bin/python3 -c \"import h5py; f = h5py.File('" + (tmp / "run" / "metrics.h5").string() +
      "', 'r'); it = f['train/iteration'][()]; l = f['train/lm_loss'][()]; "
      "print(len(it) == len(l), len(it) >= 3, list(it[:3]))\"");
  EXPECT_EQ(py.output, "True True [1.0, 2.0, 3.0]\n") << py.output;
}

// The ABI header is plain C: it compiles alone as C11 and C99 (and as C++); the C++ kit
// compiles alone as C++17, and refuses a C compiler by name.
TEST(PluginHeader, TheAbiCompilesAloneAsCAndTheKitAsCxxWithPedanticWarnings) {
  const std::string inc = fs::path(mb::testing::bin_dir()).parent_path().string() + "/include";
  mb::testing::TempDir tmp;
  mb::testing::write_text(tmp / "a.c", "#include <megabatch/plugin.h>\nint main(void) { return MB_PLUGIN_ABI_VERSION == 0u; }\n");
  mb::testing::write_text(tmp / "b.cc", "#include <megabatch/plugin.h>\nint main() { return MB_PLUGIN_ABI_VERSION == 0u; }\n");
  mb::testing::write_text(tmp / "k.cc", "#include <megabatch/plugin_kit.h>\nint main() { return sizeof(megabatch::plugin::Context) == 0; }\n");
  mb::testing::write_text(tmp / "k.c", "#include <megabatch/plugin_kit.h>\nint main(void) { return 0; }\n");
  const std::string flags = " -Wall -Wextra -pedantic -Werror -I" + inc + " ";
  for (const std::string& cmd : {"cc -std=c11" + flags + (tmp / "a.c").string() + " -o " + (tmp / "a11").string(),
                                "cc -std=c99" + flags + (tmp / "a.c").string() + " -o " + (tmp / "a99").string(),
                                "c++ -std=c++17" + flags + (tmp / "b.cc").string() + " -o " + (tmp / "b").string(),
                                "c++ -std=c++17" + flags + (tmp / "k.cc").string() + " -o " + (tmp / "k").string()}) {
    const auto r = mb::testing::run_command(cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  }
  const auto c = mb::testing::run_command("cc -std=c11" + flags + (tmp / "k.c").string() + " -o " + (tmp / "kc").string());
  EXPECT_NE(c.exit_code, 0);
  EXPECT_NE(c.output.find("plugin_kit.h is C++; a plugin written in C includes <megabatch/plugin.h> alone"), std::string::npos)
      << c.output;
}

TEST(PluginRun, LambWritesPerTensorDiagnosticsToMetricsAndAdamwSaysItHasNone) {
  mb::testing::TempDir tmp;
  ASSERT_EQ(mb::testing::run_command(mb::testing::bin_dir() + "/preprocess brown --output-dir " + (tmp / "data").string()).exit_code, 0);
  auto r = mb::testing::run_command(train_cmd(tmp / "data", tmp / "run", "--optimizer lamb --diagnostics-interval 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("> note:"), std::string::npos) << r.output;
  mb::testing::H5File f((tmp / "run" / "metrics.h5").string(), mb::testing::H5File::kRead);
  const auto names = f.read_strings("optimizer/tensor_names");
  const auto iters = f.read<double>("optimizer/iteration");
  EXPECT_EQ(iters, (std::vector<double>{2, 4, 6}));  // 6 iterations, every 2nd
  ASSERT_EQ(names.size(), 16u);  // 1 layer: 4 embedding/final-norm tensors + 12 per layer
  for (const std::string series : {"trust_ratio", "weight_norm", "update_norm"}) {
    const auto dims = f.dims("optimizer/" + series);
    ASSERT_EQ(dims, (std::vector<hsize_t>{3, names.size()})) << series;
  }
  const auto ratio = f.read<double>("optimizer/trust_ratio");
  const auto wn = f.read<double>("optimizer/weight_norm");
  const auto un = f.read<double>("optimizer/update_norm");
  for (size_t row = 0; row < 3; ++row)
    for (size_t t = 0; t < names.size(); ++t) {
      const size_t k = row * names.size() + t;
      const bool bias_or_norm = names[t].find("bias") != std::string::npos || names[t].find("layernorm") != std::string::npos;
      if (bias_or_norm)  // no weight decay, so no trust ratio (Apex, nvlamb off)
        EXPECT_EQ(ratio[k], 1.0) << names[t];
      else
        EXPECT_NEAR(ratio[k], wn[k] / un[k], 1e-12 * ratio[k]) << names[t];
    }
  // adamw reports none: --diagnostics-interval given by name says so once and writes nothing
  // (before, it said nothing); at its default (the log interval) nothing is said
  r = mb::testing::run_command(train_cmd(tmp / "data", tmp / "adamw", "--optimizer adamw --diagnostics-interval 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string note =
      "> note: optimizer adamw reports no per-tensor diagnostics, so --diagnostics-interval 2 adds "
      "nothing to metrics.h5\n";
  const size_t at = r.output.find(note);
  EXPECT_NE(at, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(note, at + 1), std::string::npos) << "once: " << r.output;
  EXPECT_FALSE(mb::testing::H5File((tmp / "adamw" / "metrics.h5").string(), mb::testing::H5File::kRead)
                   .has("optimizer/iteration"));
  r = mb::testing::run_command(train_cmd(tmp / "data", tmp / "adamw2", "--optimizer adamw"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("> note:"), std::string::npos) << r.output;
}
