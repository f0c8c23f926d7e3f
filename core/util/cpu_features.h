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

// X(identifier, the name __builtin_cpu_supports takes, which is also the name a message gives)
#define MEGABATCH_CPU_FEATURES(X)                                                                        \
  X(SSE3, "sse3") X(SSSE3, "ssse3") X(SSE4_1, "sse4.1") X(SSE4_2, "sse4.2") X(POPCNT, "popcnt")          \
  X(AVX, "avx") X(AVX2, "avx2") X(FMA, "fma") X(F16C, "f16c") X(BMI, "bmi") X(BMI2, "bmi2")               \
  X(LZCNT, "lzcnt") X(MOVBE, "movbe")                                                                    \
  X(AVX512F, "avx512f") X(AVX512BW, "avx512bw") X(AVX512DQ, "avx512dq") X(AVX512VL, "avx512vl")          \
  X(AVX512CD, "avx512cd") X(AVX512VNNI, "avx512vnni") X(AVX512BF16, "avx512bf16")                        \
  X(AVX512VBMI, "avx512vbmi") X(AVX512VBMI2, "avx512vbmi2") X(AVX512IFMA, "avx512ifma")                  \
  X(AVX512BITALG, "avx512bitalg") X(AVX512VPOPCNTDQ, "avx512vpopcntdq") X(AVX512FP16, "avx512fp16")      \
  X(AVXVNNI, "avxvnni")

namespace megabatch::cpu_features {

enum Index : int {
#define MEGABATCH_CPU_FEATURE_INDEX(id, name) k##id##Index,
  MEGABATCH_CPU_FEATURES(MEGABATCH_CPU_FEATURE_INDEX)
#undef MEGABATCH_CPU_FEATURE_INDEX
  kCount
};

#define MEGABATCH_CPU_FEATURE_BIT(id, name) constexpr uint64_t k##id = uint64_t{1} << k##id##Index;
MEGABATCH_CPU_FEATURES(MEGABATCH_CPU_FEATURE_BIT)
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
