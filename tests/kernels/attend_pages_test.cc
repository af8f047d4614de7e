// KernelTable::attend_pages (kernels/kernel_table.h) of every kernel path compiled in against
// the generic path's, called for one query at a time. The contract is "the generic path's
// values, bit for bit, however the queries are grouped into runs", so the test compares raw
// bits, for runs of queries of different lengths, page sizes that straddle a key tile or hold
// several, head sizes with row tails and GQA groups larger than the registers hold, an odd head
// size. On the generic path itself it checks that a run gives each query's own values. It calls
// the tables directly (this is the kernels' own test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/dtype.h"
#include "kernels/dispatch.h"
#include "kernels/kernel_table.h"
#include "testing/kernel_paths.h"

namespace pdserve {
namespace {

using ::pdserve::testing::KernelPathNames;
using ::pdserve::testing::KernelPathTestName;
using ::pdserve::testing::UseKernelPath;
namespace internal = ::pdserve::kernels::internal;

struct PagesShape {
  int heads;  // query heads sharing the KV head
  int head_dim;
  int page_tokens;
  bool bf16;
  std::vector<int64_t> contexts;  // one run: a query per entry
};

std::string PagesShapeName(const PagesShape& s) {
  return std::to_string(s.heads) + "heads" + std::to_string(s.head_dim) + "dim" +
         std::to_string(s.page_tokens) + "page" + std::to_string(s.contexts.size()) + "queries" +
         (s.bf16 ? "_bf16" : "_f32");
}

// qwen2.5-0.5b's group (7 heads of 64) at decode (one query of 2048 positions: many value
// blocks) and as a prefill chunk; 7 heads of 128 (two chunk passes); 8 heads of 40 (a full
// group, a partial chunk); 10 heads of 20 and 3 of 12 (more heads than a group, short rows);
// 2 of 13 (an odd head size: a BF16 row ends in half a 32-bit word);
// page sizes of 1, 5, 7 (tiles straddle pages), 16, 64 (pages hold several tiles); contexts
// shorter than a tile, not multiples of 16, and out of order within the run.
const PagesShape kPagesShapes[] = {
    {7, 64, 16, true, {2048}},         {7, 64, 16, true, {150, 151, 152, 153, 154}},
    {7, 64, 5, true, {97, 1, 33, 16}}, {7, 64, 16, false, {300, 17}},
    {7, 128, 64, true, {70, 200, 3}},  {8, 40, 7, true, {45, 130}},
    {10, 20, 1, true, {37, 36, 9}},    {3, 12, 16, false, {33, 48, 64, 65}},
    {14, 64, 16, true, {129}},         {2, 13, 3, true, {50, 20}},
};

class AttendPagesTest : public ::testing::TestWithParam<std::tuple<std::string, PagesShape>> {
 protected:
  void SetUp() override { UseKernelPath(std::get<0>(GetParam())); }
  void TearDown() override { (void)kernels::SelectPath("auto"); }
};

// One KV head's K or V rows in pages of `page_tokens`, stored in pages scattered over one
// allocation (page i at slot pages - 1 - i), BF16 or F32.
struct Pages {
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
  std::vector<const void*> table;
};

Pages MakePages(const std::vector<float>& rows, int64_t ctx, int hd, int page_tokens, bool bf16) {
  const int64_t pages = (ctx + page_tokens - 1) / page_tokens;
  const size_t page_elems = static_cast<size_t>(page_tokens) * hd;
  Pages out;
  // NaN filler past the context: a kernel that read it would show.
  if (bf16) {
    out.bf16.assign(pages * page_elems, 0x7fc1);
  } else {
    out.f32.assign(pages * page_elems, NAN);
  }
  for (int64_t p = 0; p < ctx; ++p) {
    const size_t at = (pages - 1 - p / page_tokens) * page_elems + (p % page_tokens) * hd;
    for (int d = 0; d < hd; ++d) {
      const float value = rows[p * hd + d];
      if (bf16) {
        out.bf16[at + d] = F32ToBF16(value);
      } else {
        out.f32[at + d] = value;
      }
    }
  }
  for (int64_t i = 0; i < pages; ++i) {
    const size_t at = (pages - 1 - i) * page_elems;
    out.table.push_back(bf16 ? static_cast<const void*>(&out.bf16[at]) : &out.f32[at]);
  }
  return out;
}

TEST_P(AttendPagesTest, EqualsTheGenericPathOneQueryAtATimeBitForBit) {
  const internal::KernelTable& path = internal::Active();
  const PagesShape& s = std::get<1>(GetParam());
  const int hd = s.head_dim;
  int64_t ctx = 0;
  for (int64_t c : s.contexts) ctx = std::max(ctx, c);
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(ctx) * hd), v(k.size());
  for (float& e : k) e = dist(rng);
  for (float& e : v) e = dist(rng);
  const Pages k_pages = MakePages(k, ctx, hd, s.page_tokens, s.bf16);
  const Pages v_pages = MakePages(v, ctx, hd, s.page_tokens, s.bf16);
  const int count = static_cast<int>(s.contexts.size());
  const size_t q_floats = static_cast<size_t>(s.heads) * hd;
  std::vector<float> q(count * q_floats);
  for (float& e : q) e = 2.0f * dist(rng);  // sharper softmax than N(0, 1)
  const float scale = 0.125f;

