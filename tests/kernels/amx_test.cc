// The AMX tile kernels (kernels "amx" and "amx-model") and the software model of the tile
// instructions they are tested on where no AMX is (src/kernels/amx_model.h):
//  - TDPBF16PS of the model against a reference written here from the SDM's pseudocode in
//    another style (denormals by the exponent field, tininess from a long double FMA), on
//    random and special values, and against values derived by hand for each documented rule;
//  - MatMulBF16 on the AMX paths, bit for bit, against that reference chunk by chunk;
//  - on a CPU with AMX, the real instructions against the model, bit for bit (SKIPPED, loudly,
//    elsewhere).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/amx_model.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "testing/kernel_paths.h"

namespace pdserve {
namespace {

using kernels::internal::TileConfig;
using kernels::internal::TileMachine;

// ---- The reference: SDM TDPBF16PS, one output element at a time ----

bool ExponentFieldZero(float v) { return (std::bit_cast<uint32_t>(v) & 0x7f800000u) == 0; }
float SignedZeroOf(float v) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(v) & 0x80000000u);
}
// DAZ: a denormal input is a zero of its sign.
float RefDaz(float v) { return ExponentFieldZero(v) ? SignedZeroOf(v) : v; }

// FP32 FMA, DAZ, RNE, FTZ with tininess after rounding: a result is flushed when its exact
// value, rounded to 24 bits with an unbounded exponent, is below 2^-126, i.e. when the exact
// value is below 2^-126 - 2^-151 (the midpoint under 2^-126 rounds up to it, even). The long
// double FMA (64-bit significand) decides that exactly: an exact value this near 2^-126 is a
// multiple of at least 2^-166 (its c is a multiple of 2^-149, its product of 2^-166 when
// nearly as large as |c - threshold|), far coarser than the 2^-190 it rounds to.
float RefFma(float a, float b, float c) {
  a = RefDaz(a);
  b = RefDaz(b);
  c = RefDaz(c);
  const float r = std::fma(a, b, c);
  const long double exact = std::fma(static_cast<long double>(a), static_cast<long double>(b),
                                     static_cast<long double>(c));
  const long double threshold = std::ldexp(1.0L, -126) - std::ldexp(1.0L, -151);
  return std::fabs(exact) < threshold ? SignedZeroOf(r) : r;
}

// FP32 add, DAZ, RNE, FTZ (a sum of floats is exact below 2^-126: tiny means denormal).
float RefAdd(float a, float b) {
  const float r = RefDaz(a) + RefDaz(b);
  return ExponentFieldZero(r) ? SignedZeroOf(r) : r;
}

// c[m][n] of TDPBF16PS over `pairs` pairs: a_row holds 2 * pairs bf16 of row m of A; b(k, j)
// is element j of row k of B (bf16 j = 2n + 0/1).
template <typename B>
float RefElement(float c, const uint16_t* a_row, int pairs, int n, B b) {
  float even = 0.0f, odd = 0.0f;
  for (int k = 0; k < pairs; ++k) {
    even = RefFma(BF16ToF32(a_row[2 * k]), BF16ToF32(b(k, 2 * n)), even);
    odd = RefFma(BF16ToF32(a_row[2 * k + 1]), BF16ToF32(b(k, 2 * n + 1)), odd);
  }
  return RefAdd(c, RefAdd(even, odd));
}

