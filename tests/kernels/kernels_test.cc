// The compute kernels against float64 loops, and the batch invariance the disaggregated design
// relies on (DESIGN.md §6): a row's result is bit-identical whatever else shares the call. Every
// test runs on every kernel path compiled in (kernels/dispatch.h); a path this CPU cannot run
// is reported SKIPPED with the features it lacks.
#include "kernels/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/dtype.h"
#include "kernels/dispatch.h"
#include "matmul_checks.h"
#include "testing/kernel_paths.h"

namespace pdserve {
namespace {

using ::pdserve::testing::ExpectRowsIndependentOfBatch;
using ::pdserve::testing::KernelPathNames;
using ::pdserve::testing::KernelPathTestName;
using ::pdserve::testing::UseKernelPath;

std::vector<uint16_t> RandomBF16(size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> v(count);
  for (uint16_t& e : v) e = F32ToBF16(dist(rng));
  return v;
}

struct Shape {
  int m, n, k;
};

// Odd sizes on purpose: a partial 16-column group, a partial 64-column block, an odd k.
const Shape kShapes[] = {{1, 1, 1},   {3, 17, 33},   {7, 64, 64},  {13, 100, 31},
                         {1, 130, 7}, {20, 65, 200}, {97, 48, 96}, {6, 200, 1025}};

// Parameters: (kernel path, shape); the path is selected in SetUp.
template <typename Param>
class OnEveryPath : public ::testing::TestWithParam<std::tuple<std::string, Param>> {
 protected:
  void SetUp() override { UseKernelPath(std::get<0>(this->GetParam())); }
  void TearDown() override { (void)kernels::SelectPath("auto"); }
  const Param& param() const { return std::get<1>(this->GetParam()); }
};

class PathTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { UseKernelPath(GetParam()); }
  void TearDown() override { (void)kernels::SelectPath("auto"); }
};

std::string ShapeName(const Shape& s) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
}

class PackedMatMulTest : public OnEveryPath<Shape> {};

TEST_P(PackedMatMulTest, MatchesFloat64Loops) {
  const auto [m, n, k] = param();
  std::mt19937 rng(m * 1000003 + n * 1009 + k);
  const std::vector<uint16_t> x = RandomBF16(static_cast<size_t>(m) * k, rng);
  const std::vector<uint16_t> w = RandomBF16(static_cast<size_t>(n) * k, rng);
  std::vector<uint16_t> packed(kernels::PackedBF16Elements(n, k));
  kernels::PackBF16(w.data(), n, k, packed.data());
  std::vector<float> y(static_cast<size_t>(m) * n, NAN);
  kernels::MatMulBF16(x.data(), packed.data(), y.data(), m, n, k);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double want = 0, scale = 0;
      for (int e = 0; e < k; ++e) {
        const double p = static_cast<double>(BF16ToF32(x[static_cast<size_t>(i) * k + e])) *
                         BF16ToF32(w[static_cast<size_t>(j) * k + e]);
        want += p;
        scale += std::abs(p);
      }
      // BF16 products are exact in FP32; only the k FP32 additions round.
      ASSERT_NEAR(y[static_cast<size_t>(i) * n + j], want, 1e-6 * k * scale + 1e-30)
          << "row " << i << " column " << j;
    }
  }
}

