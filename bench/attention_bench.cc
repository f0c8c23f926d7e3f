// attention_bench: megabatch's flash attention kernels (core/ops/cuda/flash_attention.cu)
// against PyTorch's scaled_dot_product_attention on the same GPU in the same run
// (tests/reference/sdpa_bench.py), forward and forward + backward, at sequence lengths
// 512 to 4096, head sizes 64 and 128, causal and not. Each configuration keeps the tokens
// (batch x seq, default 16,384) and the hidden size (default 2,048: 32 heads of 64, 16 of
// 128) fixed. Time: the median of --reps calls, each waited for; TFLOP/s counts 4 B H T^2 D
// for the forward (half of it when causal) and 2.5 times that for the backward. The
// forward + backward is timed twice: with dQ from a kernel of its own (ops::FlashDq::
// kSeparate) and from the dK/dV kernel in order (kOrdered; "-" where it does not apply). The
// forward is also timed with a warp per 32 query rows (ops::FlashForwardRows::k32, "fwd32";
// the default is 16; at head size 128 it needs 102 KiB of shared memory a block, and a GPU
// with less, such as a T4, runs the 16-row kernel in its place). --groups G: grouped-query
// attention, the heads sharing G key/value heads, which the kernels read in place (PyTorch:
// SDPA with enable_gqa on k and v of G heads). --documents L: each row packed with documents of
// L tokens attending within themselves (--reset-attention-mask; the kernels skip the tiles of
// other documents; PyTorch: SDPA with the boolean mask), TFLOP/s counting the documents' own
// products. --dropout P: attention dropout at P, drawn in the kernels (PyTorch: SDPA's
// dropout_p, its own random numbers).
//
//   build/bin/attention_bench [--seqs 512 1024 2048 4096] [--head-sizes 64 128] [--dtype bf16]
//                             [--tokens 16384] [--hidden 2048] [--groups 0] [--documents 0] [--dropout 0]
//                             [--reps 20] [--torch true]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "bench/bench_util.h"
#include "core/device/runtime.h"
#include "core/ops/dropout.h"
#include "core/ops/flash_attention.h"
#include "core/tensor/tensor.h"
#include "core/util/args.h"
#include "core/util/error.h"

namespace mb = megabatch;
namespace ops = megabatch::ops;
using Clock = std::chrono::steady_clock;