bool SameBits(float a, float b) {
  return std::isnan(a) ? std::isnan(b) : std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

// ---- One TDPBF16PS on the model ----

// C [rows][cols] floats += A [rows][2 * pairs] bf16 x B [pairs][2 * cols] bf16 on tiles 0, 1, 2.
std::vector<float> ModelDot(std::vector<float> c, const std::vector<uint16_t>& a,
                            const std::vector<uint16_t>& b, int rows, int cols, int pairs) {
  TileConfig config{};
  config.palette_id = 1;
  config.rows[0] = config.rows[1] = static_cast<uint8_t>(rows);
  config.colsb[0] = static_cast<uint16_t>(4 * cols);
  config.colsb[1] = static_cast<uint16_t>(4 * pairs);
  config.rows[2] = static_cast<uint8_t>(pairs);
  config.colsb[2] = static_cast<uint16_t>(4 * cols);
  TileMachine tiles;
  tiles.LoadConfig(config);
  tiles.Load(0, c.data(), 4 * cols);
  tiles.Load(1, a.data(), 4 * pairs);
  tiles.Load(2, b.data(), 4 * cols);
  tiles.DotBF16(0, 1, 2);
  tiles.Store(0, c.data(), 4 * cols);
  return c;
}

std::vector<float> RefDot(const std::vector<float>& c, const std::vector<uint16_t>& a,
                          const std::vector<uint16_t>& b, int rows, int cols, int pairs) {
  std::vector<float> out(c.size());
  for (int m = 0; m < rows; ++m) {
    for (int n = 0; n < cols; ++n) {
      out[m * cols + n] = RefElement(c[m * cols + n], &a[2 * m * pairs], pairs, n,
                                     [&](int k, int j) { return b[k * 2 * cols + j]; });
    }
  }
  return out;
}

uint16_t Bf16(float v) { return F32ToBF16(v); }

// One output element over `pairs` (even, odd) pairs of A with all of B one: what TDPBF16PS
// leaves in C starting from `c`.
float OneElement(float c, const std::vector<std::pair<float, float>>& a_pairs) {
  std::vector<uint16_t> a, b;
  for (auto [even, odd] : a_pairs) {
    a.push_back(Bf16(even));
    a.push_back(Bf16(odd));
    b.push_back(Bf16(1.0f));
    b.push_back(Bf16(1.0f));
  }
  const int pairs = static_cast<int>(a_pairs.size());
  const float got = ModelDot({c}, a, b, 1, 1, pairs)[0];
  EXPECT_TRUE(SameBits(got, RefDot({c}, a, b, 1, 1, pairs)[0])) << "model and reference differ";
  return got;
}

TEST(AmxModelTest, RandomTilesMatchTheReferenceBitForBit) {
  std::mt19937 rng(13);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::uniform_int_distribution<int> size(1, 16);
  for (int round = 0; round < 40; ++round) {
    const int rows = size(rng), cols = size(rng), pairs = size(rng);
    std::vector<float> c(rows * cols);
    std::vector<uint16_t> a(2 * rows * pairs), b(2 * pairs * cols);
    for (float& v : c) v = dist(rng);
    for (uint16_t& v : a) v = Bf16(dist(rng));
    for (uint16_t& v : b) v = Bf16(dist(rng));
    const std::vector<float> got = ModelDot(c, a, b, rows, cols, pairs);
    const std::vector<float> want = RefDot(c, a, b, rows, cols, pairs);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(SameBits(got[i], want[i]))
          << "round " << round << " element " << i << ": " << got[i] << " vs " << want[i];
    }
  }
}

TEST(AmxModelTest, SpecialValuesMatchTheReferenceBitForBit) {
  // Random bit patterns, weighted to denormals, the edges of the range, infinities and NaNs.
  std::mt19937 rng(17);
  const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x0080, 0x8080, 0x7f7f, 0xff7f,
                               0x7f80, 0xff80, 0x7fc0, 0x3f80, 0xbf80, 0x1f80, 0x9f80, 0x2080};
  auto pick = [&]() -> uint16_t {
    const uint32_t r = rng();
    return (r & 3) == 0 ? static_cast<uint16_t>(r >> 16) : specials[(r >> 2) % 16];
  };
  const uint32_t c_specials[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu,
                                 0x00800000u, 0x7f800000u, 0x3f800000u, 0x7f7fffffu};
  for (int round = 0; round < 60; ++round) {
    const int rows = 4, cols = 16, pairs = 16;
    std::vector<float> c(rows * cols);
    std::vector<uint16_t> a(2 * rows * pairs), b(2 * pairs * cols);
    for (float& v : c)
      v = std::bit_cast<float>(static_cast<uint32_t>(c_specials[rng() % 8] ^ (rng() & 0x3u)));
    for (uint16_t& v : a) v = pick();
    for (uint16_t& v : b) v = pick();
    const std::vector<float> got = ModelDot(c, a, b, rows, cols, pairs);
    const std::vector<float> want = RefDot(c, a, b, rows, cols, pairs);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(SameBits(got[i], want[i]))
          << "round " << round << " element " << i << ": " << got[i] << " vs " << want[i];
    }
  }
}

