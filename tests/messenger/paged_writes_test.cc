// GroupPagedWrites: the paged writes the prefill side's streamer posts for one layer of a run
// of pages, for every pair of tensor-parallel sizes — each column names the right source rank
// (region) and destination rank (descriptor), expands back to exactly the planned writes, and
// their total is the count the decode side expects.
#include "messenger/paged_writes.h"

#include <ostream>
#include <set>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace pdserve::messenger {
namespace {

KvSideLayout Side(int kv_heads, int tp, int num_pages) {
  KvSideLayout side;
  auto shards = KvShardLayout::ForTensorParallel(kv_heads, tp);
  EXPECT_TRUE(shards.ok()) << shards.status().ToString();
  side.shards = *shards;
  for (int r = 0; r < tp; ++r) {
    side.ranks.push_back(KvLayout{.num_layers = 3,
                                  .num_kv_heads = shards->heads(r).size(),
                                  .head_dim = 8,
                                  .page_tokens = 4,
                                  .dtype = DType::kF32,
                                  .num_pages = num_pages});
  }
  return side;
}

TransferPlan Plan(int kv_heads, int p_tp, int d_tp) {
  auto plan = TransferPlan::Create(Side(kv_heads, p_tp, 12), Side(kv_heads, d_tp, 10));
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return std::move(plan).value();
}

// Source and destination page ids out of order, neither starting at 0.
const std::vector<PagePair> kPages = {{5, 9}, {1, 2}, {11, 4}, {3, 0}};

// The writes the columns stand for, in AppendLayerWrites' order (page after page).
std::vector<KvWrite> Expand(const std::vector<PagedColumn>& columns,
                            std::span<const PagePair> pages) {
  std::vector<KvWrite> out;
  for (const PagePair& p : pages) {
    for (const PagedColumn& c : columns) {
      out.push_back(KvWrite{.src_rank = c.src_rank,
                            .src_offset = c.src_base + c.src_stride * uint64_t(p.src),
                            .dst_rank = c.dst_rank,
                            .dst_offset = c.dst_base + c.dst_stride * uint64_t(p.dst),
                            .length = c.length});
    }
  }
  return out;
}

struct TpCase {
  int kv_heads, p_tp, d_tp;
};
void PrintTo(const TpCase& c, std::ostream* os) {
  *os << c.kv_heads << " heads, P tp " << c.p_tp << ", D tp " << c.d_tp;
}

class MessengerPagedWritesTest : public ::testing::TestWithParam<TpCase> {};

TEST_P(MessengerPagedWritesTest, ColumnsAreThePlannedWritesAndTheExpectedCount) {
  const TpCase c = GetParam();
  const TransferPlan plan = Plan(c.kv_heads, c.p_tp, c.d_tp);
  for (uint64_t seed : {0ull, 1ull, 77ull}) {
    uint64_t columns_times_pages = 0;
    std::set<int> src_ranks_used, dst_ranks_used;
    for (int layer = 0; layer < plan.num_layers(); ++layer) {
      auto writes = plan.LayerWrites(kPages, layer, seed);
      ASSERT_TRUE(writes.ok()) << writes.status().ToString();
      auto columns = GroupPagedWrites(plan, kPages, *writes);
      ASSERT_TRUE(columns.ok()) << columns.status().ToString();
      EXPECT_EQ(Expand(*columns, kPages), *writes);
      columns_times_pages += columns->size() * kPages.size();
      for (const PagedColumn& col : *columns) {
        ASSERT_GE(col.src_rank, 0);
        ASSERT_LT(col.src_rank, c.p_tp);
        ASSERT_GE(col.dst_rank, 0);
        ASSERT_LT(col.dst_rank, c.d_tp);
        // Strides are the block of the rank each side names: its region's layout.
        EXPECT_EQ(col.src_stride, plan.source().ranks[col.src_rank].block_bytes());
        EXPECT_EQ(col.dst_stride, plan.destination().ranks[col.dst_rank].block_bytes());
        src_ranks_used.insert(col.src_rank);
        dst_ranks_used.insert(col.dst_rank);
      }
    }
    // D counts one immediate per page of every column: exactly what it expects.
    EXPECT_EQ(columns_times_pages, plan.ExpectedWrites(kPages.size(), seed));
    // Every destination rank receives; every source group sends.
    EXPECT_EQ(static_cast<int>(dst_ranks_used.size()), c.d_tp);
    EXPECT_GE(static_cast<int>(src_ranks_used.size()), plan.source().shards.num_groups());
  }
}

INSTANTIATE_TEST_SUITE_P(TpPairs, MessengerPagedWritesTest,
                         ::testing::Values(TpCase{4, 1, 1}, TpCase{4, 2, 1}, TpCase{4, 1, 2},
                                           TpCase{4, 2, 4}, TpCase{4, 4, 2}, TpCase{6, 2, 3},
                                           TpCase{2, 4, 1}, TpCase{2, 1, 4}),
                         [](const ::testing::TestParamInfo<TpCase>& info) {
                           return "Heads" + std::to_string(info.param.kv_heads) + "P" +
                                  std::to_string(info.param.p_tp) + "D" +
                                  std::to_string(info.param.d_tp);
                         });

TEST(MessengerPagedWritesTest, TwoPrefillRanksIntoOneDecodeRank) {
  // D (TP 1) rebuilds each page from both P ranks: K and V of each P rank's two heads land in
  // the first or second half of D's K and V — four columns where TP 1 <-> TP 1 has one.
  const TransferPlan plan = Plan(4, 2, 1);
  auto writes = plan.LayerWrites(kPages, 1, 0);
  ASSERT_TRUE(writes.ok());
  auto columns = GroupPagedWrites(plan, kPages, *writes);
  ASSERT_TRUE(columns.ok()) << columns.status().ToString();
  ASSERT_EQ(columns->size(), 4u);
  const KvLayout& d = plan.destination().ranks[0];
  for (const PagedColumn& col : *columns) {
    EXPECT_EQ(col.dst_rank, 0);
    EXPECT_EQ(col.length, d.head_bytes() * 2);  // each P rank holds two of the four heads
  }
  std::multiset<int> src;
  for (const PagedColumn& col : *columns) src.insert(col.src_rank);
  EXPECT_EQ(src, (std::multiset<int>{0, 0, 1, 1}));
  const TransferPlan same = Plan(4, 1, 1);
  auto same_writes = same.LayerWrites(kPages, 1, 0);
  ASSERT_TRUE(same_writes.ok());
  auto one = GroupPagedWrites(same, kPages, *same_writes);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 1u);  // TP 1 <-> TP 1: whole blocks, K and V together
}

