#include "bench/ceilings.h"

#include <cmath>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

// Only sanity: a rate is positive and finite. Speed itself is for `pdserve bench engine`.

// f32 runs on every x86-64 oneDNN supports; bf16 needs AVX-512 (or AVX2-VNNI-2).
TEST(CeilingsTest, F32GemmRateIsPositiveAndFinite) {
  const Result<double> flops =
      MeasureGemmFlops(DType::kF32, 16, 64, 128, /*threads=*/1, /*seconds=*/0.0);
  ASSERT_TRUE(flops.ok()) << flops.status().ToString();
  EXPECT_GT(*flops, 0.0);
  EXPECT_TRUE(std::isfinite(*flops));
  const Result<double> odd = MeasureGemmFlops(DType::kF32, 3, 17, 33, 2, 0.01);
  ASSERT_TRUE(odd.ok()) << odd.status().ToString();
  EXPECT_GT(*odd, 0.0);
}

TEST(CeilingsTest, Bf16GemmRateIsPositiveAndFinite) {
  const Result<double> flops =
      MeasureGemmFlops(DType::kBF16, 16, 64, 128, /*threads=*/1, /*seconds=*/0.0);
  if (flops.status().code() == StatusCode::kUnavailable) {
    GTEST_SKIP() << "SKIPPED LOUDLY: oneDNN cannot run a bf16 matmul on this CPU: "
                 << flops.status().ToString();
  }
  ASSERT_TRUE(flops.ok()) << flops.status().ToString();
  EXPECT_GT(*flops, 0.0);
  EXPECT_TRUE(std::isfinite(*flops));
  // Odd sizes go through the same path.
  const Result<double> odd = MeasureGemmFlops(DType::kBF16, 3, 17, 33, 2, 0.01);
  ASSERT_TRUE(odd.ok()) << odd.status().ToString();
  EXPECT_GT(*odd, 0.0);
}

TEST(CeilingsTest, BandwidthIsPositiveAndFinite) {
  const Result<double> bw = MeasureMemoryBandwidth(4 << 20, /*threads=*/2, /*seconds=*/0.01);
  ASSERT_TRUE(bw.ok()) << bw.status().ToString();
  EXPECT_GT(*bw, 0.0);
  EXPECT_TRUE(std::isfinite(*bw));
  // A size that does not split evenly into lines and threads.
  const Result<double> odd = MeasureMemoryBandwidth(64 * 1001 + 7, /*threads=*/3, 0.0);
  ASSERT_TRUE(odd.ok()) << odd.status().ToString();
  EXPECT_GT(*odd, 0.0);
}

TEST(CeilingsTest, BadArgumentsAreErrors) {
  EXPECT_EQ(MeasureGemmFlops(DType::kBF16, 0, 8, 8, 1, 0.0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MeasureGemmFlops(DType::kF32, 8, 8, -1, 1, 0.0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MeasureGemmFlops(DType::kF32, 8, 8, 8, 1, -1.0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MeasureMemoryBandwidth(10, 1, 0.0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MeasureMemoryBandwidth(1 << 20, 1, NAN).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
