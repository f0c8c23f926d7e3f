// What each op takes, per backend: the dtypes of every tensor argument whose dtype the
// caller chooses (the other arguments follow one of these: "the same as in", "in's
// accumulator type", and are checked as such). One table, core/ops/accepts.inc, states it
// for the CPU (the reference) and for CUDA; nothing else does:
//   - the public op functions (core/ops/*.cc) check their arguments against the row of the
//     tensors' device (detail::expect_accepted), so a dtype a backend does not take is
//     refused there, naming the op, the argument and the backend, before any kernel runs;
//   - the CUDA kernels dispatch on the same row (cuda/common.cuh: with_type<row.cuda>),
//     so a kernel is compiled for exactly the dtypes its row names: a row that promised a
//     dtype its kernel cannot take does not build;
//   - tests/unit/test_op_accepts.cc (a CPU test, in CI) fails where the CUDA column narrows
//     the CPU's without the row saying why, and where an op has no row. Twice a CUDA op
//     refused what its dispatcher accepted (sum into f64, weighted_accumulate of f64 terms)
//     and only a GPU run showed it; such a narrowing now fails in CI or is stated here.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/device/dtype.h"

namespace megabatch::ops {

// A set of dtypes (a bit per DType).
struct DTypes {
  uint32_t bits = 0;
  constexpr DTypes() = default;
  static constexpr DTypes of_bits(uint32_t b) {
    DTypes s;
    s.bits = b;
    return s;
  }
  constexpr DTypes(std::initializer_list<DType> ds) {
    for (DType d : ds) bits |= 1u << static_cast<unsigned>(d);
  }
  constexpr bool has(DType d) const { return (bits >> static_cast<unsigned>(d)) & 1u; }
  constexpr bool operator==(const DTypes&) const = default;
  constexpr bool within(DTypes o) const { return (bits & ~o.bits) == 0; }
  std::string names() const;  // "f32, bf16 or f16"
};

// One row: op, argument, what the CPU takes, what CUDA takes, and why CUDA takes less
// (empty where they are equal).
struct Accepts {
  const char* op;
  const char* arg;
  DTypes cpu, cuda;
  const char* narrowed;
  constexpr DTypes on_cuda(bool cuda_device) const { return cuda_device ? cuda : cpu; }
};

namespace accepts {
// The sets the rows use.
inline constexpr DTypes kActivations{DType::kF32, DType::kBF16, DType::kF16, DType::kF64};  // the CPU's
inline constexpr DTypes kDeviceActivations{DType::kF32, DType::kBF16, DType::kF16};           // the GPU's
inline constexpr DTypes kF32{DType::kF32}, kF64{DType::kF64}, kF32OrF64{DType::kF32, DType::kF64};
inline constexpr DTypes kI32{DType::kI32}, kU8{DType::kU8};
inline constexpr DTypes kHalves{DType::kBF16, DType::kF16};
// Why the GPU's activations are not the CPU's.
inline constexpr const char* kF64IsTheReference =
    "f64 activations are the CPU reference's alone (the finite-difference and f64 checks); a GPU computes in f32";
// Why the flash kernels take only the half types.
inline constexpr const char* kFlashTakesHalves =
    "the flash kernels multiply on bf16/fp16 tensor cores; f32 takes the explicit attention (attention.h), and f64 "
    "is the CPU reference's";

#define MB_OP_ACCEPTS(op, arg, cpu, cuda, narrowed) inline constexpr Accepts op##_##arg{#op, #arg, cpu, cuda, narrowed};
#include "core/ops/accepts.inc"
#undef MB_OP_ACCEPTS
}  // namespace accepts

// Every row of the table, in its order.
const std::vector<Accepts>& all_accepts();

}  // namespace megabatch::ops
