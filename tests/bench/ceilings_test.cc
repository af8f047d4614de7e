#include "bench/ceilings.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

// Only sanity: a rate is positive and finite. Speed itself is for `pdserve bench engine`.

// f32 runs on every x86-64 oneDNN supports; bf16 needs AVX-512 (or AVX2-VNNI-2).
// The probe's vector reads (AVX-512 or AVX2 where the CPU has them) cover every word: a word
// changed anywhere, in a buffer of any whole number of lines, changes what they return.
TEST(CeilingsTest, ProbeReadsEveryWord) {
  for (size_t lines : {1, 2, 3, 4, 5, 7, 8, 1001}) {
    const size_t words = lines * 8;
    // 64-byte aligned, as the probe's own buffer is.
    const std::unique_ptr<uint64_t[], decltype(&std::free)> owner(
        static_cast<uint64_t*>(std::aligned_alloc(64, words * sizeof(uint64_t))), &std::free);
    ASSERT_NE(owner, nullptr);
    uint64_t* const buffer = owner.get();
    uint64_t want = 0;
    for (size_t i = 0; i < words; ++i) {
      buffer[i] = (i + 1) * 0x9E3779B97F4A7C15ull;
      want ^= buffer[i];
    }
    const auto* p = reinterpret_cast<const uint8_t*>(buffer);
    for (int pass = 0; pass < kProbePasses; ++pass) {
      EXPECT_EQ(XorAsProbeReads(p, lines * 64, pass), want) << lines << " lines, pass " << pass;
      // The last word and the first: the ends a loop with a wrong bound would miss.
      for (size_t i : {words - 1, size_t{0}, words / 2}) {
        buffer[i] ^= 1;
        EXPECT_EQ(XorAsProbeReads(p, lines * 64, pass), want ^ 1)
            << lines << " lines, word " << i << ", pass " << pass;
        buffer[i] ^= 1;
      }
    }
  }
}

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

// The single passes a benchmark interleaves with its work: every kind of read, in turn.
TEST(CeilingsTest, ProbePassesArePositiveAndFinite) {
  Result<MemoryBandwidthProbe> probe = MemoryBandwidthProbe::Create(4 << 20, /*threads=*/2);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  for (int i = 0; i < 2 * kProbePasses; ++i) {
    const double rate = probe->Pass();
    EXPECT_GT(rate, 0.0) << "pass " << i;
    EXPECT_TRUE(std::isfinite(rate)) << "pass " << i;
  }
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