TEST_P(PackedMatMulTest, UnpackRowRecoversEveryRow) {
  const auto [m, n, k] = param();
  (void)m;
  std::mt19937 rng(n * 31 + k);
  const std::vector<uint16_t> w = RandomBF16(static_cast<size_t>(n) * k, rng);
  std::vector<uint16_t> packed(kernels::PackedBF16Elements(n, k));
  kernels::PackBF16(w.data(), n, k, packed.data());
  std::vector<float> row(k);
  for (int j = 0; j < n; ++j) {
    kernels::UnpackRowBF16(packed.data(), n, k, j, row.data());
    for (int e = 0; e < k; ++e) {
      ASSERT_EQ(row[e], BF16ToF32(w[static_cast<size_t>(j) * k + e])) << j << "," << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, PackedMatMulTest,
                         ::testing::Combine(::testing::ValuesIn(KernelPathNames()),
                                            ::testing::ValuesIn(kShapes)),
                         [](const auto& info) {
                           return KernelPathTestName(std::get<0>(info.param)) + "_" +
                                  ShapeName(std::get<1>(info.param));
                         });

TEST_P(PathTest, Bf16RowsDoNotDependOnTheBatch) {
  std::mt19937 rng(7);
  const int n = 136, k = 77;
  const std::vector<uint16_t> x = RandomBF16(40 * k, rng);
  const std::vector<uint16_t> w = RandomBF16(static_cast<size_t>(n) * k, rng);
  std::vector<uint16_t> packed(kernels::PackedBF16Elements(n, k));
  kernels::PackBF16(w.data(), n, k, packed.data());
  ExpectRowsIndependentOfBatch(x, packed.data(), n, k, kernels::MatMulBF16);
}

TEST_P(PathTest, F32RowsDoNotDependOnTheBatch) {
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int n = 37, k = 70;
  std::vector<float> x(40 * k), w(static_cast<size_t>(n) * k);
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = dist(rng);
  ExpectRowsIndependentOfBatch(x, w.data(), n, k, kernels::MatMulF32);
}

TEST_P(PathTest, ToBF16MatchesTheScalarRoundingBitForBit) {
  // Ties, NaNs (quiet and signalling), infinities, denormals, zeros, and random values; an odd
  // count so that the masked tail runs.
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0x7f800001u, 0xff800123u, 0x00000001u, 0x00400000u, 0x3f808000u,
                                0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x3f807fffu};
  std::mt19937 rng(3);
  for (int i = 0; i < 1000; ++i) bits.push_back(static_cast<uint32_t>(rng()));
  std::vector<float> src(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) std::memcpy(&src[i], &bits[i], sizeof(float));
  std::vector<uint16_t> dst(src.size() + 1, 0xabcd);
  kernels::ToBF16(src.data(), dst.data(), src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(dst[i], F32ToBF16(src[i])) << std::hex << "input 0x" << bits[i];
  }
  EXPECT_EQ(dst.back(), 0xabcd) << "wrote past the end";
}

// Attention over a paged cache: K/V of `ctx` positions written through StoreKv with a given
// page size and cache dtype; the query rows attend to prefixes of it.
struct AttentionShape {
  int heads, kv_heads, head_dim, ctx;
  DType dtype = DType::kF32;
};
struct AttentionCase {
  int heads = 4, kv_heads = 2, head_dim = 40, ctx = 70;
  DType dtype = DType::kF32;
  std::vector<float> q, k, v;  // q [ctx][heads][hd]; k, v [ctx][kv_heads][hd]
};

// The query heads of a GQA group are computed together, as many as fit the registers
// (28 accumulators over head_dim/16 chunks on avx512, 8 heads on avx2): the shapes cover a
// group that fits (2 heads of 40, 7 of 64 as in qwen2.5-0.5b), one split in three (7 heads of
// 128: 3 + 3 + 1), a partial chunk, no GQA (4 of 4 heads of 16), a group larger than 8 heads
// (10 of 10), and head sizes that are no multiple of 8 (20, 12: the row tails). Two shapes have
// longer contexts (300 and 530 positions). BF16 caches are what the engine runs by default.
const AttentionShape kAttentionShapes[] = {{4, 2, 40, 70},
                                           {14, 2, 64, 300},
                                           {7, 1, 128, 70},
                                           {4, 4, 16, 530},
                                           {4, 2, 40, 70, DType::kBF16},
                                           {14, 2, 64, 150, DType::kBF16},
                                           {10, 1, 20, 45, DType::kBF16},
                                           {3, 1, 12, 33}};

class PagedAttentionTest : public OnEveryPath<AttentionShape> {};

AttentionCase MakeCase(const AttentionShape& shape) {
  AttentionCase c;
  c.heads = shape.heads;
  c.kv_heads = shape.kv_heads;
  c.head_dim = shape.head_dim;
  c.ctx = shape.ctx;
  c.dtype = shape.dtype;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  c.q.resize(static_cast<size_t>(c.ctx) * c.heads * c.head_dim);
  c.k.resize(static_cast<size_t>(c.ctx) * c.kv_heads * c.head_dim);
  c.v.resize(c.k.size());
  for (float& e : c.q) e = dist(rng);
  for (float& e : c.k) e = dist(rng);
  for (float& e : c.v) e = dist(rng);
  return c;
}

// How RunAttention hands the queries to PagedAttention.
enum class Calls {
  kTogether,     // all positions in one call (one prefill chunk)
  kOnePerCall,   // one call per position (decode steps)
  kChunksOf5,    // calls of 5 positions (chunked prefill)
  kInterleaved,  // one call, each position next to a query of another sequence (a mixed batch)
};

std::string CallsName(Calls calls) {
  switch (calls) {
    case Calls::kTogether:
      return "one call";
    case Calls::kOnePerCall:
      return "one query per call";
    case Calls::kChunksOf5:
      return "calls of 5 queries";
    case Calls::kInterleaved:
      return "interleaved with another sequence";
  }
  return "?";
}

// out[pos][heads][hd] for every query position (causal), with the given page size.
std::vector<float> RunAttention(const AttentionCase& c, int page_tokens, Calls calls) {
  const int pages = (c.ctx + page_tokens - 1) / page_tokens;
  KvLayout layout{.num_layers = 1,
                  .num_kv_heads = c.kv_heads,
                  .head_dim = c.head_dim,
                  .page_tokens = page_tokens,
                  .dtype = c.dtype,
                  .num_pages = 2 * pages + 3};
  auto cache = KvCache::Create(layout);
  EXPECT_TRUE(cache.ok());
  // Pages out of order, so the block table matters. The other sequence (kInterleaved) has the
  // pages after them, and K and V swapped.
  std::vector<PageId> table(pages), other(pages);
  for (int p = 0; p < pages; ++p) {
    table[p] = pages + 2 - p;
    other[p] = pages + 3 + p;
  }
  const size_t kv_row = static_cast<size_t>(c.kv_heads) * c.head_dim;
  for (int pos = 0; pos < c.ctx; ++pos) {
    kernels::StoreKv(**cache, 0, table[pos / page_tokens], pos % page_tokens, &c.k[pos * kv_row],
                     &c.v[pos * kv_row]);
    kernels::StoreKv(**cache, 0, other[pos / page_tokens], pos % page_tokens, &c.v[pos * kv_row],
                     &c.k[pos * kv_row]);
  }
  const size_t q_row = static_cast<size_t>(c.heads) * c.head_dim;
  std::vector<float> out(c.q.size(), NAN), other_out(c.q.size(), NAN);
  std::vector<kernels::AttentionQuery> queries;
  for (int pos = 0; pos < c.ctx; ++pos) {
    queries.push_back({.q = &c.q[pos * q_row],
                       .out = &out[pos * q_row],
                       .pages = table.data(),
                       .context_len = pos + 1});
    if (calls == Calls::kInterleaved) {
      queries.push_back({.q = &c.q[(c.ctx - 1 - pos) * q_row],
                         .out = &other_out[pos * q_row],
                         .pages = other.data(),
                         .context_len = c.ctx - pos});
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const size_t per_call = calls == Calls::kOnePerCall  ? 1
                          : calls == Calls::kChunksOf5 ? 5
                                                       : queries.size();
  for (size_t first = 0; first < queries.size(); first += per_call) {
    const size_t count = std::min(per_call, queries.size() - first);
    kernels::PagedAttention({&queries[first], count}, **cache, 0, c.heads, scale);
  }
  return out;
}

// K or V element as the cache holds it (rounded to BF16 in a BF16 cache).
double Stored(const AttentionCase& c, float value) {
  return c.dtype == DType::kBF16 ? BF16ToF32(F32ToBF16(value)) : value;
}

TEST_P(PagedAttentionTest, MatchesFloat64Softmax) {
  const AttentionCase c = MakeCase(param());
  const std::vector<float> out = RunAttention(c, 16, Calls::kTogether);
  const int group = c.heads / c.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  for (int pos = 0; pos < c.ctx; ++pos) {
    for (int h = 0; h < c.heads; ++h) {
      const float* q = &c.q[(static_cast<size_t>(pos) * c.heads + h) * c.head_dim];
      std::vector<double> s(pos + 1);
      double max_s = -INFINITY, sum = 0;
      for (int j = 0; j <= pos; ++j) {
        const float* k = &c.k[(static_cast<size_t>(j) * c.kv_heads + h / group) * c.head_dim];
        double d = 0;
        // Over a BF16 cache the scores are BF16 products: q rounded too.
        for (int e = 0; e < c.head_dim; ++e) d += Stored(c, q[e]) * Stored(c, k[e]);
        s[j] = d * scale;
        max_s = std::max(max_s, s[j]);
      }
      for (double& e : s) sum += (e = std::exp(e - max_s));
      for (int e = 0; e < c.head_dim; ++e) {
        auto v = [&](int j) {
          return Stored(c, c.v[(static_cast<size_t>(j) * c.kv_heads + h / group) * c.head_dim + e]);
        };
        double want = 0;
        for (int j = 0; j <= pos; ++j) want += s[j] / sum * v(j);
        // Over a BF16 cache the V sum weighs by the numerators rounded to BF16 (relative error
        // u <= 2^-9, 2^-8 allowing for the F32 e^x near a rounding boundary), normalised by
        // their own sum. Weights w_j (1 + eps_j) move a weighted mean by at most
        // u / (1 - u) * sum_j w_j |v_j - mean|: that bound, on top of the F32 error.
        double tolerance = 1e-5;
        if (c.dtype == DType::kBF16) {
          double spread = 0;
          for (int j = 0; j <= pos; ++j) spread += s[j] / sum * std::abs(v(j) - want);
          const double u = std::ldexp(1.0, -8);
          tolerance += u / (1 - u) * spread;
        }
        ASSERT_NEAR(out[(static_cast<size_t>(pos) * c.heads + h) * c.head_dim + e], want, tolerance)
            << "position " << pos << " head " << h << " element " << e;
      }
    }
  }
}

// Page sizes that divide the key tile (8 positions on avx2, 16 on avx512), straddle it (3, 5, 7)
// and exceed it, each with some of the ways a query can reach the kernels.
TEST_P(PagedAttentionTest, ResultsDoNotDependOnBatchOrPageSize) {
  const AttentionCase c = MakeCase(param());
  const std::vector<float> base = RunAttention(c, 16, Calls::kTogether);
  const std::pair<int, Calls> runs[] = {
      {1, Calls::kTogether},    {1, Calls::kOnePerCall}, {3, Calls::kTogether},
      {3, Calls::kOnePerCall},  {5, Calls::kChunksOf5},  {7, Calls::kInterleaved},
      {16, Calls::kOnePerCall}, {16, Calls::kChunksOf5}, {16, Calls::kInterleaved},
      {64, Calls::kTogether},   {64, Calls::kOnePerCall}};
  for (const auto& [page_tokens, calls] : runs) {
    const std::vector<float> out = RunAttention(c, page_tokens, calls);
    ASSERT_EQ(std::memcmp(out.data(), base.data(), sizeof(float) * out.size()), 0)
        << "page size " << page_tokens << ", " << CallsName(calls);
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, PagedAttentionTest,
                         ::testing::Combine(::testing::ValuesIn(KernelPathNames()),
                                            ::testing::ValuesIn(kAttentionShapes)),
                         [](const auto& info) {
                           const AttentionShape& s = std::get<1>(info.param);
                           return KernelPathTestName(std::get<0>(info.param)) + "_" +
                                  std::to_string(s.heads) + "heads" + std::to_string(s.kv_heads) +
                                  "kv" + std::to_string(s.head_dim) + "dim" +
                                  std::to_string(s.ctx) + "ctx" +
                                  (s.dtype == DType::kBF16 ? "_bf16" : "");
                         });

INSTANTIATE_TEST_SUITE_P(Paths, PathTest, ::testing::ValuesIn(KernelPathNames()),
                         [](const auto& info) { return KernelPathTestName(info.param); });

TEST_P(PathTest, RmsNormSiluMulAndRopeMatchFloat64) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  const int rows = 3, dim = 83;  // a partial 16-lane chunk
  std::vector<float> x(rows * dim), weight(dim), out(rows * dim);
  for (float& v : x) v = dist(rng);
  for (float& v : weight) v = dist(rng);
  kernels::RmsNorm(x.data(), weight.data(), out.data(), rows, dim, 1e-5f);
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int i = 0; i < dim; ++i) {
      const double want = x[r * dim + i] * inv * weight[i];
      ASSERT_NEAR(out[r * dim + i], want, 1e-5 * std::abs(want) + 1e-6) << r << "," << i;
    }
  }
  // SiluMul over gates from -100 to 100 (e^x saturates and underflows at the ends).
  const int n = 203;
  std::vector<float> gate(n), up(n), act(n);
  for (int i = 0; i < n; ++i) {
    gate[i] = -100.0f + 200.0f * i / (n - 1) + 0.37f;
    up[i] = dist(rng);
  }
  kernels::SiluMul(gate.data(), up.data(), act.data(), n);
  for (int i = 0; i < n; ++i) {
    const double g = gate[i];
    const double want = g / (1.0 + std::exp(-g)) * up[i];
    ASSERT_NEAR(act[i], want, 2e-6 * std::abs(want) + 1e-30) << "gate " << g;
  }
  // RoPE: rotating by (cos, sin) keeps each pair's length and matches the float64 rotation.
  const int heads = 2, head_dim = 10, half = head_dim / 2;
  std::vector<float> v(heads * head_dim), cos(half), sin(half);
  for (float& e : v) e = dist(rng);
  for (int i = 0; i < half; ++i) {
    cos[i] = static_cast<float>(std::cos(0.3 * (i + 1)));
    sin[i] = static_cast<float>(std::sin(0.3 * (i + 1)));
  }
  std::vector<float> rotated = v;
  kernels::ApplyRope(rotated.data(), heads, head_dim, cos.data(), sin.data());
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < half; ++i) {
      const double a = v[h * head_dim + i], b = v[h * head_dim + i + half];
      EXPECT_NEAR(rotated[h * head_dim + i], a * cos[i] - b * sin[i], 1e-5);
      EXPECT_NEAR(rotated[h * head_dim + i + half], b * cos[i] + a * sin[i], 1e-5);
    }
  }
}

