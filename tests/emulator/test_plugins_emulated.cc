// The plugin kit's GPU path (core/optim/plugin_kit.h: the job tables, prepare, apply, sum and
// combine kernels) on the warp emulator: every shipped plugin, compiled as C++ with
// MB_WARP_EMULATOR into a module of its own (build/tests/emulated_plugins), steps a set of
// parameters through a host that says CUDA and keeps its "device" memory on the CPU, and the
// same plugin steps a copy through a CPU host. Parameters and state must agree to a few
// float roundings after every step (the per-tensor sums are added in other orders); a
// skipped step must change nothing; from the third step on the GPU path uploads no table.
// The GPU itself runs the same in the gpu label (Gpu.EveryPluginStepsOnTheGpuAsOnTheCpu).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/optim/optimizer.h"
#include "core/optim/plugin.h"

namespace optim = megabatch::optim;

namespace {

// An mb_host for one rank whose device memory is the CPU's: `cuda` says which path the kit
// takes. What the plugin allocates and what it is handed live here.
class Host {
 public:
  explicit Host(bool cuda) {
    h_.ctx = this;
    h_.device = cuda ? MB_DEVICE_CUDA : MB_DEVICE_CPU;
    h_.device_index = 0;
    h_.stream = nullptr;
    h_.alloc_state = [](void* ctx, size_t, const char*, int32_t ndim, const int64_t* shape, int32_t, int32_t) -> float* {
      int64_t n = 1;
      for (int32_t d = 0; d < ndim; ++d) n *= shape[d];
      auto& s = self(ctx)->states_.emplace_back(static_cast<size_t>(n), 0.0f);
      return s.data();
    };
    h_.tp_sum = [](void*, double*, size_t) {};        // one rank
    h_.sum_shards = [](void*, double*, size_t) {};    // whole tensors, one rank
    h_.normal = [](void*, size_t param, int64_t step, float* out, size_t n) {
      for (size_t i = 0; i < n; ++i)  // deterministic, the same on both hosts
        out[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * static_cast<double>(param) +
                                             2.1 * static_cast<double>(step)));
    };
    h_.scratch = [](void* ctx, size_t bytes) -> void* {  // an arena rewound after each step, as the trainer's
      Host& host = *self(ctx);
      const size_t at = (host.scratch_used_ + 15) / 16 * 16;
      if (at + bytes > host.scratch_.size()) return nullptr;
      host.scratch_used_ = at + bytes;
      return host.scratch_.data() + at;
    };
    h_.alloc_device = [](void* ctx, size_t bytes) -> void* { return self(ctx)->device_.emplace_back(bytes).data(); };
    h_.upload = [](void* ctx, void* dst, const void* src, size_t bytes) {
      std::memcpy(dst, src, bytes);
      ++self(ctx)->uploads_;
    };
    h_.download = [](void*, void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); };
    h_.metric = [](void* ctx, const char* series, size_t param, double value) {
      self(ctx)->metrics_[std::string(series) + " " + std::to_string(param)] = value;
    };
    h_.log = [](void*, const char*) {};
  }
  const mb_host* get() const { return &h_; }
  void end_step() { scratch_used_ = 0; }
  int64_t uploads() const { return uploads_; }
  const std::vector<std::vector<float>>& states() const { return states_; }
  const std::map<std::string, double>& metrics() const { return metrics_; }

 private:
  static Host* self(void* ctx) { return static_cast<Host*>(ctx); }
  mb_host h_{};
  std::vector<std::vector<float>> states_;
  std::vector<std::vector<unsigned char>> device_;
  std::vector<unsigned char> scratch_ = std::vector<unsigned char>(size_t{16} << 20);
  size_t scratch_used_ = 0;
  int64_t uploads_ = 0;
  std::map<std::string, double> metrics_;
};

// Parameters of the four roles: an embedding over 35 of the GPU path's 65,536-element chunks
// (more than a warp's 32 lanes: the combine kernel's lanes take two each), a weight over
// parts of one, a bias, a norm.
struct Params {
  std::vector<std::vector<float>> data, grad;
  std::vector<mb_param> params;
  Params() {
    struct Spec {
      const char* name;
      mb_role role;
      int32_t layer;
      std::vector<int64_t> shape;
    };
    const Spec specs[] = {{"embedding.word_embeddings.weight", MB_ROLE_EMBEDDING, -1, {8800, 256}},
                          {"decoder.layers.0.mlp.linear_fc1.weight", MB_ROLE_WEIGHT, 0, {64, 70}},
                          {"decoder.layers.0.mlp.linear_fc1.bias", MB_ROLE_BIAS, 0, {64}},
                          {"decoder.final_layernorm.weight", MB_ROLE_NORM, -1, {70}}};
    for (const Spec& s : specs) {
      const int64_t n = s.shape.size() == 1 ? s.shape[0] : s.shape[0] * s.shape[1];
      std::vector<float> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
      const double k = static_cast<double>(data.size());
      for (int64_t i = 0; i < n; ++i) {
        w[static_cast<size_t>(i)] = 0.02f * static_cast<float>(std::cos(0.11 * static_cast<double>(i) + k));
        g[static_cast<size_t>(i)] = 0.01f * static_cast<float>(std::sin(0.07 * static_cast<double>(i) * (1 + k)));
      }
      data.push_back(std::move(w));
      grad.push_back(std::move(g));
    }
    for (size_t i = 0; i < data.size(); ++i) {
      mb_param p{};
      p.name = specs[i].name;
      p.role = specs[i].role;
      p.layer = specs[i].layer;
      p.ndim = static_cast<int32_t>(specs[i].shape.size());
      p.embedding_or_output = i == 0 ? 1 : 0;  // the word embeddings: the decoupled lr
      for (int d = 0; d < p.ndim; ++d) p.shape[d] = p.full_shape[d] = specs[i].shape[static_cast<size_t>(d)];
      p.sharded = 0;
      p.partition_dim = -1;
      p.numel = static_cast<int64_t>(data[i].size());
      p.data = data[i].data();
      p.grad = grad[i].data();
      p.offset = 0;
      params.push_back(p);
    }
  }
};

