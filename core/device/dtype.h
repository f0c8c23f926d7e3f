// Element types of tensors, and the host conversions of the two half types.
//
// f32 is the reference type; bf16 and f16 are the mixed-precision storage types of
// --bf16 / --fp16 (weights and activations), always computed in f32; f64 exists on the
// CPU only (finite-difference checks); i32 and u8 hold token ids and masks.
//
// Conversions round to nearest, ties to even, as the GPU's __float2bfloat16_rn and
// __float2half_rn do: a CPU run stores exactly the half values a GPU run would.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

namespace megabatch {

enum class DType : uint8_t { kF32, kBF16, kF16, kF64, kI32, kU8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
    case DType::kU8: return 1;
  }
  return 0;
}
constexpr bool is_half(DType t) { return t == DType::kBF16 || t == DType::kF16; }
constexpr bool is_floating(DType t) { return t == DType::kF32 || t == DType::kF64 || is_half(t); }
const char* dtype_name(DType t);  // "f32", "bf16", ...

// Unit roundoff of a floating type (half the distance from 1 to the next value): the
// relative error of one rounding. Tolerances of the tests are multiples of it.
constexpr double unit_roundoff(DType t) {
  switch (t) {
    case DType::kF64: return 0x1.0p-53;
    case DType::kF32: return 0x1.0p-24;
    case DType::kBF16: return 0x1.0p-8;
    case DType::kF16: return 0x1.0p-11;
    default: return 0.0;
  }
}

// The C++ element type of a dtype, where one exists (the half types are stored as their
// 16 bits).
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::kF32; }
template <>
constexpr DType dtype_of<double>() { return DType::kF64; }
template <>
constexpr DType dtype_of<int32_t>() { return DType::kI32; }
template <>
constexpr DType dtype_of<uint8_t>() { return DType::kU8; }

// ---- half conversions on the host ------------------------------------------------------
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays (quiet) NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs >= 0x38800000u) {  // normal half (>= 2^-14)
    const uint32_t m = abs + 0xfffu + ((abs >> 13) & 1u) - 0x38000000u;  // rebias 127 -> 15, round the 13 dropped bits
    return static_cast<uint16_t>(sign | (m >> 13));
  }
  // subnormal half (or zero): value = abs_float / 2^-24, rounded to an integer, ties to even
  const float a = std::bit_cast<float>(abs);
  const float scaled = a * 16777216.0f;  // exact: a power-of-two scaling of a float below 2^-14
  uint32_t q = static_cast<uint32_t>(scaled);
  const float rem = scaled - static_cast<float>(q);
  if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}
inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = static_cast<float>(man) * 0x1.0p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

// The float nearest to f that the half type t can hold (f itself for f32).
inline float round_to(DType t, float f) {
  if (t == DType::kBF16) return bf16_to_float(float_to_bf16(f));
  if (t == DType::kF16) return f16_to_float(float_to_f16(f));
  return f;
}

}  // namespace megabatch
