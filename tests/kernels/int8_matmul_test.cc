// The INT8 product (kernels::MatMulInt8) on every kernel path: against float64 loops over x
// rounded to BF16 and the dequantised weights (int8 value times its row's block scale), every
// byte's widening, and the invariances of DESIGN.md §6: a row's bits do not depend on the other
// rows of the batch, nor on the OpenMP team, and every path computes the generic path's bits.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
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

TEST_P(Int8MatMulTest, MatchesFloat64LoopsOverTheDequantisedWeights) {
  const auto [m, n, k] = std::get<1>(GetParam());
  std::mt19937 rng(m * 1000003 + n * 1009 + k + 5);
  const Int8Matrix w(n, k, rng);
  const std::vector<float> x = RandomInt8TestFloats(static_cast<size_t>(m) * k, rng);
  std::vector<float> y(static_cast<size_t>(m) * n, NAN);
  kernels::MatMulInt8(x.data(), w.packed.data(), y.data(), m, n, k);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double want = 0, magnitude = 0;
      for (int e = 0; e < k; ++e) {
        // x as the kernels take it: rounded to BF16 (kernel_table.h).
        const double xe = BF16ToF32(F32ToBF16(x[static_cast<size_t>(i) * k + e]));
        const double p = xe * w.Weight(j, e);
        want += p;
        magnitude += std::abs(p);
      }
      // Exact products, one rounding per addition, at most 128 within a k block and one per
      // block: a few hundred units of 2^-24 of the sum of magnitudes at worst.
      ASSERT_NEAR(y[static_cast<size_t>(i) * n + j], want, 2e-5 * magnitude + 1e-30)
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
// block) and zeros elsewhere, x is 1, scales 1 and 0.5: y[c] is exactly (int8) c times 1.5, so
// every byte position of every word widens right, -128 and the sign included.
TEST_P(Int8PathTest, WidensEveryByteExactly) {
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
    const std::vector<float> x(k, 1.0f);
    std::vector<float> y(n, NAN);
    kernels::MatMulInt8(x.data(), packed.data(), y.data(), 1, n, k);
    for (int c = 0; c < n; ++c) {
      const float v = static_cast<float>(static_cast<int8_t>(c));
      ASSERT_EQ(y[c], k > 128 ? 1.5f * v : v) << "byte " << c << " (k " << k << ")";
    }
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