TEST(AmxModelTest, EvenAndOddProductsAreSeparateChainsAddedAtTheEnd) {
  // Even chain 1 + 0 = 1, odd chain 2^-24 + 2^-24 = 2^-23: the sum 1 + 2^-23 is exact. One
  // chain alternating even and odd products (the Intrinsics Guide's sketch) would round each
  // 1 + 2^-24 back to 1.
  EXPECT_EQ(OneElement(0.0f, {{1.0f, 0x1p-24f}, {0.0f, 0x1p-24f}}), 1.0f + 0x1p-23f);
  // The instruction's sum is added to C once: C = 1, even + odd = 2^-23 -> 1 + 2^-23 (adding
  // the two chains to C one by one would give 1 twice).
  EXPECT_EQ(OneElement(1.0f, {{0x1p-24f, 0x1p-24f}}), 1.0f + 0x1p-23f);
}

TEST(AmxModelTest, RoundsToNearestEvenOnTies) {
  // 1 + 2^-24 is halfway between 1 and 1 + 2^-23: the even one, 1.
  EXPECT_EQ(OneElement(0.0f, {{1.0f, 0.0f}, {0x1p-24f, 0.0f}}), 1.0f);
  // 1 + 3 * 2^-24 is halfway between 1 + 2^-23 and 1 + 2^-22: the even one, 1 + 2^-22.
  EXPECT_EQ(OneElement(0.0f, {{1.0f, 0.0f}, {3 * 0x1p-24f, 0.0f}}), 1.0f + 0x1p-22f);
  // Each FMA rounds once: (1 + 2^-7) * (1 + 2^-7) + 0 = 1 + 2^-6 + 2^-14, exact in FP32.
  std::vector<uint16_t> a = {Bf16(1.0f + 0x1p-7f), 0}, b = {Bf16(1.0f + 0x1p-7f), 0};
  EXPECT_EQ(ModelDot({0.0f}, a, b, 1, 1, 1)[0], 1.0f + 0x1p-6f + 0x1p-14f);
}

TEST(AmxModelTest, DenormalInputsAreZerosAndTinyResultsFlushToZero) {
  // A denormal bf16 (2^-133) times 2^100 would be 2^-33; as zero it is 0.
  std::vector<uint16_t> a = {0x0001, 0}, b = {Bf16(0x1p100f), 0};
  EXPECT_EQ(ModelDot({0.0f}, a, b, 1, 1, 1)[0], 0.0f);
  // A denormal accumulator in C is taken as zero: C = 2^-127 plus the instruction's 2^-126
  // (2^-63 * 2^-63) gives 2^-126, not 1.5 * 2^-126.
  a = {Bf16(0x1p-63f), 0};
  b = {Bf16(0x1p-63f), 0};
  EXPECT_EQ(ModelDot({0x1p-127f}, a, b, 1, 1, 1)[0], 0x1p-126f);
  // 2^-70 * 2^-70 = 2^-140 is denormal: flushed, to a zero of its sign.
  a = {Bf16(0x1p-70f), 0};
  b = {Bf16(0x1p-70f), 0};
  EXPECT_EQ(std::bit_cast<uint32_t>(ModelDot({0.0f}, a, b, 1, 1, 1)[0]), 0u);
  // Both chains -2^-140 -> -0; -0 + -0 = -0, and C = -0 plus that stays -0.
  a = {Bf16(-0x1p-70f), Bf16(-0x1p-70f)};
  b = {Bf16(0x1p-70f), Bf16(0x1p-70f)};
  const float negative = ModelDot({-0.0f}, a, b, 1, 1, 1)[0];
  EXPECT_EQ(std::bit_cast<uint32_t>(negative), 0x80000000u) << negative;
  // Tininess after rounding: 2^-126 - 2^-150 rounds (denormally) to 2^-126, but with 24 bits
  // and no exponent limit it stays below, so it is tiny and flushed...
  a = {Bf16(0x1p-63f), 0, Bf16(0x1p-75f), 0};
  b = {Bf16(0x1p-63f), 0, Bf16(-0x1p-75f), 0};
  EXPECT_EQ(ModelDot({0.0f}, a, b, 1, 1, 2)[0], 0.0f);
  // ... while 2^-126 - 2^-152 rounds up to 2^-126 either way and stays.
  a = {Bf16(0x1p-63f), 0, Bf16(0x1p-76f), 0};
  b = {Bf16(0x1p-63f), 0, Bf16(-0x1p-76f), 0};
  EXPECT_EQ(ModelDot({0.0f}, a, b, 1, 1, 2)[0], 0x1p-126f);
}