// Everything a forward pass computes, on the active path, as raw floats; without the BF16
// products when `bf16_products` is false.
std::vector<float> RunEveryKernel(bool bf16_products = true) {
  std::mt19937 rng(21);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> all;
  auto append = [&](const std::vector<float>& v) { all.insert(all.end(), v.begin(), v.end()); };
  if (bf16_products) {  // BF16 product: tiles of 1..6 rows, partial groups and blocks, odd k.
    const int m = 11, n = 150, k = 301;
    std::vector<uint16_t> x(m * k), w(n * k);
    for (uint16_t& e : x) e = F32ToBF16(dist(rng));
    for (uint16_t& e : w) e = F32ToBF16(dist(rng));
    std::vector<uint16_t> packed(kernels::PackedBF16Elements(n, k));
    kernels::PackBF16(w.data(), n, k, packed.data());
    std::vector<float> y(m * n);
    for (int rows = 1; rows <= m; rows += 2) {
      kernels::MatMulBF16(x.data(), packed.data(), y.data(), rows, n, k);
      append(y);
    }
  }
  {  // F32 product and RmsNorm, k not a multiple of 16 or 8.
    const int m = 7, n = 9, k = 45;
    std::vector<float> x(m * k), w(n * k), y(m * n);
    for (float& e : x) e = dist(rng);
    for (float& e : w) e = dist(rng);
    kernels::MatMulF32(x.data(), w.data(), y.data(), m, n, k);
    append(y);
    std::vector<float> normed(m * k);
    kernels::RmsNorm(x.data(), w.data(), normed.data(), m, k, 1e-6f);
    append(normed);
    std::vector<float> act(m * k);
    for (float& e : x) e *= 30.0f;  // reach the clamps of e^x
    kernels::SiluMul(x.data(), w.data(), act.data(), m * k);
    append(act);
    std::vector<float> rope(w.begin(), w.begin() + 40);
    kernels::ApplyRope(rope.data(), 2, 20, x.data(), x.data() + 10);
    append(rope);
  }
  // Attention, both cache types: a group of 6 heads over pages of 8, and one of 10 heads (more
  // than a register group) of 20 elements (row tails) over pages of 5 (key tiles straddle them).
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const auto& [shape, page_tokens] : {std::pair{AttentionShape{6, 2, 72, 45, dtype}, 8},
                                             std::pair{AttentionShape{10, 1, 20, 37, dtype}, 5}}) {
      const std::vector<float> out = RunAttention(MakeCase(shape), page_tokens, Calls::kTogether);
      append(out);
    }
  }
  return all;
}

