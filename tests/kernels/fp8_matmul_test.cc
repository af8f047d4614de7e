// The FP8 product (kernels::MatMulFP8) on every kernel path: against float64 loops over x rounded
// to BF16 and the dequantised weights (fp8 value times its row's block scale, a subnormal as
// zero: kernel_table.h), every byte's widening, and the
// invariances of DESIGN.md §6: a row's bits do not depend on the other rows of the batch, nor
// on the OpenMP team, and every path computes the generic path's bits.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "matmul_checks.h"
#include "testing/kernel_paths.h"

namespace pdserve {
namespace {

using ::pdserve::testing::ExpectRowsIndependentOfBatch;
using ::pdserve::testing::ExpectSameBitsForEveryThreadCount;
using ::pdserve::testing::KernelPathNames;
using ::pdserve::testing::KernelPathTestName;
using ::pdserve::testing::UseKernelPath;

int KBlocks(int k) { return (k + kernels::kFp8BlockK - 1) / kernels::kFp8BlockK; }

// A random FP8 matrix [n][k] (every byte but the two NaNs) with random scales per row and k
// block, packed.
struct Fp8Matrix {
  int n, k;
  std::vector<uint8_t> bytes;
  std::vector<float> scales;  // [n][KBlocks(k)]
  std::vector<uint8_t> packed;

  Fp8Matrix(int rows, int cols, std::mt19937& rng) : n(rows), k(cols) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
    std::uniform_int_distribution<int> exponent(-12, 0);
    bytes.resize(static_cast<size_t>(n) * k);
    for (uint8_t& b : bytes) {
      do {
        b = static_cast<uint8_t>(byte(rng));
      } while ((b & 0x7f) == 0x7f);
    }
    scales.resize(static_cast<size_t>(n) * KBlocks(k));
    for (float& s : scales) s = std::ldexp(mantissa(rng), exponent(rng));
    Pack();
  }
  void Pack() {
    packed.assign(kernels::PackedFP8Bytes(n, k), 0xcd);
    kernels::PackFP8(bytes.data(), scales.data(), n, k, packed.data());
  }
  // The weight the kernels multiply: a subnormal counts as zero (PackFP8 stores it so).
  double Weight(int row, int col) const {
    const uint8_t b = bytes[static_cast<size_t>(row) * k + col];
    const double fp8 = (b & 0x78) == 0 ? 0.0 : static_cast<double>(F8E4M3ToF32(b));
    return fp8 * scales[static_cast<size_t>(row) * KBlocks(k) + col / kernels::kFp8BlockK];
  }
};

std::vector<float> RandomFloats(size_t count, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(count);
  for (float& e : v) e = dist(rng);
  return v;
}

struct Fp8Shape {
  int m, n, k;
};

// Ragged on purpose: partial 16-column groups and 64-column blocks, k blocks cut short, k
// below one block, exactly one and just past one; m from 1 to 40 (tiles of every row count).
// The last: more rows than a token block (kernel_table.h's kTokenBlock, 96) and k past one
// strip (kFp8StripK, 2048), so the prefill route's strips and their ragged ends are checked too.
const Fp8Shape kFp8Shapes[] = {{1, 1, 1},      {3, 17, 33},   {7, 64, 128},   {13, 100, 129},
                               {1, 130, 257},  {20, 65, 200}, {40, 48, 300},  {6, 200, 1025},
                               {37, 129, 384}, {2, 16, 127},  {103, 70, 2219}};

class Fp8MatMulTest : public ::testing::TestWithParam<std::tuple<std::string, Fp8Shape>> {
 protected:
  void SetUp() override { UseKernelPath(std::get<0>(GetParam())); }
  void TearDown() override { (void)kernels::SelectPath("auto"); }
};

TEST_P(Fp8MatMulTest, MatchesFloat64LoopsOverTheDequantisedWeights) {
  const auto [m, n, k] = std::get<1>(GetParam());
  std::mt19937 rng(m * 1000003 + n * 1009 + k);
  const Fp8Matrix w(n, k, rng);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(m) * k, rng);
  std::vector<float> y(static_cast<size_t>(m) * n, NAN);
  kernels::MatMulFP8(x.data(), w.packed.data(), y.data(), m, n, k);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double want = 0, magnitude = 0;
      for (int e = 0; e < k; ++e) {
        // x as the kernels take it: rounded to BF16 (times 2^60, a power of two).
        const double xe = BF16ToF32(F32ToBF16(x[static_cast<size_t>(i) * k + e]));
        const double p = xe * w.Weight(j, e);
        want += p;
        magnitude += std::abs(p);
      }
      // The products of BF16 x and the widened values are exact in FP32, then at most 128
      // additions within a k block and one scaled addition per block round: a few hundred
      // units of 2^-24 of the sum of magnitudes at worst.
      ASSERT_NEAR(y[static_cast<size_t>(i) * n + j], want, 2e-5 * magnitude + 1e-30)
          << "row " << i << " column " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, Fp8MatMulTest,
                         ::testing::Combine(::testing::ValuesIn(KernelPathNames()),
                                            ::testing::ValuesIn(kFp8Shapes)),
                         [](const auto& info) {
                           const Fp8Shape& s = std::get<1>(info.param);
                           return KernelPathTestName(std::get<0>(info.param)) + "_" +
                                  std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                                  std::to_string(s.k);
                         });