TEST(AmxModelTest, InfinitiesAndNans) {
  const float inf = INFINITY;
  std::vector<uint16_t> a = {Bf16(inf), 0}, b = {0, 0};
  EXPECT_TRUE(std::isnan(ModelDot({0.0f}, a, b, 1, 1, 1)[0]));  // inf * 0
  a = {Bf16(0x1p127f), 0};
  b = {Bf16(0x1p127f), 0};
  EXPECT_EQ(ModelDot({0.0f}, a, b, 1, 1, 1)[0], inf);  // overflow
  // +inf in the even chain, -inf in the odd one: their sum is NaN.
  EXPECT_TRUE(std::isnan(OneElement(0.0f, {{inf, -inf}})));
  // A NaN input (bf16 0x7fc0) or accumulator propagates.
  a = {0x7fc0, 0};
  b = {Bf16(1.0f), 0};
  EXPECT_TRUE(std::isnan(ModelDot({1.0f}, a, b, 1, 1, 1)[0]));
  EXPECT_TRUE(std::isnan(ModelDot({NAN}, {0, 0}, {0, 0}, 1, 1, 1)[0]));
}

TEST(AmxModelTest, LoadAndStoreFollowTheConfiguredShape) {
  TileConfig config{};
  config.palette_id = 1;
  config.rows[3] = 2;
  config.colsb[3] = 8;  // 2 rows x 2 floats
  TileMachine tiles;
  tiles.LoadConfig(config);
  const float src[6] = {1, 2, 3, 4, 5, 6};  // stride 3 floats: rows {1, 2} and {4, 5}
  tiles.Load(3, src, 3 * sizeof(float));
  float dst[6] = {-1, -1, -1, -1, -1, -1};
  tiles.Store(3, dst, 3 * sizeof(float));
  const float want[6] = {1, 2, -1, 4, 5, -1};  // nothing past colsb is written
  EXPECT_EQ(std::memcmp(dst, want, sizeof(dst)), 0);
  tiles.Zero(3);
  tiles.Store(3, dst, 3 * sizeof(float));
  EXPECT_EQ(dst[0], 0.0f);
  EXPECT_EQ(dst[4], 0.0f);
  EXPECT_EQ(dst[2], -1.0f);
}

TEST(AmxModelDeathTest, MismatchedShapesAreTheCpusUndefinedOpcode) {
  TileConfig config{};
  config.palette_id = 1;
  for (int t = 0; t < 3; ++t) {
    config.rows[t] = 4;
    config.colsb[t] = 64;
  }
  config.rows[2] = 8;  // A holds 16 pairs, B only 8
  EXPECT_DEATH(
      {
        TileMachine tiles;
        tiles.LoadConfig(config);
        tiles.DotBF16(0, 1, 2);
      },
      "A.colsb / 4 != B.rows");
}

// ---- MatMulBF16 on the AMX paths ----

// y = x w^T as the AMX kernel computes it: per element, chunks of 16 pairs from k = 0, each
// one TDPBF16PS (missing elements of the last chunk are zeros).
std::vector<float> RefAmxMatMul(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w,
                                int m, int n, int k) {
  const int pairs = (k + 1) / 2;
  std::vector<float> y(static_cast<size_t>(m) * n);
  std::vector<uint16_t> a(32);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int p0 = 0; p0 < pairs; p0 += 16) {
        for (int e = 0; e < 32; ++e) {
          const int col = 2 * p0 + e;
          a[e] = col < k ? x[static_cast<size_t>(i) * k + col] : 0;
        }
        acc = RefElement(acc, a.data(), 16, 0, [&](int kk, int jj) -> uint16_t {
          const int col = 2 * (p0 + kk) + jj;  // jj: 0 even, 1 odd
          return col < k ? w[static_cast<size_t>(j) * k + col] : 0;
        });
      }
      y[static_cast<size_t>(i) * n + j] = acc;
    }
  }
  return y;
}