namespace {

template <typename Fn>
double median_ms(Fn&& fn, mb::Device dev, int reps) {
  for (int i = 0; i < 3; ++i) fn();
  mb::runtime::synchronize(dev);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    mb::runtime::synchronize(dev);
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return mb::bench::median(t);
}

mb::Tensor random_tensor(std::vector<int64_t> shape, mb::DType dtype, mb::Device dev, std::mt19937& g) {
  size_t n = 1;
  for (auto d : shape) n *= static_cast<size_t>(d);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return mb::from_host(v, shape, dtype, dev);
}

// The benchmark, its flags read and checked first (guarded_main prints what it throws).
int run(int argc, char** argv) {
  mb::ArgParser a("attention_bench", "usage: attention_bench [--seqs 512 1024 2048 4096] [--head-sizes 64 128]");
  a.list("seqs", "T", "sequence lengths", {"512", "1024", "2048", "4096"});
  a.list("head-sizes", "D", "head sizes (64, 128)", {"64", "128"});
  a.option("dtype", "T", "bf16 or fp16", "bf16");
  a.option("tokens", "N", "batch x sequence length of every configuration", "16384");
  a.option("hidden", "C", "heads x head size of every configuration", "2048");
  a.option("groups", "G", "key/value heads (grouped-query attention; 0: one a head)", "0");
  a.option("documents", "L", "documents of L tokens packed in each row, attending within themselves (0: none)", "0");
  a.option("dropout", "P", "attention dropout probability (0: none)", "0");
  a.option("reps", "N", "timed calls per configuration", "20");
  a.option("torch", "BOOL", "also time PyTorch's scaled_dot_product_attention", "true");
  if (!a.parse(argc, argv)) return 0;
  const std::string dname = a.get_choice("dtype", {"bf16", "fp16"});
  const mb::DType dtype = dname == "bf16" ? mb::DType::kBF16 : mb::DType::kF16;
  const int64_t tokens = a.get_int("tokens"), hidden = a.get_int("hidden"), groups = a.get_int("groups");
  const int64_t doc_len = a.get_int("documents");
  mb::check(doc_len >= 0, "--documents ", doc_len, ": a length of documents, or 0 for none");
  const double dropout = a.get_double("dropout");
  mb::check(dropout >= 0 && dropout < 1, "--dropout ", dropout, ": a probability in [0, 1)");
  const ops::DropoutKey dk{dropout, 1234, 5};
  const ops::DropoutKey* drop = dropout > 0 ? &dk : nullptr;
  const int reps = static_cast<int>(a.get_int("reps"));
  mb::check(reps >= 1, "--reps ", reps, ": at least 1");
  const bool with_torch = a.get_choice("torch", {"true", "false"}) == "true";
  std::vector<std::tuple<int64_t, int64_t, bool>> configs;
  for (const int64_t D : a.get_int_list("head-sizes")) {
    mb::check(D == 64 || D == 128, "--head-sizes: the flash kernels' head sizes are 64 and 128, not ", D);
    mb::check(hidden > 0 && hidden % D == 0, "--hidden ", hidden, ": a multiple of the head size ", D);
    for (const int64_t T : a.get_int_list("seqs")) {
      mb::check(T >= 1 && T <= tokens, "--seqs: ", T, " is not a sequence length from 1 to --tokens (", tokens, ")");
      for (bool causal : {true, false}) configs.emplace_back(T, D, causal);
    }
  }
  for (const auto& [T, D, causal] : configs)
    mb::check(groups == 0 || (groups > 0 && (hidden / D) % groups == 0), "--groups ", groups, " does not divide the ",
              hidden / D, " heads of head size ", D, " in hidden ", hidden);
  const mb::Device dev = mb::select_device("cuda");
  mb::runtime::use_device(dev);
  const auto gpu = mb::runtime::gpu_info(dev.index);
  // PyTorch first (its own process), then ours
  std::map<std::tuple<int64_t, int64_t, bool>, std::pair<double, double>> torch_ms;
  if (with_torch) {
    const char* py = std::getenv("MEGABATCH_PYTHON");
    std::vector<std::string> cmd = {py ? py : "/usr/bin/python3",
                                    std::string(MEGABATCH_SOURCE_DIR) + "/tests/reference/sdpa_bench.py",
                                    std::to_string(tokens),
                                    std::to_string(hidden),
                                    dname,
                                    std::to_string(reps)};
    for (const auto& [T, D, causal] : configs)
      cmd.push_back(std::to_string(T) + ":" + std::to_string(D) + ":" + (causal ? "1" : "0") + ":" +
                    std::to_string(groups) + ":" + std::to_string(doc_len) + ":" + a.get("dropout"));
    std::istringstream out(mb::bench::run_child(cmd).output);
    std::string tag;
    for (int64_t T, D, c; out >> tag >> T >> D >> c;) {
      double f, fb;
      out >> f >> fb;
      torch_ms[{T, D, c != 0}] = {f, fb};
    }
  }
  std::printf("flash attention on %s (sm_%d%d), %s, %lld tokens x hidden %lld%s%s%s; median of %d calls\n",
              gpu.name.c_str(), gpu.major, gpu.minor, dname.c_str(), static_cast<long long>(tokens),
              static_cast<long long>(hidden),
              groups ? (", " + std::to_string(groups) + " key/value heads").c_str() : "",
              doc_len ? (", documents of " + std::to_string(doc_len) + " tokens").c_str() : "",
              drop ? (", attention dropout " + a.get("dropout")).c_str() : "", reps);
  std::printf("%6s %4s %6s | %9s %8s %9s %7s | %10s %8s %10s %7s | %10s %8s %7s | %9s %8s %7s\n", "seq", "D", "causal",
              "fwd ms", "TFLOP/s", "SDPA ms", "ratio", "f+b ms", "TFLOP/s", "SDPA ms", "ratio", "ordered ms", "TFLOP/s",
              "ratio", "fwd32 ms", "TFLOP/s", "ratio");
  std::mt19937 g(1);
  for (const auto& [T, D, causal] : configs) {
    const int64_t B = std::max<int64_t>(tokens / T, 1), H = hidden / D, G = groups ? groups : H;
    const ops::AttentionShape s{B, T, H, D, causal, 0, 0, G};
    const std::vector<int64_t> qkv_shape{B, T, G, H / G + 2, D};  // G = H: (B, T, H, 3, D)
    const mb::Tensor qkv = random_tensor(qkv_shape, dtype, dev, g), dy = random_tensor({B, T, H, D}, dtype, dev, g);
    mb::Tensor out({B, T, H, D}, dtype, dev), lse({B, H, T}, mb::DType::kF32, dev), dqkv(qkv_shape, dtype, dev);
    dqkv.zero();
    // documents of doc_len tokens (the last of a row shorter), and the share of the T x T
    // products they keep: the sum of their squared lengths over T^2
    mb::Tensor docs;
    double kept = 1.0;
    if (doc_len) {
      std::vector<int32_t> ids(static_cast<size_t>(B * T));
      for (int64_t e = 0; e < B * T; ++e) ids[static_cast<size_t>(e)] = static_cast<int32_t>(e % T / doc_len);
      docs = mb::from_host(ids, {B, T}, dev);
      kept = 0;
      for (int64_t start = 0; start < T; start += doc_len) {
        const double len = static_cast<double>(std::min(doc_len, T - start));
        kept += len * len;
      }
      kept /= static_cast<double>(T) * static_cast<double>(T);
    }
    auto forward = [&] { ops::flash_attention_forward(out, lse, qkv, {}, s, drop, {}, docs); };
    const double fwd = median_ms(forward, dev, reps);
    ops::set_flash_forward_rows(ops::FlashForwardRows::k32);
    const double fwd32 = median_ms(forward, dev, reps);
    ops::set_flash_forward_rows(ops::FlashForwardRows::k16);
    auto fwd_bwd = [&] {
      ops::flash_attention_forward(out, lse, qkv, {}, s, drop, {}, docs);
      ops::flash_attention_backward(dqkv, dy, qkv, out, lse, {}, s, drop, ops::Write::kAdd, {}, {}, docs);
    };
    ops::set_flash_dq(ops::FlashDq::kSeparate);
    const double both = median_ms(fwd_bwd, dev, reps);
    ops::set_flash_dq(ops::FlashDq::kOrdered);
    const int64_t calls = ops::flash_dq_ordered_calls();
    double ordered = median_ms(fwd_bwd, dev, reps);
    if (ops::flash_dq_ordered_calls() == calls) ordered = 0;  // the shape took the separate kernels
    ops::set_flash_dq(ops::FlashDq::kSeparate);
    const double flops = 4.0 * static_cast<double>(B * H) * static_cast<double>(T) * static_cast<double>(T) *
                         static_cast<double>(D) * (causal ? 0.5 : 1.0) * kept;
    const auto it = torch_ms.find({T, D, causal});
    const double tf = it == torch_ms.end() ? 0 : it->second.first, tb = it == torch_ms.end() ? 0 : it->second.second;
    std::printf("%6lld %4lld %6s | %9.3f %8.1f %9.3f %6.2fx | %10.3f %8.1f %10.3f %6.2fx | ", static_cast<long long>(T),
                static_cast<long long>(D), causal ? "yes" : "no", fwd, flops / fwd * 1e-9, tf, tf > 0 ? fwd / tf : 0.0,
                both, 3.5 * flops / both * 1e-9, tb, tb > 0 ? both / tb : 0.0);
    if (ordered > 0)
      std::printf("%10.3f %8.1f %6.2fx | ", ordered, 3.5 * flops / ordered * 1e-9, tb > 0 ? ordered / tb : 0.0);
    else
      std::printf("%10s %8s %7s | ", "-", "-", "-");
    std::printf("%9.3f %8.1f %6.2fx\n", fwd32, flops / fwd32 * 1e-9, tf > 0 ? fwd32 / tf : 0.0);
  }
  std::printf("ratio: megabatch's time over PyTorch's (below 1: faster)\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mb::bench::guarded_main("attention_bench", [&] { return run(argc, argv); });
}
