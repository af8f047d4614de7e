#include "kv/page_pool.h"

#include <algorithm>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "kv/block_table.h"
#include "kv/kv_cache.h"
#include "kv/layout.h"

namespace pdserve {
namespace {

TEST(PagePoolTest, AllocatesDistinctPagesAndCountsOccupancy) {
  PagePool pool(8);
  auto a = pool.Allocate(3);
  ASSERT_TRUE(a.ok());
  auto b = pool.Allocate(5);
  ASSERT_TRUE(b.ok());
  std::set<PageId> all(a->begin(), a->end());
  all.insert(b->begin(), b->end());
  EXPECT_EQ(all.size(), 8u);
  EXPECT_EQ(pool.used(), 8);
  EXPECT_EQ(pool.free_pages(), 0);
  EXPECT_DOUBLE_EQ(pool.usage(), 1.0);
  pool.Free(*a);
  pool.Free(*b);
  EXPECT_EQ(pool.used(), 0);
}

TEST(PagePoolTest, ExhaustionIsAllOrNothing) {
  PagePool pool(4);
  auto a = pool.Allocate(3);
  ASSERT_TRUE(a.ok());
  auto b = pool.Allocate(2);
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.used(), 3);
  EXPECT_TRUE(pool.Allocate(1).ok());
  EXPECT_EQ(pool.Allocate(-1).status().code(), StatusCode::kInvalidArgument);
}

TEST(PagePoolDeathTest, DoubleFreeAborts) {
  PagePool pool(2);
  auto a = pool.Allocate(1);
  ASSERT_TRUE(a.ok());
  pool.Free(*a);
  EXPECT_DEATH(pool.Free(*a), "freed twice");
}

TEST(BlockTableTest, GrowsByPagesAndMapsTokensToSlots) {
  PagePool pool(10);
  BlockTable table(16);
  ASSERT_TRUE(table.EnsureCapacity(pool, 1).ok());
  EXPECT_EQ(table.pages().size(), 1u);
  ASSERT_TRUE(table.EnsureCapacity(pool, 16).ok());
  EXPECT_EQ(table.pages().size(), 1u);
  ASSERT_TRUE(table.EnsureCapacity(pool, 33).ok());
  EXPECT_EQ(table.pages().size(), 3u);
  EXPECT_EQ(table.PageOf(32), table.pages()[2]);
  EXPECT_EQ(table.SlotOf(33), 1);
  EXPECT_EQ(pool.used(), 3);
  // Asking for more than the pool holds changes nothing.
  EXPECT_FALSE(table.EnsureCapacity(pool, 16 * 20).ok());
  EXPECT_EQ(table.pages().size(), 3u);
  table.Release(pool);
  EXPECT_EQ(pool.used(), 0);
  EXPECT_TRUE(table.pages().empty());
}

TEST(BlockTableTest, TruncateReturnsOnlyPagesWhollyPastTheTokens) {
  PagePool pool(10);
  BlockTable table(16);
  ASSERT_TRUE(table.EnsureCapacity(pool, 64).ok());
  const std::vector<PageId> before(table.pages().begin(), table.pages().end());
  table.Truncate(pool, 64);  // all four hold tokens
  EXPECT_EQ(pool.used(), 4);
  table.Truncate(pool, 17);  // token 16 is in the second page
  EXPECT_EQ(std::vector<PageId>(table.pages().begin(), table.pages().end()),
            std::vector<PageId>(before.begin(), before.begin() + 2));
  EXPECT_EQ(pool.used(), 2);
  table.Truncate(pool, 0);
  EXPECT_TRUE(table.pages().empty());
  EXPECT_EQ(pool.used(), 0);
}

TEST(KvLayoutTest, HndOffsetsKeepHeadsContiguous) {
  KvLayout l{.num_layers = 3,
             .num_kv_heads = 4,
             .head_dim = 8,
             .page_tokens = 16,
             .dtype = DType::kBF16,
             .num_pages = 5};
  EXPECT_EQ(l.head_bytes(), 16u * 8 * 2);
  EXPECT_EQ(l.block_bytes(), 2 * 4 * l.head_bytes());
  EXPECT_EQ(l.total_bytes(), 3 * 5 * l.block_bytes());
  // Head h+1 follows head h; V follows all K heads; the next page follows the block.
  EXPECT_EQ(l.ElementOffset(1, 2, false, 1, 0) - l.ElementOffset(1, 2, false, 0, 0),
            l.head_bytes());
  EXPECT_EQ(l.ElementOffset(1, 2, true, 0, 0) - l.ElementOffset(1, 2, false, 0, 0),
            l.component_bytes());
  EXPECT_EQ(l.BlockOffset(1, 3) - l.BlockOffset(1, 2), l.block_bytes());
  EXPECT_EQ(l.BlockOffset(2, 0) - l.BlockOffset(1, 0), l.layer_bytes());
  EXPECT_EQ(l.ElementOffset(0, 0, false, 0, 3), 3u * 8 * 2);
  EXPECT_EQ(l.PagesForTokens(33), 3);
}

TEST(KvCacheTest, StorageIsZeroedAndSharedThroughTheFd) {
  KvLayout l{.num_layers = 2,
             .num_kv_heads = 2,
             .head_dim = 4,
             .page_tokens = 4,
             .dtype = DType::kF32,
             .num_pages = 3};
  auto cache = KvCache::Create(l);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  auto& c = **cache;
  EXPECT_EQ(c.size_bytes(), l.total_bytes());
  EXPECT_TRUE(std::all_of(c.base(), c.base() + c.size_bytes(), [](uint8_t b) { return b == 0; }));
  c.Block(1, 2, true)[0] = 7;
  EXPECT_EQ(c.base()[l.BlockOffset(1, 2) + l.component_bytes()], 7);
  EXPECT_GE(c.fd(), 0);
}

TEST(KvCacheTest, RefusesAnElementTypeTheKernelsCannotRead) {
  KvLayout l{.num_layers = 1,
             .num_kv_heads = 1,
             .head_dim = 4,
             .page_tokens = 4,
             .dtype = DType::kF16,
             .num_pages = 2};
  auto cache = KvCache::Create(l);
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(cache.status().ToString().find("f16"), std::string::npos) << cache.status().ToString();
}

}  // namespace
}  // namespace pdserve