class Fp8PathTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { UseKernelPath(GetParam()); }
  void TearDown() override {
    (void)kernels::SelectPath("auto");
    omp_set_num_threads(threads_);
  }
  const int threads_ = omp_get_max_threads();
};

// Column c holds byte c (the NaNs: 0) in k index 0 of each k block and zeros elsewhere; x is 1:
// y[c] is the byte's value times the scale, exactly, so every widening is checked, signed zeros
// included; a subnormal reads as zero (kernel_table.h).
TEST_P(Fp8PathTest, WidensEveryByteExactly) {
  for (const int k : {1, 130}) {
    const int n = 256;
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * k, 0);
    std::vector<float> scales(static_cast<size_t>(n) * KBlocks(k), 1.0f);
    for (int c = 0; c < n; ++c) {
      if ((c & 0x7f) != 0x7f) bytes[static_cast<size_t>(c) * k] = static_cast<uint8_t>(c);
    }
    std::vector<uint8_t> packed(kernels::PackedFP8Bytes(n, k));
    kernels::PackFP8(bytes.data(), scales.data(), n, k, packed.data());
    const std::vector<float> x(k, 1.0f);
    std::vector<float> y(n, NAN);
    kernels::MatMulFP8(x.data(), packed.data(), y.data(), 1, n, k);
    for (int c = 0; c < n; ++c) {
      const bool zero = (c & 0x7f) == 0x7f || (c & 0x78) == 0;
      const float want = zero ? 0.0f : F8E4M3ToF32(static_cast<uint8_t>(c));
      ASSERT_EQ(y[c], want) << "byte 0x" << std::hex << c << " (k " << std::dec << k << ")";
    }
  }
  // Spot values through the kernel (common/dtype_test.cc checks the decoder itself).
  const uint8_t spots[] = {0x38, 0x7e, 0x08, 0x80};
  const float want[] = {1.0f, 448.0f, std::ldexp(1.0f, -6), 0.0f};
  const std::vector<float> scales(4, 1.0f);
  std::vector<uint8_t> packed(kernels::PackedFP8Bytes(4, 1));
  kernels::PackFP8(spots, scales.data(), 4, 1, packed.data());
  const float one = 1.0f;
  float y[4];
  kernels::MatMulFP8(&one, packed.data(), y, 1, 4, 1);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(y[c], want[c]) << c;
}

// Every row of a 40-row product equals that row computed alone, bit for bit, for windows of
// every size (tile tails of 1..6 rows, several token blocks of rows); m = 1 against m = 37
// explicitly.
TEST_P(Fp8PathTest, RowsDoNotDependOnTheBatch) {
  std::mt19937 rng(11);
  const int n = 136, k = 333, rows = 40;
  const Fp8Matrix w(n, k, rng);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(rows) * k, rng);
  ExpectRowsIndependentOfBatch(x, w.packed.data(), n, k, kernels::MatMulFP8, /*all_at_once=*/37);
}

