// optim_bench: optimizer step time of the lamb and adamw plugins over the parameters of
// gpt-mini (16M) and gpt2-124m (124M), fp32, as effective bandwidth (the bytes a step must
// move per parameter / time) beside this machine's copy bandwidth and PyTorch's AdamW
// (foreach), measured in the same run (with glibc malloc keeping what PyTorch frees, and
// with its defaults: bench/bench_util.h).
//
// --device cuda: the same on a GPU, the parameters and state in device memory, beside the
// GPU's device-to-device copy bandwidth (cudaMemcpy of the parameters' size), PyTorch's
// fused AdamW and a LAMB of torch._foreach ops (bench/optim_torch_bench.py).
//
// Bytes per parameter: AdamW reads g, m, v, w and writes m, v, w: 28. LAMB needs two
// passes (the trust ratio of a tensor depends on the norm of its whole update): the
// first reads g, m, v, w and writes m, v; the second reads m, v, w and writes w: 40.
//
//   build/bin/optim_bench [--threads 2] [--steps 10] [--device cpu|cuda]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/comm/communicator.h"
#include "core/device/device.h"
#include "core/device/runtime.h"
#include "core/optim/optimizer.h"
#include "core/util/args.h"
#include "core/util/philox.h"
#include "models/presets.h"
#include "models/registry.h"

namespace mb = megabatch;
using Clock = std::chrono::steady_clock;