// The SIMD paths compute in the generic path's order (kernel_table.h), so on normal numbers
// they agree with it bit for bit. The AMX paths' BF16 products accumulate in the tiles' order
// instead (amx_test.cc checks them); their other kernels are a vector path's.
TEST_P(PathTest, AgreesWithTheGenericPathBitForBit) {
  if (GetParam() == "generic") GTEST_SKIP() << "generic is the reference of this test";
  const bool amx = GetParam().rfind("amx", 0) == 0;
  const std::vector<float> got = RunEveryKernel(!amx);
  ASSERT_TRUE(kernels::SelectPath("generic").ok());
  const std::vector<float> want = RunEveryKernel(!amx);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
        << "value " << i << ": " << GetParam() << " " << got[i] << ", generic " << want[i];
  }
}

// StoreKv writes kv/layout.h's page format, which the messenger moves between nodes: K and V a
// row per slot, [kv_heads][page_tokens][head_dim] in each page of each layer. Read back by
// byte offsets alone; every other byte of the cache stays zero.
TEST(StoreKvTest, WritesOneRowPerHeadAtTheLayoutsOffsetsAndNothingElse) {
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    const KvLayout l{.num_layers = 2,
                     .num_kv_heads = 2,
                     .head_dim = 6,
                     .page_tokens = 4,
                     .dtype = dtype,
                     .num_pages = 3};
    auto cache = KvCache::Create(l);
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    constexpr int kLayer = 1, kPage = 2, kSlot = 3;
    std::vector<float> k(2 * 6), v(2 * 6);
    for (int i = 0; i < 12; ++i) {
      k[i] = static_cast<float>(i + 1);  // exact in BF16
      v[i] = -static_cast<float>(i + 1);
    }
    kernels::StoreKv(**cache, kLayer, kPage, kSlot, k.data(), v.data());
    const uint8_t* base = (*cache)->base();
    std::vector<bool> expected(l.total_bytes(), false);
    auto element = [&](size_t offset) {
      for (size_t b = 0; b < l.elem_size(); ++b) expected[offset + b] = true;
      if (dtype == DType::kBF16) {
        uint16_t bits;
        std::memcpy(&bits, base + offset, 2);
        return BF16ToF32(bits);
      }
      float f;
      std::memcpy(&f, base + offset, 4);
      return f;
    };
    for (bool is_v : {false, true}) {
      const std::vector<float>& want = is_v ? v : k;
      for (int h = 0; h < 2; ++h) {
        const size_t row = l.ElementOffset(kLayer, kPage, is_v, h, kSlot);
        for (int d = 0; d < 6; ++d) {
          EXPECT_EQ(element(row + d * l.elem_size()), want[h * 6 + d])
              << DTypeFlagName(dtype) << (is_v ? " V" : " K") << " head " << h << " " << d;
        }
      }
    }
    for (size_t i = 0; i < l.total_bytes(); ++i) {
      if (!expected[i]) {
        ASSERT_EQ(base[i], 0) << DTypeFlagName(dtype) << " byte " << i;
      }
    }
  }
}