// A prefill: more rows than a token block (96) widen each weight once for all of them (by
// strips of 2048 values of k on avx512; kernel_table.h). k = 2347 gives two strips, the second
// ending in a short, odd k block, and n = 136 a partial last 64-column block. Every row equals
// that row alone (the decode route), and windows that take each route (up to 96 rows: the
// token-block route; more: the strips) give the same bits, with 1, 2 and 3 threads.
TEST_P(Fp8PathTest, PrefillRowsEqualTheRowsAloneAcrossStrips) {
  std::mt19937 rng(13);
  const int n = 136, k = 2347, rows = 2 * 96 + 13;
  const Fp8Matrix w(n, k, rng);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(rows) * k, rng);
  std::vector<float> alone(static_cast<size_t>(rows) * n);
  omp_set_num_threads(1);
  for (int i = 0; i < rows; ++i) {
    kernels::MatMulFP8(&x[static_cast<size_t>(i) * k], w.packed.data(),
                       &alone[static_cast<size_t>(i) * n], 1, n, k);
  }
  std::vector<float> y(alone.size());
  const std::pair<int, int> windows[] = {
      {0, rows}, {0, 96}, {5, 97}, {100, rows - 100}, {1, rows - 1}};
  for (const int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (const auto& [first, count] : windows) {
      // With a team, two windows suffice (it splits the weight blocks, never the rows).
      if (threads > 1 && count != rows && count != 97) continue;
      std::fill(y.begin(), y.end(), NAN);
      kernels::MatMulFP8(&x[static_cast<size_t>(first) * k], w.packed.data(), y.data(), count, n,
                         k);
      ASSERT_EQ(
          std::memcmp(y.data(), &alone[static_cast<size_t>(first) * n], sizeof(float) * count * n),
          0)
          << threads << " threads, rows [" << first << ", " << first + count << ")";
    }
  }
}

// Large enough to run on the OpenMP team (kernels.cc's kParallelMacs): the same bits with 1, 2,
// 3 and 5 threads, and for 1 and many rows.
TEST_P(Fp8PathTest, ResultsDoNotDependOnTheThreadCount) {
  std::mt19937 rng(12);
  const int n = 700, k = 1000, m = 9;
  const Fp8Matrix w(n, k, rng);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(m) * k, rng);
  ExpectSameBitsForEveryThreadCount(x, w.packed.data(), n, k, kernels::MatMulFP8);
}

// The order is fixed across paths (kernel_table.h): every path computes the generic path's bits,
// whatever the shape (ragged blocks, every tile height).
TEST_P(Fp8PathTest, AgreesWithTheGenericPathBitForBit) {
  if (GetParam() == "generic") GTEST_SKIP() << "generic is the reference of this test";
  auto run = [] {
    std::vector<float> all;
    for (const Fp8Shape& s : kFp8Shapes) {
      std::mt19937 rng(s.m + 7 * s.n + 13 * s.k);
      const Fp8Matrix w(s.n, s.k, rng);
      const std::vector<float> x = RandomFloats(static_cast<size_t>(s.m) * s.k, rng);
      std::vector<float> y(static_cast<size_t>(s.m) * s.n);
      kernels::MatMulFP8(x.data(), w.packed.data(), y.data(), s.m, s.n, s.k);
      all.insert(all.end(), y.begin(), y.end());
    }
    return all;
  };
  const std::vector<float> got = run();
  ASSERT_TRUE(kernels::SelectPath("generic").ok());
  const std::vector<float> want = run();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
        << "value " << i << ": " << GetParam() << " " << got[i] << ", generic " << want[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, Fp8PathTest, ::testing::ValuesIn(KernelPathNames()),
                         [](const auto& info) { return KernelPathTestName(info.param); });

// The packed size: one byte per weight of every 64-column block (columns past n padded, an odd
// k to whole pairs) and 64 F32 scales per block and k block.
TEST(Fp8PackTest, PackedSizeIsOneBytePerWeightPlusTheScales) {
  EXPECT_EQ(kernels::PackedFP8Bytes(64, 128), 64u * 128 + 64 * 4);
  EXPECT_EQ(kernels::PackedFP8Bytes(65, 129), 2u * (64 * 130 + 2 * 64 * 4));
  EXPECT_EQ(kernels::PackedFP8Bytes(896, 4864) % 64, 0u);
}

}  // namespace
}  // namespace pdserve