TEST(MessengerPagedWritesTest, OneWriteOfEachPageIsOneColumnPerRouteFromOneToTwoRanks) {
  // D (TP 2): each D rank's whole block comes from P's single rank in one write per page.
  const TransferPlan plan = Plan(4, 1, 2);
  auto writes = plan.LayerWrites(kPages, 2, 0);
  ASSERT_TRUE(writes.ok());
  auto columns = GroupPagedWrites(plan, kPages, *writes);
  ASSERT_TRUE(columns.ok()) << columns.status().ToString();
  std::multiset<std::pair<int, int>> routes;
  for (const PagedColumn& col : *columns) routes.insert({col.src_rank, col.dst_rank});
  // P's rank holds all four heads, each D rank two: K and V are not adjacent on P, so two
  // columns (K, V) per D rank.
  EXPECT_EQ(routes, (std::multiset<std::pair<int, int>>{{0, 0}, {0, 0}, {0, 1}, {0, 1}}));
}

TEST(MessengerPagedWritesTest, RefusesWritesThatAreNotAPlansColumns) {
  const TransferPlan plan = Plan(4, 2, 1);
  auto good = plan.LayerWrites(kPages, 0, 0);
  ASSERT_TRUE(good.ok());
  std::vector<KvWrite> w = *good;
  w.pop_back();  // uneven per page
  EXPECT_EQ(GroupPagedWrites(plan, kPages, w).status().code(), StatusCode::kInternal);
  EXPECT_EQ(GroupPagedWrites(plan, {}, {}).status().code(), StatusCode::kInternal);
  w = *good;
  w.back().dst_offset += 4;  // not page-strided
  EXPECT_EQ(GroupPagedWrites(plan, kPages, w).status().code(), StatusCode::kInternal);
  w = *good;
  w.back().length += 4;
  EXPECT_EQ(GroupPagedWrites(plan, kPages, w).status().code(), StatusCode::kInternal);
  w = *good;
  for (KvWrite& x : w) x.dst_rank = 1;  // D has one rank
  EXPECT_EQ(GroupPagedWrites(plan, kPages, w).status().code(), StatusCode::kInternal);
  w = *good;
  for (KvWrite& x : w) x.src_rank = 2;  // P has two
  EXPECT_EQ(GroupPagedWrites(plan, kPages, w).status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace pdserve::messenger
