// The x86-64 instruction-set extensions a compiler may use in megabatch's CPU code on its
// own (auto-vectorized loops, bit tricks, conversions), as bits of one mask: what a build's
// -march lets it use (cpu_build_features.cc) and what the CPU a program starts on has
// (cpu_level.cc) are compared in those bits. Extensions a compiler emits only for
// intrinsics megabatch does not call (AES, SHA, SSE4A, XOP ...) are left out, so a build
// is not refused on a CPU that lacks only those.
//
// Constants only: both files include this, and cpu_level.cc is built for baseline x86-64.
#pragma once

#include <cstdint>

// B(identifier, name) for the features both GCC's and clang's __builtin_cpu_supports know,
// C(identifier, name) for those cpu_level.cc reads from CPUID itself (clang 14 knows neither
// name); the name is GCC's __builtin_cpu_supports name, and the one a message gives.
#define MEGABATCH_CPU_FEATURES(B, C)                                                                     \
  B(SSE3, "sse3") B(SSSE3, "ssse3") B(SSE4_1, "sse4.1") B(SSE4_2, "sse4.2") B(POPCNT, "popcnt")          \
  B(AVX, "avx") B(AVX2, "avx2") B(FMA, "fma") C(F16C, "f16c") B(BMI, "bmi") B(BMI2, "bmi2")               \
  C(LZCNT, "lzcnt") C(MOVBE, "movbe")                                                                    \
  B(AVX512F, "avx512f") B(AVX512BW, "avx512bw") B(AVX512DQ, "avx512dq") B(AVX512VL, "avx512vl")          \
  B(AVX512CD, "avx512cd") B(AVX512VNNI, "avx512vnni") B(AVX512BF16, "avx512bf16")                        \
  B(AVX512VBMI, "avx512vbmi") B(AVX512VBMI2, "avx512vbmi2") B(AVX512IFMA, "avx512ifma")                  \
  B(AVX512BITALG, "avx512bitalg") B(AVX512VPOPCNTDQ, "avx512vpopcntdq") C(AVX512FP16, "avx512fp16")      \
  C(AVXVNNI, "avxvnni")

namespace megabatch::cpu_features {

enum Index : int {
#define MEGABATCH_CPU_FEATURE_INDEX(id, name) k##id##Index,
  MEGABATCH_CPU_FEATURES(MEGABATCH_CPU_FEATURE_INDEX, MEGABATCH_CPU_FEATURE_INDEX)
#undef MEGABATCH_CPU_FEATURE_INDEX
  kCount
};
static_assert(kCount <= 64, "the features are bits of one uint64_t");

#define MEGABATCH_CPU_FEATURE_BIT(id, name) constexpr uint64_t k##id = uint64_t{1} << k##id##Index;
MEGABATCH_CPU_FEATURES(MEGABATCH_CPU_FEATURE_BIT, MEGABATCH_CPU_FEATURE_BIT)
#undef MEGABATCH_CPU_FEATURE_BIT

// The psABI's micro-architecture levels in these bits (x86-64 itself needs none of them).
constexpr uint64_t kLevel2 = kSSE3 | kSSSE3 | kSSE4_1 | kSSE4_2 | kPOPCNT;
constexpr uint64_t kLevel3 = kLevel2 | kAVX | kAVX2 | kFMA | kF16C | kBMI | kBMI2 | kLZCNT | kMOVBE;
constexpr uint64_t kLevel4 = kLevel3 | kAVX512F | kAVX512BW | kAVX512DQ | kAVX512VL | kAVX512CD;

}  // namespace megabatch::cpu_features

// What the build's -march lets the compiler use (cpu_build_features.cc, compiled with it),
// and that -march as CMake gave it ("x86-64-v3", "native", "" for the compiler's default).
extern "C" const uint64_t megabatch_build_cpu_features;
extern "C" const char megabatch_build_march[];
// What this CPU has, in the same bits (cpu_level.cc; 0 off x86-64).
extern "C" uint64_t megabatch_cpu_features(void);
