// The prefix cache's bookkeeping (kv/page_pool.h, kv/page_hash.h, kv/block_table.h): chained
// hashes and what seeds them, reference counts, the LRU of evictable pages and eviction, the
// collision check on a hit, and sealed pages that truncation never drops.
#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <vector>

#include "kv/block_table.h"
#include "kv/page_hash.h"
#include "kv/page_pool.h"

namespace pdserve {
namespace {

std::vector<int32_t> Iota(int n, int32_t from = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(PrefixHasherTest, ChainsNameTheWholePrefixAndTheSalt) {
  const PrefixHasher h("model=a", 4);
  const std::vector<int32_t> tokens = Iota(12);
  std::vector<PageHash> hashes;
  h.Extend(tokens, 2, &hashes);
  ASSERT_EQ(hashes.size(), 2u);
  h.Extend(tokens, 10, &hashes);  // only full pages
  ASSERT_EQ(hashes.size(), 3u);
  EXPECT_EQ(hashes[0], h.Chain(h.seed(), std::span(tokens).first(4)));
  EXPECT_EQ(hashes[2], h.Chain(hashes[1], std::span(tokens).subspan(8, 4)));
  // The same page after another prefix, another salt or page size: other hashes.
  std::vector<int32_t> other = tokens;
  other[0] = 99;
  std::vector<PageHash> other_hashes;
  h.Extend(other, 3, &other_hashes);
  EXPECT_NE(other_hashes[1], hashes[1]);
  EXPECT_NE(other_hashes[2], hashes[2]);
  EXPECT_NE(PrefixHasher("model=b", 4).seed(), h.seed());
  EXPECT_NE(PrefixHasher("model=a", 8).seed(), h.seed());
  // Deterministic: another hasher with the same seed agrees.
  std::vector<PageHash> again;
  PrefixHasher("model=a", 4).Extend(tokens, 3, &again);
  EXPECT_EQ(again, hashes);
  // Token order matters.
  std::vector<int32_t> swapped = {1, 0, 2, 3};
  EXPECT_NE(h.Chain(h.seed(), swapped), hashes[0]);
}

// With a lookahead (the MTP KV layer: a page's last slot depends on the next token) a page's
// hash covers the first token after it: prefixes that part right after a page share none of
// their hashes from that page on, a page has a hash only once that token is known, and the
// lookahead is in the seed. Without one, hashes are bit for bit what they were before the
// lookahead existed (the value below is SHA-256 worked out apart from this code).
TEST(PrefixHasherTest, ALookaheadCoversTheNextPagesFirstTokenAndLeavesPlainHashesAlone) {
  const PrefixHasher plain("model=a", 4);
  EXPECT_EQ(plain.seed(), (PageHash{0xb72d22c0b82bc8bdULL, 0xaa6a0fe80e580aacULL}));
  EXPECT_EQ(plain.Chain(plain.seed(), Iota(4)),
            (PageHash{0xcd49c4531475b77aULL, 0x8c8707b36f9913f5ULL}));
  EXPECT_EQ(plain.identity_tokens(), 4);
  EXPECT_EQ(PrefixHasher("model=a", 4, 0).seed(), plain.seed());

  const PrefixHasher ahead("model=a", 4, 1);
  EXPECT_NE(ahead.seed(), plain.seed());
  EXPECT_EQ(ahead.identity_tokens(), 5);
  EXPECT_EQ(ahead.HashablePages(8), 1u);  // page 1's lookahead, token 8, is not known yet
  EXPECT_EQ(ahead.HashablePages(9), 2u);
  EXPECT_EQ(ahead.HashablePages(0), 0u);
  std::vector<int32_t> a = Iota(13), b = Iota(13);
  b[8] = 99;  // the first token after page 1
  std::vector<PageHash> ha, hb, pa, pb;
  ahead.Extend(a, 10, &ha);
  ahead.Extend(b, 10, &hb);
  ASSERT_EQ(ha.size(), 3u);
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);
  EXPECT_NE(ha[2], hb[2]);
  EXPECT_EQ(ha[1], ahead.Chain(ha[0], std::span(a).subspan(4, 5)));
  // Without the lookahead page 1 is the same page in both.
  plain.Extend(a, 10, &pa);
  plain.Extend(b, 10, &pb);
  EXPECT_EQ(pa[1], pb[1]);
  EXPECT_NE(pa[2], pb[2]);
}

// A hit compares the lookahead token too: a page found under the right hash and parent, with
// the right tokens of its own but registered with another token after it (what a collision
// looks like), is a miss.
TEST(PagePoolPrefixTest, AHitChecksTheLookaheadToken) {
  const PrefixHasher h("s", 4, 1);
  PagePool pool(4);
  const std::vector<int32_t> tokens = Iota(9);
  std::vector<PageHash> hashes;
  h.Extend(tokens, 2, &hashes);
  ASSERT_EQ(hashes.size(), 2u);
  auto pages = pool.Allocate(2);
  ASSERT_TRUE(pages.ok());
  ASSERT_TRUE(pool.Register((*pages)[0], hashes[0], h.seed(), h.IdentityOf(tokens, 0)));
  const std::vector<int32_t> forged = {4, 5, 6, 7, 99};
  ASSERT_TRUE(pool.Register((*pages)[1], hashes[1], hashes[0], forged));
  pool.Free(*pages);
  EXPECT_EQ(pool.CachedPrefixPages(hashes, h, tokens), 1);
  const std::vector<PageId> hit = pool.AcquireCached(hashes, h, tokens);
  EXPECT_EQ(hit.size(), 1u);
  pool.Free(hit);
  EXPECT_EQ(pool.used(), 0);
}

// A sequence of `pages` full pages of `tokens` registered in `pool`, then released.
std::vector<PageId> CacheSequence(PagePool& pool, const PrefixHasher& h,
                                  const std::vector<int32_t>& tokens, int pages) {
  std::vector<PageHash> hashes;
  h.Extend(tokens, pages, &hashes);
  auto got = pool.Allocate(pages);
  EXPECT_TRUE(got.ok());
  for (int i = 0; i < pages; ++i) {
    EXPECT_TRUE(pool.Register((*got)[i], hashes[i], i == 0 ? h.seed() : hashes[i - 1],
                              h.IdentityOf(tokens, i)));
  }
  pool.Free(*got);
  return *got;
}

TEST(PagePoolPrefixTest, ReleasedRegisteredPagesStayCachedUntilNeeded) {
  const PrefixHasher h("s", 4);
  PagePool pool(6);
  const std::vector<int32_t> tokens = Iota(16);
  const std::vector<PageId> cached = CacheSequence(pool, h, tokens, 4);
  EXPECT_EQ(pool.used(), 0);
  EXPECT_EQ(pool.cached_pages(), 4);
  EXPECT_EQ(pool.evictable_pages(), 4);
  EXPECT_EQ(pool.free_pages(), 6);

  // A hit takes references; the pages leave the LRU.
  std::vector<PageHash> hashes;
  h.Extend(tokens, 4, &hashes);
  EXPECT_EQ(pool.CachedPrefixPages(hashes, h, tokens), 4);
  const std::vector<PageId> hit = pool.AcquireCached(hashes, h, tokens);
  EXPECT_EQ(hit, cached);
  EXPECT_EQ(pool.used(), 4);
  EXPECT_EQ(pool.evictable_pages(), 0);
  EXPECT_EQ(pool.free_pages(), 2);
  // A second holder of the same pages: both must drop them before they are evictable.
  const std::vector<PageId> again = pool.AcquireCached(hashes, h, tokens);
  EXPECT_EQ(again, cached);
  EXPECT_EQ(pool.used(), 4);
  pool.Free(hit);
  EXPECT_EQ(pool.used(), 4);
  EXPECT_EQ(pool.evictable_pages(), 0);
  pool.Free(again);
  EXPECT_EQ(pool.used(), 0);
  EXPECT_EQ(pool.evictable_pages(), 4);
  // Registering a hash twice, or a page twice, is refused.
  auto fresh = pool.Allocate(1);
  ASSERT_TRUE(fresh.ok());
  EXPECT_FALSE(pool.Register((*fresh)[0], hashes[0], h.seed(), std::span(tokens).first(4)));
  pool.Free(*fresh);
  EXPECT_EQ(pool.cached_pages(), 4);
}

TEST(PagePoolPrefixTest, AllocationTakesFreePagesFirstThenEvictsTheOldestTailFirst) {
  const PrefixHasher h("s", 2);
  PagePool pool(5);
  const std::vector<int32_t> a = Iota(4, 0), b = Iota(4, 100);
  const std::vector<PageId> pa = CacheSequence(pool, h, a, 2);  // older
  const std::vector<PageId> pb = CacheSequence(pool, h, b, 2);
  EXPECT_EQ(pool.evictable_pages(), 4);
  // One free page, then a's tail (released last within a's call, so evicted first).
  auto first = pool.Allocate(2);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(pool.evictions(), 1);
  EXPECT_EQ((*first)[1], pa[1]);
  std::vector<PageHash> ha, hb;
  h.Extend(a, 2, &ha);
  h.Extend(b, 2, &hb);
  EXPECT_EQ(pool.CachedPrefixPages(ha, h, a), 1);  // a's head survives
  auto second = pool.Allocate(1);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)[0], pa[0]);
  EXPECT_EQ(pool.CachedPrefixPages(ha, h, a), 0);
  EXPECT_EQ(pool.CachedPrefixPages(hb, h, b), 2);
  // Taking b back makes it recently used; nothing is left to evict then.
  const std::vector<PageId> hit = pool.AcquireCached(hb, h, b);
  EXPECT_EQ(hit, pb);
  EXPECT_EQ(pool.Allocate(1).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.used(), 5);
  pool.Free(hit);
  pool.Free(*first);
  pool.Free(*second);
  EXPECT_EQ(pool.used(), 0);
  EXPECT_EQ(pool.free_pages(), 5);
  EXPECT_EQ(pool.cached_pages(), 2);
}