TEST(KernelDispatchTest, GenericIsAlwaysSupportedAndAutoPicksTheBest) {
  const std::vector<std::string_view> supported = kernels::SupportedPaths();
  ASSERT_FALSE(supported.empty());
  EXPECT_EQ(supported.back(), "generic");
  ASSERT_TRUE(kernels::SelectPath("auto").ok());
  EXPECT_EQ(kernels::ActivePath(), supported.front());
  ASSERT_TRUE(kernels::SelectPath("generic").ok());
  EXPECT_EQ(kernels::ActivePath(), "generic");
  EXPECT_NE(kernels::DescribeSelection().find("generic"), std::string::npos);
  ASSERT_TRUE(kernels::SelectPath("").ok());
  EXPECT_EQ(kernels::ActivePath(), supported.front());
}

// Peers compare the path with the arithmetic's revision: a node built before attention over
// BF16 caches took BF16 products (revision 2) says "avx512", one before the INT8 products took
// integer dot products "avx512 r2", this one "avx512 r3".
TEST(KernelDispatchTest, ArithmeticIdentityNamesThePathAndTheRevision) {
  ASSERT_TRUE(kernels::SelectPath("generic").ok());
  EXPECT_EQ(kernels::ArithmeticIdentity(), "generic r3");
  ASSERT_TRUE(kernels::SelectPath("auto").ok());
  EXPECT_EQ(kernels::ArithmeticIdentity(), std::string(kernels::ActivePath()) + " r" +
                                               std::to_string(kernels::kArithmeticRevision));
}