namespace {

// Copy bandwidth: read + write bytes per second of copying n floats, the faster of two
// ways: each thread memcpy-ing its slice (glibc streams large copies past the cache) and
// an OpenMP vectorized copy loop (which also reads the destination's cache lines).
double copy_bandwidth(size_t n, int reps) {
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  std::vector<double> memcpy_times, loop_times;
  const int64_t count = static_cast<int64_t>(n);
  for (int r = 0; r <= reps; ++r) {
    auto t0 = Clock::now();
#pragma omp parallel
    {
      const size_t threads = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
      const size_t begin = n * t / threads, end = n * (t + 1) / threads;
      std::memcpy(b.data() + begin, a.data() + begin, (end - begin) * sizeof(float));
    }
    if (r > 0) memcpy_times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    t0 = Clock::now();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < count; ++i) a[static_cast<size_t>(i)] = b[static_cast<size_t>(i)];
    if (r > 0) loop_times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  volatile float sink = a[n / 2] + b[n / 3];
  (void)sink;
  return 2.0 * static_cast<double>(n) * sizeof(float) /
         std::min(mb::bench::median(memcpy_times), mb::bench::median(loop_times));
}

// The same on a GPU: read + write bytes per second of cudaMemcpy-ing n floats within it.
double device_copy_bandwidth(mb::Device dev, size_t n, int reps) {
  const size_t bytes = n * sizeof(float);
  void* a = mb::runtime::raw_alloc(dev, bytes);
  void* b = mb::runtime::raw_alloc(dev, bytes);
  mb::runtime::fill_zero(a, dev, bytes);
  std::vector<double> times;
  for (int r = 0; r <= reps; ++r) {
    mb::runtime::synchronize(dev);
    const auto t0 = Clock::now();
    mb::runtime::copy_bytes(b, dev, a, dev, bytes);
    mb::runtime::synchronize(dev);
    if (r > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  mb::runtime::raw_free(dev, a, bytes);
  mb::runtime::raw_free(dev, b, bytes);
  return 2.0 * static_cast<double>(bytes) / mb::bench::median(times);
}

struct Measured {
  double adamw_s = 0, lamb_s = 0, copy_bps = 0, torch_s = 0, torch_default_s = 0, torch_lamb_s = 0;
  size_t params = 0;
};

double plugin_step_seconds(const std::string& name, mb::train::Model& model, int steps, mb::Device dev) {
  mb::comm::LocalCommunicator tp;
  const auto plugin = mb::optim::load_plugin(name, mb::optim::plugin_search_path());
  mb::optim::PluginOptimizer opt(plugin, model.parameters(), tp, mb::optim::resolve_hparams(plugin, {}, "bench"), 1);
  std::vector<double> times;
  for (int s = 0; s <= steps; ++s) {
    mb::runtime::synchronize(dev);
    const auto t0 = Clock::now();
    opt.step(s + 1, 1e-4, 256, 0.5);  // the trainer passes the gradient norm it already has
    mb::runtime::synchronize(dev);    // a GPU's step has run (a no-op on the CPU)
    if (s > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return mb::bench::median(times);
}

Measured measure(const std::string& preset, int steps, int threads, const std::string& tmp_shapes, mb::Device dev) {
  Measured m;
  mb::comm::LocalCommunicator tp;
  auto model = mb::models::make_model(mb::models::preset(preset), tp, 1, mb::DType::kF32, dev);
  auto& store = model->parameters();
  m.params = store.flat_size();
  const int64_t n = static_cast<int64_t>(store.flat_size());
  std::vector<float> g(store.flat_size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) g[static_cast<size_t>(i)] = static_cast<float>(1e-3 * mb::philox_normal(7, static_cast<uint64_t>(i)));
  mb::runtime::copy_bytes(store.grads().raw(), dev, g.data(), mb::Device::cpu(), g.size() * sizeof(float));
  m.adamw_s = plugin_step_seconds("adamw", *model, steps, dev);
  m.lamb_s = plugin_step_seconds("lamb", *model, steps, dev);
  m.copy_bps = dev.is_cpu() ? copy_bandwidth(store.flat_size(), steps) : device_copy_bandwidth(dev, store.flat_size(), steps);
  {
    std::ofstream shapes(tmp_shapes);
    for (size_t i = 0; i < store.count(); ++i) {
      const auto& info = store.info(static_cast<int>(i));
      shapes << info.shape[0] << " " << (info.shape.size() > 1 ? info.shape[1] : 1) << "\n";
    }
  }
  model.reset();  // free our memory before PyTorch allocates its own
  const char* py = std::getenv("MEGABATCH_PYTHON");
  const std::vector<std::string> torch = {py ? py : "/usr/bin/python3", std::string(MEGABATCH_SOURCE_DIR) + "/bench/optim_torch_bench.py",
                                          tmp_shapes, std::to_string(steps), std::to_string(threads), dev.is_cpu() ? "cpu" : "cuda"};
  const std::string out = mb::bench::run_child(torch, {mb::bench::malloc_keeps_freed_env()}).output;
  m.torch_s = mb::bench::value_of(out, "step_seconds");
  if (dev.is_cpu())
    m.torch_default_s = mb::bench::value_of(mb::bench::run_child(torch).output, "step_seconds");
  else
    m.torch_lamb_s = mb::bench::value_of(out, "lamb_step_seconds");
  return m;
}

// The benchmark, its flags read and checked first (guarded_main prints what it throws).
int run(int argc, char** argv) {
  mb::ArgParser a("optim_bench", "usage: optim_bench [--threads N] [--steps N] [--models gpt-mini,gpt2-124m]");
  a.option("threads", "N", "threads for every side", "2");
  a.option("steps", "N", "timed steps (median reported)", "10");
  a.option("models", "LIST", "model presets whose parameters are stepped", "gpt-mini,gpt2-124m");
  a.option("device", "D", "cpu, or cuda: the step on a GPU beside its device-to-device copy", "cpu");
  if (!a.parse(argc, argv)) return 0;
  const int threads = static_cast<int>(a.get_int("threads")), steps = static_cast<int>(a.get_int("steps"));
  mb::check(threads >= 1, "--threads ", threads, ": at least 1");
  mb::check(steps >= 1, "--steps ", steps, ": at least 1");
  std::vector<std::string> presets;
  const std::string models = a.get("models");
  for (size_t pos = 0; pos <= models.size();) {
    size_t comma = models.find(',', pos);
    if (comma == std::string::npos) comma = models.size();
    presets.push_back(models.substr(pos, comma - pos));
    mb::models::preset(presets.back());  // known (its error lists the presets)
    pos = comma + 1;
  }
  omp_set_num_threads(threads);
  const mb::Device dev = mb::select_device(a.get("device"));
  std::string where = std::to_string(threads) + " threads";
  if (dev.is_cuda()) {
    mb::runtime::use_device(dev);
    where = mb::runtime::gpu_info(dev.index).name;
  }
  // the parameters' shapes for PyTorch's side, removed however the run ends
  struct RemovedAtExit {
    std::string path;
    ~RemovedAtExit() { std::remove(path.c_str()); }
  } const shapes{"/tmp/optim_bench_shapes." + std::to_string(getpid())};
  std::printf("optimizer step, fp32, %s, median of %d steps; bandwidth = bytes a step must move / time\n", where.c_str(),
              steps);
  std::printf("%-10s %-30s %12s %10s %10s %12s\n", "params", "", "step ms", "B/param", "GB/s", "of copy");
  for (const std::string& preset : presets) {
    const Measured m = measure(preset, steps, threads, shapes.path, dev);
    const double P = static_cast<double>(m.params);
    char size[32];
    std::snprintf(size, sizeof size, "%.1fM", P / 1e6);
    auto row = [&](const char* what, double seconds, double bytes) {
      const double bps = bytes * P / seconds;
      std::printf("%-10s %-30s %12.2f %10.0f %10.2f %11.1f%%\n", size, what, seconds * 1e3, bytes, bps / 1e9,
                  100.0 * bps / m.copy_bps);
    };
    std::printf("%-10s %-30s %12.2f %10d %10.2f %11.1f%%\n", size, "copy (reference)", 8.0 * P / m.copy_bps * 1e3, 8,
                m.copy_bps / 1e9, 100.0);
    row("megabatch lamb", m.lamb_s, 40);
    row("megabatch adamw", m.adamw_s, 28);
    if (dev.is_cpu()) {
      row("PyTorch AdamW foreach", m.torch_s, 28);
      row("PyTorch AdamW, default malloc", m.torch_default_s, 28);
    } else {
      row("PyTorch LAMB (torch._foreach)", m.torch_lamb_s, 40);
      row("PyTorch AdamW (fused)", m.torch_s, 28);
    }
  }
  if (dev.is_cpu())
    std::printf(
        "(PyTorch AdamW foreach: glibc malloc keeping what it frees, GLIBC_TUNABLES=%s; default malloc: glibc's "
        "defaults)\n",
        mb::bench::kMallocKeepsFreed);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mb::bench::guarded_main("optim_bench", [&] { return run(argc, argv); });
}