// A page found under the right hash but holding other tokens, or another parent, is a miss:
// a hash collision must never hand out foreign KV.
TEST(PagePoolPrefixTest, AHitChecksTheTokensAndTheParent) {
  const PrefixHasher h("s", 4);
  PagePool pool(4);
  const std::vector<int32_t> tokens = Iota(8);
  std::vector<PageHash> hashes;
  h.Extend(tokens, 2, &hashes);
  auto pages = pool.Allocate(2);
  ASSERT_TRUE(pages.ok());
  // Page 1 registered as if its tokens were others (what a collision looks like).
  ASSERT_TRUE(pool.Register((*pages)[0], hashes[0], h.seed(), std::span(tokens).first(4)));
  const std::vector<int32_t> forged = {4, 5, 6, 8};
  ASSERT_TRUE(pool.Register((*pages)[1], hashes[1], hashes[0], forged));
  pool.Free(*pages);
  EXPECT_EQ(pool.CachedPrefixPages(hashes, h, tokens), 1);
  EXPECT_EQ(pool.AcquireCached(hashes, h, tokens).size(), 1u);
  // The right tokens under a parent that is not the lookup's: a miss from the first page on.
  PagePool other(2);
  auto page = other.Allocate(1);
  ASSERT_TRUE(page.ok());
  ASSERT_TRUE(other.Register((*page)[0], hashes[0], hashes[1], std::span(tokens).first(4)));
  other.Free(*page);
  EXPECT_EQ(other.CachedPrefixPages(hashes, h, tokens), 0);
  EXPECT_TRUE(other.AcquireCached(hashes, h, tokens).empty());
  EXPECT_EQ(other.used(), 0);
}

