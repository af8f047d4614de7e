// The INT8 product (kernels::MatMulInt8) on every kernel path: against float64 loops over x
// quantised per row and 128-wide k block (kernel_table.h) and the dequantised weights (int8 value
// times its row's block scale), within the quantisation's bound of the unquantised product,
// every byte of the weights, blocks of x that are zero, tiny or not finite, and the invariances
// of DESIGN.md §6: a row's bits do not depend on the other rows of the batch, nor on the OpenMP
// team, and every path computes the generic path's bits.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

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

int Int8KBlocks(int k) { return (k + kernels::kFp8BlockK - 1) / kernels::kFp8BlockK; }

// A random INT8 matrix [n][k] (every value, -128 included) with random scales per row and k
// block, packed.
struct Int8Matrix {
  int n, k;
  std::vector<int8_t> values;
  std::vector<float> scales;  // [n][Int8KBlocks(k)]
  std::vector<uint8_t> packed;

  Int8Matrix(int rows, int cols, std::mt19937& rng) : n(rows), k(cols) {
    std::uniform_int_distribution<int> value(-128, 127);
    std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
    std::uniform_int_distribution<int> exponent(-14, -4);
    values.resize(static_cast<size_t>(n) * k);
    for (int8_t& v : values) v = static_cast<int8_t>(value(rng));
    scales.resize(static_cast<size_t>(n) * Int8KBlocks(k));
    for (float& s : scales) s = std::ldexp(mantissa(rng), exponent(rng));
    packed.assign(kernels::PackedInt8Bytes(n, k), 0xcd);
    kernels::PackInt8(values.data(), scales.data(), n, k, packed.data());
  }
  double Weight(int row, int col) const {
    return static_cast<double>(values[static_cast<size_t>(row) * k + col]) *
           scales[static_cast<size_t>(row) * Int8KBlocks(k) + col / kernels::kFp8BlockK];
  }
};

std::vector<float> RandomInt8TestFloats(size_t count, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(count);
  for (float& e : v) e = dist(rng);
  return v;
}

struct Int8Shape {
  int m, n, k;
};

// Ragged on purpose, as the FP8 test's: partial groups and blocks, short k blocks, m 1..40.
const Int8Shape kInt8Shapes[] = {{1, 1, 1},      {3, 17, 33},   {7, 64, 128},  {13, 100, 129},
                                 {1, 130, 257},  {20, 65, 200}, {40, 48, 300}, {6, 200, 1025},
                                 {37, 129, 384}, {2, 16, 127}};

class Int8MatMulTest : public ::testing::TestWithParam<std::tuple<std::string, Int8Shape>> {
 protected:
  void SetUp() override { UseKernelPath(std::get<0>(GetParam())); }
  void TearDown() override { (void)kernels::SelectPath("auto"); }
};

// x as the INT8 products take it (kernel_table.h), written out here: per row and k block
// a = max |x|, q = x * (127 / a) rounded to nearest even, the block's scale a / 127.
struct QuantisedX {
  std::vector<int> q;         // [m][k]
  std::vector<float> scales;  // [m][Int8KBlocks(k)]
  QuantisedX(const std::vector<float>& x, int m, int k) : q(x.size()) {
    const int blocks = Int8KBlocks(k);
    scales.resize(static_cast<size_t>(m) * blocks);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < blocks; ++j) {
        const int k0 = j * kernels::kFp8BlockK, k1 = std::min(k, k0 + kernels::kFp8BlockK);
        float a = 0;
        for (int e = k0; e < k1; ++e) a = std::max(a, std::abs(x[static_cast<size_t>(i) * k + e]));
        scales[static_cast<size_t>(i) * blocks + j] = a / 127.0f;
        for (int e = k0; e < k1; ++e) {
          const size_t at = static_cast<size_t>(i) * k + e;
          q[at] = a == 0 ? 0 : static_cast<int>(std::nearbyint(x[at] * (127.0f / a)));
        }
      }
    }
  }
};