// |a - b| within a few float roundings of the larger
void expect_near_floats(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  int shown = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double bound = 8 * 6e-8 * std::max(std::abs(a[i]), std::abs(b[i])) + 1e-30;
    if (!(std::abs(static_cast<double>(a[i]) - b[i]) <= bound) && shown++ < 5)
      ADD_FAILURE() << what << " element " << i << ": " << a[i] << " (CPU) vs " << b[i] << " (emulated GPU)";
  }
}

class EmulatedPlugin : public ::testing::TestWithParam<std::string> {};

TEST_P(EmulatedPlugin, StepsOnTheGpuPathAsOnTheCpu) {
  const optim::Plugin plugin =
      optim::load_plugin_file(std::string(MEGABATCH_EMULATED_PLUGIN_DIR) + "/" + optim::plugin_file_name(GetParam()));
  ASSERT_TRUE(plugin.entry->devices & MB_DEVICES_CUDA) << "the emulated build has no GPU path";
  const std::vector<double> hparams = optim::resolve_hparams(plugin, nlohmann::json::object(), "defaults");
  Host cpu_host(false), gpu_host(true);
  Params cpu, gpu;
  char err[512] = {};
  void* on_cpu = plugin.entry->create(cpu_host.get(), cpu.params.data(), cpu.params.size(), hparams.data(), err, sizeof err);
  ASSERT_NE(on_cpu, nullptr) << err;
  void* on_gpu = plugin.entry->create(gpu_host.get(), gpu.params.data(), gpu.params.size(), hparams.data(), err, sizeof err);
  ASSERT_NE(on_gpu, nullptr) << err;
  ASSERT_EQ(cpu_host.states().size(), gpu_host.states().size());
  // what the host keeps on the device for the whole run: the step's numbers, the norm, the flag
  mb_step_values values{};
  double grad_norm = 0;
  float skip = 0;
  int64_t uploads_before = 0;
  for (int64_t step = 1; step <= 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    // wd 0 at step 1; the embedding at its own lr
    values = {step, 1e-2 / static_cast<double>(step), 8, 0.02 * static_cast<double>(step - 1),
              3e-2 / static_cast<double>(step)};
    grad_norm = 0.5 + 0.6 * static_cast<double>(step);  // over max_grad_norm 1 from step 1: clipping
    const bool skipped = step == 3;  // an overflow: the GPU path must change nothing
    mb_step_info info{};
    info.step = step;
    info.lr = values.lr;
    info.global_batch = values.global_batch;
    info.weight_decay = values.weight_decay;
    info.decoupled_lr = values.decoupled_lr;
    info.seed = 7;
    info.grad_norm = &grad_norm;
    info.diagnostics = step == 2 ? 1 : 0;
    info.values = &values;
    if (!skipped) {
      info.skip = nullptr;
      ASSERT_EQ(plugin.entry->step(on_cpu, &info, err, sizeof err), 0) << err;
      cpu_host.end_step();
    }
    const Params before = gpu;
    skip = skipped ? 1.0f : 0.0f;
    info.skip = &skip;
    ASSERT_EQ(plugin.entry->step(on_gpu, &info, err, sizeof err), 0) << err;
    gpu_host.end_step();
    if (skipped) {
      for (size_t i = 0; i < gpu.data.size(); ++i)
        EXPECT_EQ(gpu.data[i], before.data[i]) << "a skipped step changed " << gpu.params[i].name;
    }
    for (size_t i = 0; i < cpu.data.size(); ++i) expect_near_floats(cpu.data[i], gpu.data[i], cpu.params[i].name);
    for (size_t s = 0; s < cpu_host.states().size(); ++s)
      expect_near_floats(cpu_host.states()[s], gpu_host.states()[s], "state " + std::to_string(s));
    const int64_t uploads = gpu_host.uploads() - uploads_before;
    uploads_before = gpu_host.uploads();
    if (step == 1) {
      EXPECT_GT(uploads, 0) << "the GPU path uploaded no job table: it did not run";
    } else if (step >= 3) {
      EXPECT_EQ(uploads, 0) << "tables uploaded again after the second step";
    }
  }
  for (const auto& [series, value] : cpu_host.metrics()) {
    const auto it = gpu_host.metrics().find(series);
    ASSERT_NE(it, gpu_host.metrics().end()) << series << " reported on the CPU only";
    EXPECT_NEAR(it->second, value, 1e-6 * (std::abs(value) + 1e-12)) << series;
  }
  EXPECT_EQ(cpu_host.uploads(), 0);
  plugin.entry->destroy(on_cpu);
  plugin.entry->destroy(on_gpu);
}

INSTANTIATE_TEST_SUITE_P(Shipped, EmulatedPlugin,
                         ::testing::Values("sgd", "adamw", "lamb", "lars", "lamb_noise", "lamb_embscale"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
