#include "common/dtype.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBF16(1.0f), 0x3f80);
  EXPECT_FLOAT_EQ(BF16ToF32(F32ToBF16(3.140625f)), 3.140625f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(F32ToBF16(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(F32ToBF16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DTypeTest, F16RoundTripsRepresentableValues) {
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f}) {
    EXPECT_EQ(F16ToF32(F32ToF16(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(F16ToF32(F32ToF16(1e6f))));
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F16ToF32(0x3555), 0.333251953125f);
}

// float8_e4m3fn: bias 7, 3 mantissa bits, subnormals below 2^-6, no infinities, 0x7f/0xff NaN.
TEST(DTypeTest, F8E4M3DecodesItsSpecialValues) {
  EXPECT_EQ(F8E4M3ToF32(0x38), 1.0f);
  EXPECT_EQ(F8E4M3ToF32(0x7e), 448.0f);  // the largest
  EXPECT_EQ(F8E4M3ToF32(0xfe), -448.0f);
  EXPECT_EQ(F8E4M3ToF32(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(F8E4M3ToF32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(F8E4M3ToF32(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(F8E4M3ToF32(0x3c), 1.5f);
  EXPECT_EQ(F8E4M3ToF32(0x00), 0.0f);
  EXPECT_FALSE(std::signbit(F8E4M3ToF32(0x00)));
  EXPECT_EQ(F8E4M3ToF32(0x80), 0.0f);
  EXPECT_TRUE(std::signbit(F8E4M3ToF32(0x80)));  // -0
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0x7f)));
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0xff)));
}

TEST(DTypeTest, F8E4M3RoundsToNearestEvenAndSaturates) {
  // Every non-NaN value encodes back to its own byte.
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    EXPECT_EQ(F32ToF8E4M3(F8E4M3ToF32(static_cast<uint8_t>(b))), b) << std::hex << b;
  }
  EXPECT_EQ(F32ToF8E4M3(1.0625f), 0x38);  // halfway between 1 and 1.125: to even (1)
  EXPECT_EQ(F32ToF8E4M3(1.1875f), 0x3a);  // halfway between 1.125 and 1.25: to even (1.25)
  EXPECT_EQ(F32ToF8E4M3(1.07f), 0x39);
  EXPECT_EQ(F32ToF8E4M3(std::ldexp(1.0f, -10)), 0x00);   // half the smallest: to 0
  EXPECT_EQ(F32ToF8E4M3(std::ldexp(3.0f, -10)), 0x02);   // 1.5 units: to even (2)
  EXPECT_EQ(F32ToF8E4M3(std::ldexp(15.5f, -10)), 0x08);  // rounds up into the normals
  EXPECT_EQ(F32ToF8E4M3(15.5f), 0x58);                   // rounds up to the next binade (16)
  EXPECT_EQ(F32ToF8E4M3(460.0f), 0x7e);                  // saturates
  EXPECT_EQ(F32ToF8E4M3(-1e30f), 0xfe);
  EXPECT_EQ(F32ToF8E4M3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(F32ToF8E4M3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(F32ToF8E4M3(-0.0f), 0x80);
}

TEST(DTypeTest, FlagNamesRoundTripAndRejectOthers) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3}) {
    EXPECT_EQ(ParseDTypeFlag(DTypeFlagName(t)), t) << DTypeName(t);
  }
  EXPECT_EQ(DTypeFlagName(DType::kBF16), "bf16");
  for (const char* bad : {"", "auto", "BF16", "fp32", "bf16 "}) {
    EXPECT_FALSE(ParseDTypeFlag(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace pdserve