TEST_P(Int8MatMulTest, MatchesFloat64LoopsOverTheQuantisedRows) {
  const auto [m, n, k] = std::get<1>(GetParam());
  std::mt19937 rng(m * 1000003 + n * 1009 + k + 5);
  const Int8Matrix w(n, k, rng);
  std::vector<float> x = RandomInt8TestFloats(static_cast<size_t>(m) * k, rng);
  // Row 0's first block 1000 times larger (an outlier): the other blocks keep their own scale.
  for (int e = 0; e < std::min(k, kernels::kFp8BlockK); ++e) x[e] *= 1000.0f;
  const QuantisedX xq(x, m, k);
  std::vector<float> y(static_cast<size_t>(m) * n, NAN);
  kernels::MatMulInt8(x.data(), w.packed.data(), y.data(), m, n, k);
  const int blocks = Int8KBlocks(k);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double want = 0, magnitude = 0, exact = 0, bound = 0;
      for (int b = 0; b < blocks; ++b) {
        const float sx = xq.scales[static_cast<size_t>(i) * blocks + b];
        const float sw = w.scales[static_cast<size_t>(j) * blocks + b];
        double sum = 0, weights = 0;
        for (int e = b * kernels::kFp8BlockK; e < std::min(k, (b + 1) * kernels::kFp8BlockK); ++e) {
          const size_t at = static_cast<size_t>(i) * k + e;
          sum += static_cast<double>(xq.q[at]) * w.values[static_cast<size_t>(j) * k + e];
          exact += static_cast<double>(x[at]) * w.Weight(j, e);
          weights += std::abs(w.Weight(j, e));
        }
        want += sum * static_cast<double>(sx * sw);
        magnitude += std::abs(sum * sx * sw);
        bound += 0.5 * sx * weights;  // half a step of x per weight
      }
      // Exact integer sums and the same product of the scales; per block one rounding (the
      // FMA's), at most 2^-24 of the sum of magnitudes each.
      ASSERT_NEAR(y[static_cast<size_t>(i) * n + j], want, 6e-8 * blocks * magnitude + 1e-30)
          << "row " << i << " column " << j;
      // And the quantisation's own bound against the product of the unquantised x.
      ASSERT_NEAR(y[static_cast<size_t>(i) * n + j], exact, bound * 1.001 + 1e-6 * magnitude)
          << "row " << i << " column " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, Int8MatMulTest,
                         ::testing::Combine(::testing::ValuesIn(KernelPathNames()),
                                            ::testing::ValuesIn(kInt8Shapes)),
                         [](const auto& info) {
                           const Int8Shape& s = std::get<1>(info.param);
                           return KernelPathTestName(std::get<0>(info.param)) + "_" +
                                  std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                                  std::to_string(s.k);
                         });

class Int8PathTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { UseKernelPath(GetParam()); }
  void TearDown() override {
    (void)kernels::SelectPath("auto");
    omp_set_num_threads(threads_);
  }
  const int threads_ = omp_get_max_threads();
};

// Column c holds byte c in k index 0 of each k block (and in the last k index of the first
// block) and zeros elsewhere, x is 127 (so q = 127 and its scale 1), scales 1 and 0.5: y[c] is
// exactly 127 (int8) c times 1.5, so every byte position of every lane reads right, -128 and
// the sign included.
TEST_P(Int8PathTest, ReadsEveryByteExactly) {
  for (const int k : {1, 130}) {
    const int n = 256;
    std::vector<int8_t> values(static_cast<size_t>(n) * k, 0);
    std::vector<float> scales(static_cast<size_t>(n) * Int8KBlocks(k), 0.5f);
    for (int c = 0; c < n; ++c) {
      values[static_cast<size_t>(c) * k] = static_cast<int8_t>(c);
      scales[static_cast<size_t>(c) * Int8KBlocks(k)] = 1.0f;
      if (k > 128) values[static_cast<size_t>(c) * k + 128] = static_cast<int8_t>(c);
    }
    std::vector<uint8_t> packed(kernels::PackedInt8Bytes(n, k));
    kernels::PackInt8(values.data(), scales.data(), n, k, packed.data());
    const std::vector<float> x(k, 127.0f);
    std::vector<float> y(n, NAN);
    kernels::MatMulInt8(x.data(), packed.data(), y.data(), 1, n, k);
    for (int c = 0; c < n; ++c) {
      const float v = 127.0f * static_cast<float>(static_cast<int8_t>(c));
      ASSERT_EQ(y[c], k > 128 ? 1.5f * v : v) << "byte " << c << " (k " << k << ")";
    }
  }
}

