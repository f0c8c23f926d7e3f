// Running one op on a device in a dtype against the CPU reference in f64 on the same
// inputs (test_ops_devices.cc, test_attention_devices.cc). Inputs are drawn from a seeded
// normal distribution and rounded to the dtype under test, so device and reference see
// identical values; outputs written with `=` are poisoned (NaN) before the run so that an
// element the op did not write fails, and outputs accumulated with `+=` start from random
// values so that the accumulation itself is checked. Tolerances come from the dtype's unit
// roundoff.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/device/runtime.h"
#include "core/tensor/tensor.h"
#ifdef MB_TEST_DEVICE_EMULATED
#include "tests/emulator/emulated_ops.h"
#include "tests/emulator/warp_emulator.h"
#endif

namespace megabatch {
namespace ops {}
inline void PrintTo(DType d, std::ostream* os) { *os << dtype_name(d); }  // test names and messages
}  // namespace megabatch

namespace megabatch::testing {

// The device this test program runs its ops on, and the prefix of its test names (the CPU
// and GPU programs share test bodies; their names must differ).
#if defined(MB_TEST_DEVICE_CUDA)
inline Device test_device() { return Device::cuda(0); }
#define MB_TEST_DEVICE_NAME Cuda
#elif defined(MB_TEST_DEVICE_EMULATED)  // the CUDA kernels on the warp emulator (tests/emulator/emulated_ops.h)
inline Device test_device() { return emulated_device(); }
#define MB_TEST_DEVICE_NAME Emulated
#else
inline Device test_device() { return Device::cpu(); }
#define MB_TEST_DEVICE_NAME Cpu
#endif

// The op API the test bodies call: the public ops, or in the emulated program the same
// signatures routed to the warp emulator for its device's tensors.
#ifdef MB_TEST_DEVICE_EMULATED
namespace device_ops = emulated_ops;
#else
namespace device_ops = ::megabatch::ops;  // (its ops from the core/ops headers a test includes)
#endif

// A GPU test program without a GPU (or a CUDA build) has nothing to test: it says why.
#define MB_SKIP_WITHOUT_DEVICE(device)                                                                        \
  do {                                                                                                        \
    if ((device).is_cuda() && !::megabatch::runtime::built_with_cuda())                                      \
      GTEST_SKIP() << "this build has no CUDA (configure where nvcc is found to test the GPU kernels)";      \
    if ((device).is_cuda() && ::megabatch::runtime::cuda_device_count() == 0)                                \
      GTEST_SKIP() << "no GPU is visible: the CUDA kernels are tested on a machine with one";               \
  } while (0)

// A test whose CUDA code the warp emulator cannot run (`what`: cuBLASLt's) skips in the
// emulated program, saying so.
#ifdef MB_TEST_DEVICE_EMULATED
#define MB_SKIP_ON_EMULATOR(what) GTEST_SKIP() << "its CUDA code (" << (what) << ") does not run on the warp emulator"
#else
#define MB_SKIP_ON_EMULATOR(what) \
  do {                            \
  } while (0)
#endif

// A tensor on the device under test in the dtype under test, and the same values as an f64
// CPU tensor for the reference.
struct Pair {
  Tensor dev, ref;
};

class OpHarness {
 public:
  OpHarness(Device device, DType dtype, uint32_t seed) : device_(device), dtype_(dtype), rng_(seed), seed_(seed) {}
  Device device() const { return device_; }
#ifdef MB_TEST_DEVICE_EMULATED
  std::string device_name() const { return device_ == emulated_device() ? "the warp emulator" : device_.str(); }
#else
  std::string device_name() const { return device_.str(); }
#endif
  DType dtype() const { return dtype_; }

