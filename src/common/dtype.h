// DType: the one element type of the project (checkpoint tensors, weight matrices, the KV cache)
// and scalar conversions. kF8E4M3 is float8_e4m3fn (1 sign, 4 exponent bits of bias 7, 3
// mantissa bits, no infinities, 0x7f and 0xff NaN): the weights of FP8 block-scaled checkpoints,
// whose real values are these times a per-block scale (model/weights.h). A place that accepts only
// some types (the KV cache: F32 and BF16) checks and says so; a choice that may be left to a
// default is a std::optional<DType>. Pure functions; safe from any thread.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace pdserve {

// kI8: signed 8-bit integers, the weights of INT8 checkpoints (`make-model --dtype int8`), whose
// real values are these times a per-block scale (model/weights.h).
enum class DType : uint8_t { kF32, kF16, kBF16, kF8E4M3, kI8 };

inline size_t DTypeSize(DType t) {
  return t == DType::kF32 ? 4 : t == DType::kF8E4M3 || t == DType::kI8 ? 1 : 2;
}
// "F32", "F16", "BF16", "F8_E4M3", "I8" (safetensors spelling)
std::string_view DTypeName(DType t);
// "f32", "f16", "bf16", "fp8", "int8": the spelling of command-line flags and logs.
std::string_view DTypeFlagName(DType t);
// Inverse of DTypeFlagName; nullopt for any other string (callers turn it into their error).
std::optional<DType> ParseDTypeFlag(std::string_view name);

inline float BF16ToF32(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }
// Round to nearest even; NaN stays NaN.
inline uint16_t F32ToBF16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);
// Exact; 0x7f and 0xff are NaN.
float F8E4M3ToF32(uint8_t v);
// Round to nearest even, saturating: a finite value beyond the largest (448) becomes +-448;
// NaN becomes 0x7f. (Infinities saturate too: the format has none.)
uint8_t F32ToF8E4M3(float f);

// Converts n elements of type `from` at src to float.
void ConvertToF32(DType from, const void* src, float* dst, size_t n);
// Converts n floats to `to` at dst.
void ConvertFromF32(DType to, const float* src, void* dst, size_t n);

}  // namespace pdserve