// A row of x that is zero, or tiny (below 2^-96 a block quantises to zeros, where 127 / max
// would overflow), gives zeros; a block with an inf or a NaN makes its row's outputs NaN and
// leaves the other rows as they are alone.
TEST_P(Int8PathTest, ZeroTinyAndNonFiniteBlocks) {
  std::mt19937 rng(23);
  const int n = 80, k = 300, m = 5;
  const Int8Matrix w(n, k, rng);
  std::vector<float> x = RandomInt8TestFloats(static_cast<size_t>(m) * k, rng);
  for (int e = 0; e < k; ++e) x[1 * k + e] = 0.0f;
  for (int e = 0; e < k; ++e) x[2 * k + e] = e % 2 == 0 ? 1e-39f : -3e-38f;
  x[3 * k + 290] = INFINITY;
  x[4 * k + 7] = NAN;
  std::vector<float> y(static_cast<size_t>(m) * n, 1.0f);
  kernels::MatMulInt8(x.data(), w.packed.data(), y.data(), m, n, k);
  std::vector<float> alone(n, NAN);
  kernels::MatMulInt8(x.data(), w.packed.data(), alone.data(), 1, n, k);
  for (int c = 0; c < n; ++c) {
    ASSERT_EQ(std::memcmp(&y[c], &alone[c], sizeof(float)), 0) << "column " << c;
    EXPECT_EQ(y[1 * n + c], 0.0f) << "column " << c;
    EXPECT_EQ(y[2 * n + c], 0.0f) << "column " << c;
    EXPECT_TRUE(std::isnan(y[3 * n + c])) << "column " << c;
    EXPECT_TRUE(std::isnan(y[4 * n + c])) << "column " << c;
  }
}

// Every row of a 40-row product equals that row computed alone, bit for bit, for windows of
// every size; m = 1 against m = 37 explicitly.
TEST_P(Int8PathTest, RowsDoNotDependOnTheBatch) {
  std::mt19937 rng(21);
  const int n = 136, k = 333, rows = 40;
  const Int8Matrix w(n, k, rng);
  const std::vector<float> x = RandomInt8TestFloats(static_cast<size_t>(rows) * k, rng);
  ExpectRowsIndependentOfBatch(x, w.packed.data(), n, k, kernels::MatMulInt8, /*all_at_once=*/37);
}

// On the OpenMP team: the same bits with 1, 2, 3 and 5 threads, for 1 and many rows.
TEST_P(Int8PathTest, ResultsDoNotDependOnTheThreadCount) {
  std::mt19937 rng(22);
  const int n = 700, k = 1000, m = 9;
  const Int8Matrix w(n, k, rng);
  const std::vector<float> x = RandomInt8TestFloats(static_cast<size_t>(m) * k, rng);
  ExpectSameBitsForEveryThreadCount(x, w.packed.data(), n, k, kernels::MatMulInt8);
}

// Every path computes the generic path's bits, whatever the shape.
TEST_P(Int8PathTest, AgreesWithTheGenericPathBitForBit) {
  if (GetParam() == "generic") GTEST_SKIP() << "generic is the reference of this test";
  auto run = [] {
    std::vector<float> all;
    for (const Int8Shape& s : kInt8Shapes) {
      std::mt19937 rng(s.m + 7 * s.n + 13 * s.k + 1);
      const Int8Matrix w(s.n, s.k, rng);
      const std::vector<float> x = RandomInt8TestFloats(static_cast<size_t>(s.m) * s.k, rng);
      std::vector<float> y(static_cast<size_t>(s.m) * s.n);
      kernels::MatMulInt8(x.data(), w.packed.data(), y.data(), s.m, s.n, s.k);
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

INSTANTIATE_TEST_SUITE_P(Paths, Int8PathTest, ::testing::ValuesIn(KernelPathNames()),
                         [](const auto& info) { return KernelPathTestName(info.param); });

}  // namespace
}  // namespace pdserve
