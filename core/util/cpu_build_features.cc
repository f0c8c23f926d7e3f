// What the build's -march lets the compiler use, read from the compiler's own macros: this
// file is compiled with the flags of the rest of the CPU code, and it holds data only (no
// code runs from it), so cpu_level.cc's check can read it on any CPU.
#include "core/util/cpu_features.h"

#ifndef MEGABATCH_BUILD_MARCH
#define MEGABATCH_BUILD_MARCH ""
#endif

namespace cf = megabatch::cpu_features;

extern "C" const char megabatch_build_march[] = MEGABATCH_BUILD_MARCH;

extern "C" const uint64_t megabatch_build_cpu_features = 0
#ifdef __SSE3__
    | cf::kSSE3
#endif
#ifdef __SSSE3__
    | cf::kSSSE3
#endif
#ifdef __SSE4_1__
    | cf::kSSE4_1
#endif
#ifdef __SSE4_2__
    | cf::kSSE4_2
#endif
#ifdef __POPCNT__
    | cf::kPOPCNT
#endif
#ifdef __AVX__
    | cf::kAVX
#endif
#ifdef __AVX2__
    | cf::kAVX2
#endif
#ifdef __FMA__
    | cf::kFMA
#endif
#ifdef __F16C__
    | cf::kF16C
#endif
#ifdef __BMI__
    | cf::kBMI
#endif
#ifdef __BMI2__
    | cf::kBMI2
#endif
#ifdef __LZCNT__
    | cf::kLZCNT
#endif
#ifdef __MOVBE__
    | cf::kMOVBE
#endif
#ifdef __AVX512F__
    | cf::kAVX512F
#endif
#ifdef __AVX512BW__
    | cf::kAVX512BW
#endif
#ifdef __AVX512DQ__
    | cf::kAVX512DQ
#endif
#ifdef __AVX512VL__
    | cf::kAVX512VL
#endif
#ifdef __AVX512CD__
    | cf::kAVX512CD
#endif
#ifdef __AVX512VNNI__
    | cf::kAVX512VNNI
#endif
#ifdef __AVX512BF16__
    | cf::kAVX512BF16
#endif
#ifdef __AVX512VBMI__
    | cf::kAVX512VBMI
#endif
#ifdef __AVX512VBMI2__
    | cf::kAVX512VBMI2
#endif
#ifdef __AVX512IFMA__
    | cf::kAVX512IFMA
#endif
#ifdef __AVX512BITALG__
    | cf::kAVX512BITALG
#endif
#ifdef __AVX512VPOPCNTDQ__
    | cf::kAVX512VPOPCNTDQ
#endif
#ifdef __AVX512FP16__
    | cf::kAVX512FP16
#endif
#ifdef __AVXVNNI__
    | cf::kAVXVNNI
#endif
    ;