  // Random values (normal, std `scale`) rounded to `dtype` (default: the dtype under test).
  Pair input(std::vector<int64_t> shape, double scale = 1.0, std::optional<DType> as = std::nullopt) {
    const DType dtype = as.value_or(dtype_);
    std::normal_distribution<double> nd(0.0, scale);
    std::vector<float> v(numel_of(shape));
    for (auto& x : v) x = round_to(dtype, static_cast<float>(nd(rng_)));
    return pair_of(v, shape, dtype);
  }
  // These values rounded to `dtype` (default: the dtype under test), on both sides.
  Pair values(std::vector<float> v, std::vector<int64_t> shape, std::optional<DType> as = std::nullopt) {
    const DType dtype = as.value_or(dtype_);
    for (auto& x : v) x = round_to(dtype, x);
    return pair_of(v, shape, dtype);
  }
  // An output written with `=`: NaN on the device, zeros in the reference.
  Pair output(std::vector<int64_t> shape, std::optional<DType> as = std::nullopt) {
    const DType dtype = as.value_or(dtype_);
    std::vector<float> nan(numel_of(shape), std::numeric_limits<float>::quiet_NaN());
    Pair p;
    p.dev = from_host(nan, shape, dtype, device_);
    p.ref = Tensor(shape, DType::kF64);
    return p;
  }
  // An output accumulated with `+=`: the same random start on both sides.
  Pair accumulator(std::vector<int64_t> shape, std::optional<DType> as = std::nullopt) {
    return input(std::move(shape), 1.0, as);
  }
  // Integer and byte tensors (ids, masks): the same values on both sides.
  Pair ids(const std::vector<int32_t>& v, std::vector<int64_t> shape) {
    return {from_host(v, shape, device_), from_host(v, shape)};
  }
  Pair bytes(const std::vector<uint8_t>& v, std::vector<int64_t> shape) {
    return {from_host(v, shape, device_), from_host(v, shape)};
  }

  // |dev - ref| <= slack (u_dtype + terms u_f32) (|ref| + rms(ref)) element by element,
  // where terms is the longest f32 accumulation behind an element.
  // The bound uses the dtype under test (intermediates are rounded to it) or, for an output
  // of a wider type, that type, whichever is coarser.
  void expect_close(const Pair& p, double terms, const std::string& what, double slack = 4.0) const {
    const DType dtype = unit_roundoff(p.dev.dtype()) > unit_roundoff(dtype_) ? p.dev.dtype() : dtype_;
    const std::vector<double> got = to_host_f64(p.dev), ref = to_host_f64(p.ref);
    ASSERT_EQ(got.size(), ref.size()) << what;
    double rms = 0;
    for (double r : ref) rms += r * r;
    rms = ref.empty() ? 0.0 : std::sqrt(rms / static_cast<double>(ref.size()));
    const double rel = slack * (unit_roundoff(dtype) + terms * unit_roundoff(DType::kF32));
    int shown = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double bound = rel * (std::abs(ref[i]) + rms) + 1e-30;
      if (!(std::abs(got[i] - ref[i]) <= bound) && shown++ < 5)
        ADD_FAILURE() << what << " [" << dtype_name(p.dev.dtype()) << " on " << device_name() << ", seed " << seed_
                      << "] element " << i << ": " << got[i] << " vs reference " << ref[i] << " (bound " << bound << ")";
    }
  }

 private:
  Pair pair_of(const std::vector<float>& v, const std::vector<int64_t>& shape, DType dtype) {
    Pair p;
    p.dev = from_host(v, shape, dtype, device_);
    p.ref = from_host(std::vector<double>(v.begin(), v.end()), shape);
    return p;
  }
  Device device_;
  DType dtype_;
  std::mt19937 rng_;
  uint32_t seed_;
};

// The documents (attention.h: i32 (B, T), Megatron's --reset-attention-mask) of rows packed
// from several: row b's end after positions b + 6, 62 and 63 (a document of one token) and
// 2T/3, those that fall inside the row; a row of T < 8 - b is one document.
inline std::vector<int32_t> packed_documents(int64_t B, int64_t T) {
  std::vector<int32_t> docs(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int32_t doc = 0;
    for (int64_t t = 0; t < T; ++t) {
      docs[static_cast<size_t>(b * T + t)] = doc;
      if (t == b + 6 || t == 62 || t == 63 || t == 2 * T / 3) ++doc;
    }
  }
  return docs;
}

// The fixture of the op tests (test_ops_devices.cc, test_attention_devices.cc): each
// TEST_P(OnDevice, ...) runs once per dtype on test_device(), and skips where that device is
// absent. test_ops_devices.cc instantiates it, for the tests of both files. In the emulated
// program a test that ran (not skipped) must have launched a kernel on the warp emulator: one
// that launched none checked the CPU's code where the GPU's was meant.
class OnDevice : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    MB_SKIP_WITHOUT_DEVICE(test_device());
#ifdef MB_TEST_DEVICE_EMULATED
    launches_ = emu::launches();
#endif
  }
#ifdef MB_TEST_DEVICE_EMULATED
  void TearDown() override {
    if (!IsSkipped()) {
      EXPECT_GT(emu::launches(), launches_) << "no kernel ran on the warp emulator: the device's calls went elsewhere";
    }
  }
  int64_t launches_ = 0;
#endif
  OpHarness harness(uint32_t seed) const { return OpHarness(test_device(), GetParam(), seed); }
};

}  // namespace megabatch::testing