  // Straight from the pages, the whole run in one call.
  // Over a BF16 cache the query goes in rounded to BF16, as PagedAttention passes it.
  const size_t pair_values = static_cast<size_t>(s.heads) * 2 * internal::QueryPairs(hd);
  std::vector<float> q_rounded(q.size());
  std::vector<uint16_t> q_pairs(count * pair_values);
  std::vector<float> got(count * q_floats, -1.0f);
  std::vector<internal::PageQuery> run;
  for (int r = 0; r < count; ++r) {
    const float* query = &q[r * q_floats];
    const uint16_t* pairs = nullptr;
    if (s.bf16) {
      internal::RoundQueryHeads(query, s.heads, hd, &q_rounded[r * q_floats],
                                &q_pairs[r * pair_values]);
      query = &q_rounded[r * q_floats];
      pairs = &q_pairs[r * pair_values];
    }
    run.push_back({.q = query, .q_bf16 = pairs, .out = &got[r * q_floats], .ctx = s.contexts[r]});
  }
  const int64_t stride = (ctx + 15) / 16 * 16;
  std::vector<float> scores(count * s.heads * stride);
  const internal::HeadPages kv{.k = k_pages.table.data(),
                               .v = v_pages.table.data(),
                               .page_tokens = s.page_tokens,
                               .bf16 = s.bf16};
  path.attend_pages(run.data(), count, kv, hd, scale, s.heads, scores.data());

  // The generic path, each query on its own (no key tile shared with another query).
  std::vector<float> want(count * q_floats, -2.0f);
  for (int r = 0; r < count; ++r) {
    internal::PageQuery one = run[r];
    one.out = &want[r * q_floats];
    internal::kGenericKernels.attend_pages(&one, 1, kv, hd, scale, s.heads, scores.data());
  }
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
        << "query " << i / q_floats << " head " << i % q_floats / hd << " element " << i % hd
        << ": " << path.name << " " << got[i] << ", generic " << want[i];
  }
}

class SoftmaxWeightTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { UseKernelPath(GetParam()); }
  void TearDown() override { (void)kernels::SelectPath("auto"); }
};

// Over a BF16 cache a softmax numerator below 2^-126 weighs nothing, even one that rounding to
// BF16 would carry up to 2^-126 (kernel_table.h; vcvtneps2bf16 reads a denormal as zero), and
// one just above 2^-126 weighs its BF16 value. One head of two elements, three positions: the
// scores 0 (the maximum), s1 = -87.5 + 0.1611 (e^s1 = 0.9977 x 2^-126, a denormal within
// 2^-8 of 2^-126) and s2 = -87.5 + 0.25 (e^s2 = 1.0904 x 2^-126, 1.09375 x 2^-126 in BF16).
// A V row of 2^100 at position 1 alone must leave the output 0; at position 2 alone it must
// give exactly 1.09375 x 2^-26 (the products are exact, the sum of the numerators is 1).
TEST_P(SoftmaxWeightTest, DenormalNumeratorsWeighNothingOverABF16Cache) {
  const internal::KernelTable& path = internal::Active();
  constexpr int kHd = 2;
  constexpr int64_t kCtx = 3;
  const float b1 = BF16ToF32(F32ToBF16(0.1615f));
  ASSERT_EQ(b1, 0.161132812f);
  const std::vector<float> k = {0.0f, 0.0f, -87.5f, b1, -87.5f, 0.25f};
  const Pages k_pages = MakePages(k, kCtx, kHd, 16, true);
  const float q[kHd] = {1.0f, 1.0f};
  float q_rounded[kHd];
  uint16_t q_pairs[kHd];
  internal::RoundQueryHeads(q, 1, kHd, q_rounded, q_pairs);
  const float big = std::ldexp(1.0f, 100);
  for (int64_t at : {1, 2}) {
    std::vector<float> v(kCtx * kHd, 0.0f);
    v[at * kHd] = v[at * kHd + 1] = big;
    const Pages v_pages = MakePages(v, kCtx, kHd, 16, true);
    const internal::HeadPages kv{
        .k = k_pages.table.data(), .v = v_pages.table.data(), .page_tokens = 16, .bf16 = true};
    float out[kHd] = {-1.0f, -1.0f};
    std::vector<float> scores(16);
    const internal::PageQuery query{.q = q_rounded, .q_bf16 = q_pairs, .out = out, .ctx = kCtx};
    path.attend_pages(&query, 1, kv, kHd, 1.0f, 1, scores.data());
    const float want = at == 1 ? 0.0f : std::ldexp(1.09375f, -26);
    for (int d = 0; d < kHd; ++d) {
      EXPECT_EQ(out[d], want) << path.name << ": V of 2^100 at position " << at << ", element "
                              << d;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, SoftmaxWeightTest, ::testing::ValuesIn(KernelPathNames()),
                         [](const auto& info) { return KernelPathTestName(info.param); });

INSTANTIATE_TEST_SUITE_P(Paths, AttendPagesTest,
                         ::testing::Combine(::testing::ValuesIn(KernelPathNames()),
                                            ::testing::ValuesIn(kPagesShapes)),
                         [](const auto& info) {
                           return KernelPathTestName(std::get<0>(info.param)) + "_" +
                                  PagesShapeName(std::get<1>(info.param)) + "_" +
                                  std::to_string(info.index);
                         });

}  // namespace
}  // namespace pdserve