std::vector<float> RunMatMul(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int m,
                             int n, int k) {
  std::vector<uint16_t> packed(kernels::PackedBF16Elements(n, k));
  kernels::PackBF16(w.data(), n, k, packed.data());
  std::vector<float> y(static_cast<size_t>(m) * n, NAN);
  kernels::MatMulBF16(x.data(), packed.data(), y.data(), m, n, k);
  return y;
}

struct Case {
  int m, n, k;
  bool special;  // denormals, ties and extremes mixed in
};

std::vector<uint16_t> CaseValues(size_t count, bool special, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const uint16_t specials[] = {0x0001, 0x8005, 0x0080, 0x3f80, 0x3380, 0x7f00, 0xff00, 0x0c00};
  std::vector<uint16_t> v(count);
  for (uint16_t& e : v) {
    e = special && rng() % 4 == 0 ? specials[rng() % 8] : F32ToBF16(dist(rng));
  }
  return v;
}

// Odd shapes: one element, tails of 16 pairs and of 32 elements, odd k, partial groups and
// blocks, more rows than one 16-row tile.
const Case kCases[] = {{1, 1, 1, false},    {3, 17, 33, false},  {7, 64, 64, false},
                       {13, 100, 31, true}, {20, 65, 200, true}, {40, 130, 97, false},
                       {2, 16, 32, true},   {17, 48, 1, true}};

class AmxPathTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ::pdserve::testing::UseKernelPath(GetParam()); }
  void TearDown() override { (void)kernels::SelectPath("auto"); }
};

TEST_P(AmxPathTest, ProductsFollowTheTileOrderBitForBit) {
  EXPECT_EQ(std::string(kernels::ActivePath()).rfind(GetParam(), 0), 0u);
  for (const Case& c : kCases) {
    std::mt19937 rng(c.m * 7919 + c.n * 31 + c.k);
    const std::vector<uint16_t> x = CaseValues(static_cast<size_t>(c.m) * c.k, c.special, rng);
    const std::vector<uint16_t> w = CaseValues(static_cast<size_t>(c.n) * c.k, c.special, rng);
    const std::vector<float> got = RunMatMul(x, w, c.m, c.n, c.k);
    const std::vector<float> want = RefAmxMatMul(x, w, c.m, c.n, c.k);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(SameBits(got[i], want[i])) << c.m << "x" << c.n << "x" << c.k << " element " << i
                                             << ": " << got[i] << " vs " << want[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, AmxPathTest, ::testing::Values("amx", "amx-model"),
                         [](const auto& info) {
                           return ::pdserve::testing::KernelPathTestName(info.param);
                         });

// The model is only worth its tests if the tile units compute what it does: on an AMX CPU the
// same products run on both, and must agree bit for bit.
TEST(AmxHardwareTest, RealTilesMatchTheModelBitForBit) {
  ::pdserve::testing::UseKernelPath("amx");
  if (IsSkipped()) return;
  std::vector<std::vector<float>> real;
  std::vector<std::pair<std::vector<uint16_t>, std::vector<uint16_t>>> inputs;
  for (const Case& c : kCases) {
    std::mt19937 rng(c.m * 104729 + c.n * 7 + c.k);
    inputs.emplace_back(CaseValues(static_cast<size_t>(c.m) * c.k, c.special, rng),
                        CaseValues(static_cast<size_t>(c.n) * c.k, c.special, rng));
    real.push_back(RunMatMul(inputs.back().first, inputs.back().second, c.m, c.n, c.k));
  }
  ASSERT_TRUE(kernels::SelectPath("amx-model").ok());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Case& c = kCases[i];
    const std::vector<float> model = RunMatMul(inputs[i].first, inputs[i].second, c.m, c.n, c.k);
    for (size_t e = 0; e < model.size(); ++e) {
      ASSERT_TRUE(SameBits(real[i][e], model[e]))
          << c.m << "x" << c.n << "x" << c.k << " element " << e << ": real " << real[i][e]
          << ", model " << model[e];
    }
  }
  (void)kernels::SelectPath("auto");
}

}  // namespace
}  // namespace pdserve