TEST(KernelDispatchTest, UnknownPathIsAnErrorAndKeepsTheSelection) {
  ASSERT_TRUE(kernels::SelectPath("generic").ok());
  const Status s = kernels::SelectPath("sse9");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sse9"), std::string::npos) << s.ToString();
  EXPECT_EQ(kernels::ActivePath(), "generic");
  (void)kernels::SelectPath("auto");
}

TEST(KernelDispatchTest, PathTheCpuLacksIsAnErrorNamingWhatIsMissing) {
  const std::vector<std::string_view> supported = kernels::SupportedPaths();
  for (std::string_view path : kernels::KnownPaths()) {
    if (std::find(supported.begin(), supported.end(), path) != supported.end()) continue;
    const Status s = kernels::SelectPath(path);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << path;
    EXPECT_NE(s.message().find(std::string(path)), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("lacks"), std::string::npos) << s.ToString();
    return;
  }
  GTEST_SKIP() << "this CPU runs every kernel path; nothing to refuse";
}

TEST(KernelDispatchTest, EnvironmentVariableSelectsOrFailsClearly) {
  ASSERT_EQ(setenv("PDSERVE_KERNELS", "generic", 1), 0);
  EXPECT_TRUE(kernels::SelectPathFromEnvironment().ok());
  EXPECT_EQ(kernels::ActivePath(), "generic");
  EXPECT_NE(kernels::DescribeSelection().find("PDSERVE_KERNELS=generic"), std::string::npos);
  ASSERT_EQ(setenv("PDSERVE_KERNELS", "bogus", 1), 0);
  const Status s = kernels::SelectPathFromEnvironment();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("PDSERVE_KERNELS"), std::string::npos) << s.ToString();
  ASSERT_EQ(unsetenv("PDSERVE_KERNELS"), 0);
  EXPECT_TRUE(kernels::SelectPathFromEnvironment().ok());
  EXPECT_EQ(kernels::ActivePath(), kernels::SupportedPaths().front());
}

}  // namespace
}  // namespace pdserve
