#include "common/dtype.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace pdserve {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI8:
      return "I8";
  }
  return "?";
}

std::string_view DTypeFlagName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF8E4M3:
      return "fp8";
    case DType::kI8:
      return "int8";
  }
  return "?";
}

std::optional<DType> ParseDTypeFlag(std::string_view name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kI8}) {
    if (name == DTypeFlagName(t)) return t;
  }
  return std::nullopt;
}

float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t F32ToF16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffffu;
  if (((u >> 23) & 0xff) == 0xff)
    return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (exp <= 0) {                                                 // subnormal or zero
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: ok
  return static_cast<uint16_t>(half);
}

float F8E4M3ToF32(uint8_t v) {
  const float sign = (v & 0x80) != 0 ? -1.0f : 1.0f;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  if (exp == 0xf && mant == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);  // subnormal: m/8 * 2^-6
  return sign * std::ldexp(static_cast<float>(8 + mant), exp - 10);      // 1.m * 2^(e-7)
}

uint8_t F32ToF8E4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a == 0.0f) return sign;
  if (a >= 448.0f) return sign | 0x7e;
  // The spacing of the values around a: 2^-9 below 2^-6 (subnormals), else 2^(e-3) in
  // [2^e, 2^(e+1)). a / spacing is exact in float; nearbyint rounds it to nearest even.
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  const int step_exp = std::max(e - 1, -6) - 3;
  const int units = static_cast<int>(std::nearbyint(std::ldexp(a, -step_exp)));
  // units * 2^step_exp, re-encoded (a carry to the next binade is handled by the encoding:
  // 16 units of a binade's step are 8 units of the next one's).
  if (step_exp == -9 && units < 8) return sign | static_cast<uint8_t>(units);  // subnormal
  int exp = step_exp + 3 + 7;  // biased exponent of the binade of units in [8, 16)
  int mant = units;
  if (mant >= 16) {
    mant /= 2;
    ++exp;
  }
  if (exp > 15 || (exp == 15 && mant - 8 > 6)) return sign | 0x7e;  // rounded past 448
  return sign | static_cast<uint8_t>((exp << 3) | (mant - 8));
}

void ConvertToF32(DType from, const void* src, float* dst, size_t n) {
  switch (from) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = BF16ToF32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kF8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F8E4M3ToF32(s[i]);
      return;
    }
    case DType::kI8: {
      const auto* s = static_cast<const int8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
  }
}

void ConvertFromF32(DType to, const float* src, void* dst, size_t n) {
  switch (to) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToBF16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
    case DType::kF8E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToF8E4M3(src[i]);
      return;
    }
    case DType::kI8: {  // nearest, ties to even, saturated
      auto* d = static_cast<int8_t*>(dst);
      for (size_t i = 0; i < n; ++i) {
        d[i] = static_cast<int8_t>(std::clamp(std::nearbyint(src[i]), -128.0f, 127.0f));
      }
      return;
    }
  }
}

}  // namespace pdserve
