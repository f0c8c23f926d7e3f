// cross_entropy_bench: the LM head's cross entropy and its gradient, as a run without
// tensor parallelism computes them, on one device: ops::ce_whole_rows (one pass over each
// row: core/ops/cpu/cross_entropy.cc, one kernel: core/ops/cuda/cross_entropy.cu) against
// the reference measured in the same run, the five pieces it replaced (ce_row_max,
// ce_target_logit, ce_exps, ce_loss, ce_backward_exps, as the tensor-parallel path still
// runs them). Each call starts from the same logits (copied in, untimed) and the time is
// the median call. Bandwidth is the logits' bytes once read and once written / time: the
// least any implementation moves. The two results are compared too (largest difference of
// the losses and of the gradient, relative to the largest value).
//
//   build/bin/cross_entropy_bench [--device cpu|cuda] [--rows N] [--vocab V] [--dtype f32|bf16|f16]
//   defaults: the default sweep's micro-batch on a CPU (256 x 32,735), GPT-2 124M's on a GPU
//   (8 x 1024 rows x 50,304, bf16)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/device/runtime.h"
#include "core/ops/cpu/blas.h"
#include "core/ops/cross_entropy.h"
#include "core/tensor/tensor.h"
#include "core/util/args.h"
#include "core/util/error.h"

namespace mb = megabatch;
namespace ops = megabatch::ops;
using Clock = std::chrono::steady_clock;

namespace {

struct Result {
  double seconds = 0;
  std::vector<float> losses, grad;
};

// fn(logits, losses) timed `reps` times, each on a fresh copy of `pristine`.
template <typename Fn>
Result time_it(const mb::Tensor& pristine, int reps, Fn&& fn) {
  const mb::Device dev = pristine.device();
  mb::Tensor logits(pristine.shape(), pristine.dtype(), dev), losses({pristine.dim(0)}, mb::DType::kF32, dev);
  std::vector<double> times;
  for (int r = 0; r <= reps; ++r) {  // the first, warm-up, is not counted
    mb::copy(logits, pristine);
    mb::runtime::synchronize(dev);
    const auto t0 = Clock::now();
    fn(logits, losses);
    mb::runtime::synchronize(dev);
    if (r > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return {mb::bench::median(times), mb::to_host_f32(losses), mb::to_host_f32(logits)};
}

double largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
    m = std::max(m, std::abs(static_cast<double>(b[i])));
  }
  return m > 0 ? d / m : d;
}

// The benchmark, its flags read and checked first (guarded_main prints what it throws).
int run(int argc, char** argv) {
  mb::ArgParser a("cross_entropy_bench",
                  "usage: cross_entropy_bench [--device cpu|cuda] [--rows N] [--vocab V] [--dtype f32|bf16|f16] [--reps N]");
  a.option("device", "D", "cpu or cuda (cuda:N)", "cpu");
  a.option("rows", "N", "rows (tokens of a micro-batch); default 256 on a CPU, 8192 on a GPU", "0");
  a.option("vocab", "V", "row width (the vocabulary); default 32735 on a CPU, 50304 on a GPU", "0");
  a.option("dtype", "T", "the logits' type: f32 on a CPU (half types are emulated there), bf16 default on a GPU", "");
  a.option("reps", "N", "timed calls (median reported)", "20");
  if (!a.parse(argc, argv)) return 0;
  const int64_t rows = a.get_int("rows"), vocab = a.get_int("vocab");
  mb::check(rows >= 0, "--rows ", rows, ": a number of rows, or 0 for the device's default");
  mb::check(vocab >= 0, "--vocab ", vocab, ": a row width, or 0 for the device's default");
  const std::string given_dtype = a.get("dtype");
  if (!given_dtype.empty()) a.get_choice("dtype", {"f32", "bf16", "f16"});
  const int reps = static_cast<int>(a.get_int("reps"));
  mb::check(reps >= 1, "--reps ", reps, ": at least 1");
  const mb::Device dev = mb::select_device(a.get("device"));
  mb::runtime::use_device(dev);
  const bool gpu = dev.is_cuda();
  const int64_t n = rows > 0 ? rows : (gpu ? 8192 : 256);
  const int64_t V = vocab > 0 ? vocab : (gpu ? 50304 : 32735);
  const std::string dtype_name = given_dtype.empty() ? (gpu ? "bf16" : "f32") : given_dtype;
  const mb::DType dtype = dtype_name == "f32"    ? mb::DType::kF32
                          : dtype_name == "bf16" ? mb::DType::kBF16
                                                 : mb::DType::kF16;

  std::mt19937 g(1);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(V - 1));
  std::vector<float> pool(1 << 20), values(static_cast<size_t>(n * V));  // GPT-2's 412M logits: drawn from a pool
  for (auto& x : pool) x = nd(g);
  for (size_t k = 0; k < values.size(); ++k) values[k] = pool[(k * 2654435761u) & (pool.size() - 1)];
  std::vector<int32_t> targets(static_cast<size_t>(n));
  for (auto& t : targets) t = pick(g);
  targets[0] = -1;  // one ignored row, as padding gives them
  const mb::Tensor pristine = mb::from_host(values, {n, V}, dtype, dev);
  const mb::Tensor tg = mb::from_host(targets, {n}, dev);
  const mb::Tensor loss_scale = mb::from_host(std::vector<float>{1.0f}, {1}, mb::DType::kF32, dev);
  const float scale = 1.0f / static_cast<float>(n);

  mb::Tensor rowmax({n}, mb::DType::kF32, dev), sumexp({n}, mb::DType::kF32, dev), target({n}, mb::DType::kF32, dev);
  const Result pieces = time_it(pristine, reps, [&](const mb::Tensor& l, const mb::Tensor& losses) {
    ops::ce_row_max(rowmax, l);
    ops::ce_target_logit(target, l, tg, 0);
    ops::ce_exps(sumexp, l, rowmax);
    ops::ce_loss(losses, rowmax, sumexp, target, tg, -1);
    ops::ce_backward_exps(l, l, sumexp, tg, 0, -1, scale, loss_scale);
  });
  const Result whole = time_it(pristine, reps, [&](const mb::Tensor& l, const mb::Tensor& losses) {
    ops::ce_whole_rows(losses, l, tg, -1, true, scale, loss_scale);
  });

  const double bytes = 2.0 * static_cast<double>(n * V) * static_cast<double>(mb::dtype_size(dtype));
  const std::string where = gpu ? mb::runtime::gpu_info(dev.index).name : mb::ops::cpu::cpu_and_blas();
  std::printf("cross entropy and gradient on %s (%s), %lld rows x %lld, %s; median of %d calls\n", dev.str().c_str(),
              where.c_str(), static_cast<long long>(n), static_cast<long long>(V), dtype_name.c_str(), reps);
  std::printf("%-34s %10s %12s %10s\n", "", "ms", "GB/s (r+w)", "speedup");
  std::printf("%-34s %10.3f %12.1f %10s\n", "pieces (reference, 5 calls)", pieces.seconds * 1e3,
              bytes / pieces.seconds / 1e9, "1.00x");
  std::printf("%-34s %10.3f %12.1f %9.2fx\n", "ce_whole_rows", whole.seconds * 1e3, bytes / whole.seconds / 1e9,
              pieces.seconds / whole.seconds);
  std::printf("largest difference, relative to the largest value: losses %.2e, gradient %.2e\n",
              largest_difference(whole.losses, pieces.losses), largest_difference(whole.grad, pieces.grad));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mb::bench::guarded_main("cross_entropy_bench", [&] { return run(argc, argv); });
}