TEST(BlockTablePrefixTest, CachedPagesComeFirstAndTruncationKeepsSealedPages) {
  const PrefixHasher h("s", 4);
  PagePool pool(10);
  const std::vector<int32_t> tokens = Iota(8);
  CacheSequence(pool, h, tokens, 2);
  std::vector<PageHash> hashes;
  h.Extend(tokens, 2, &hashes);
  BlockTable table(4);
  table.AppendCached(pool.AcquireCached(hashes, h, tokens));
  EXPECT_EQ(table.sealed_pages(), 2);
  EXPECT_EQ(table.sealed_tokens(), 8);
  ASSERT_TRUE(table.EnsureCapacity(pool, 20).ok());
  EXPECT_EQ(pool.used(), 5);
  table.Seal(3);
  table.Truncate(pool, 13);  // the fifth page goes; the sealed three stay
  EXPECT_EQ(table.pages().size(), 4u);
  EXPECT_EQ(pool.used(), 4);
  EXPECT_DEATH(table.Truncate(pool, 8), "sealed");
  table.Release(pool);
  EXPECT_EQ(table.sealed_pages(), 0);
  EXPECT_EQ(pool.used(), 0);
  EXPECT_EQ(pool.evictable_pages(), 2);
}

}  // namespace
}  // namespace pdserve
