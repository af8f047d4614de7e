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

TEST(DTypeTest, FlagNamesRoundTripAndRejectOthers) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_EQ(ParseDTypeFlag(DTypeFlagName(t)), t) << DTypeName(t);
  }
  EXPECT_EQ(DTypeFlagName(DType::kBF16), "bf16");
  for (const char* bad : {"", "auto", "BF16", "fp32", "bf16 "}) {
    EXPECT_FALSE(ParseDTypeFlag(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace pdserve
