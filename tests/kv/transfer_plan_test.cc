#include "kv/transfer_plan.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kv/layout.h"
#include "kv/shard_layout.h"

namespace pdserve {
namespace {

constexpr int kLayers = 3;
constexpr int kHeadDim = 4;
constexpr int kPageTokens = 3;
constexpr int kSourcePages = 7;
constexpr int kDestinationPages = 9;

KvSideLayout MakeSide(int kv_heads, int tp, int num_pages, DType dtype = DType::kBF16) {
  auto shards = KvShardLayout::ForTensorParallel(kv_heads, tp);
  EXPECT_TRUE(shards.ok()) << shards.status().ToString();
  KvSideLayout side{.shards = *shards, .ranks = {}};
  for (int r = 0; r < tp; ++r) {
    side.ranks.push_back(KvLayout{.num_layers = kLayers,
                                  .num_kv_heads = shards->heads(r).size(),
                                  .head_dim = kHeadDim,
                                  .page_tokens = kPageTokens,
                                  .dtype = dtype,
                                  .num_pages = num_pages});
  }
  return side;
}

// The byte a single-rank cache holds at (layer, page, K/V, head, slot, byte of the row):
// a mix of the coordinates, never 0 so that an unwritten destination byte shows.
uint8_t ReferenceByte(int layer, int page, bool is_v, int head, int slot, int byte) {
  uint32_t x = ((((layer * 64 + page) * 2 + is_v) * 64 + head) * 64 + slot) * 64 + byte;
  x *= 0x9e3779b1u;
  x ^= x >> 15;
  return static_cast<uint8_t>(1 + (x % 255));
}

// Calls fn(layer, page, is_v, local_head, slot, byte, offset) for every byte of a layout.
template <typename Fn>
void ForEachByte(const KvLayout& l, Fn fn) {
  const int row_bytes = static_cast<int>(l.head_dim * l.elem_size());
  for (int layer = 0; layer < l.num_layers; ++layer) {
    for (int page = 0; page < l.num_pages; ++page) {
      for (bool is_v : {false, true}) {
        for (int h = 0; h < l.num_kv_heads; ++h) {
          for (int slot = 0; slot < l.page_tokens; ++slot) {
            const size_t row = l.ElementOffset(layer, page, is_v, h, slot);
            for (int b = 0; b < row_bytes; ++b) fn(layer, page, is_v, h, slot, b, row + b);
          }
        }
      }
    }
  }
}

struct Config {
  int source_tp;
  int destination_tp;
  int kv_heads;
  DType dtype;
};

std::string Name(const Config& c) {
  return "P" + std::to_string(c.source_tp) + "->D" + std::to_string(c.destination_tp) +
         " kv_heads=" + std::to_string(c.kv_heads) + " " + std::string(DTypeFlagName(c.dtype));
}

std::vector<Config> AllConfigs() {
  const std::vector<std::pair<int, int>> tps = {{1, 1}, {1, 2}, {2, 1}, {2, 4}, {4, 2},
                                                {1, 4}, {4, 1}, {3, 1}, {4, 4}, {1, 3}};
  std::vector<Config> configs;
  for (auto [p, d] : tps) {
    for (int kv : {2, 4, 8}) {
      for (DType dtype : {DType::kBF16, DType::kF32}) configs.push_back({p, d, kv, dtype});
    }
  }
  return configs;
}

// Copies a request's pages with the plan, byte by byte, and checks every byte of every
// listed destination page against a single-rank reference cache.
void SimulateAndCheck(const Config& c, const std::vector<PagePair>& pairs, uint64_t seed) {
  SCOPED_TRACE(Name(c) + " seed " + std::to_string(seed));
  const KvSideLayout source = MakeSide(c.kv_heads, c.source_tp, kSourcePages, c.dtype);
  const KvSideLayout destination =
      MakeSide(c.kv_heads, c.destination_tp, kDestinationPages, c.dtype);
  auto plan = TransferPlan::Create(source, destination);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();

  // The single-rank reference: one cache holding every head.
  KvLayout reference = source.ranks[0];
  reference.num_kv_heads = c.kv_heads;
  std::vector<uint8_t> ref_mem(reference.total_bytes());
  ForEachByte(reference, [&](int layer, int page, bool is_v, int h, int slot, int b, size_t off) {
    ref_mem[off] = ReferenceByte(layer, page, is_v, h, slot, b);
  });
  auto ref_byte = [&](int layer, PageId page, bool is_v, int head, int slot, int b) {
    return ref_mem[reference.ElementOffset(layer, page, is_v, head, slot) + b];
  };
  // Source ranks hold the reference bytes of their heads.
  std::vector<std::vector<uint8_t>> src_mem(c.source_tp);
  for (int r = 0; r < c.source_tp; ++r) {
    const KvLayout& l = source.ranks[r];
    src_mem[r].assign(l.total_bytes(), 0);
    const int first = source.shards.heads(r).begin;
    ForEachByte(l, [&](int layer, int page, bool is_v, int h, int slot, int b, size_t off) {
      src_mem[r][off] = ref_byte(layer, page, is_v, first + h, slot, b);
    });
  }
  std::vector<std::vector<uint8_t>> dst_mem(c.destination_tp), dst_writes(c.destination_tp);
  for (int r = 0; r < c.destination_tp; ++r) {
    dst_mem[r].assign(destination.ranks[r].total_bytes(), 0);
    dst_writes[r].assign(destination.ranks[r].total_bytes(), 0);
  }

  std::vector<uint64_t> writes_per_rank(c.destination_tp, 0);
  uint64_t bytes_written = 0;
  for (int layer = 0; layer < kLayers; ++layer) {
    auto writes = plan->LayerWrites(pairs, layer, seed);
    ASSERT_TRUE(writes.ok()) << writes.status().ToString();
    for (const KvWrite& w : *writes) {
      ASSERT_GE(w.src_rank, 0);
      ASSERT_LT(w.src_rank, c.source_tp);
      ASSERT_GE(w.dst_rank, 0);
      ASSERT_LT(w.dst_rank, c.destination_tp);
      ASSERT_GT(w.length, 0u);
      bytes_written += w.length;
      ASSERT_LE(w.src_offset + w.length, src_mem[w.src_rank].size());
      ASSERT_LE(w.dst_offset + w.length, dst_mem[w.dst_rank].size());
      for (uint64_t i = 0; i < w.length; ++i) {
        dst_mem[w.dst_rank][w.dst_offset + i] = src_mem[w.src_rank][w.src_offset + i];
        ++dst_writes[w.dst_rank][w.dst_offset + i];
      }
      ++writes_per_rank[w.dst_rank];
    }
  }

  std::map<PageId, PageId> src_of_dst;
  for (const PagePair& p : pairs) src_of_dst[p.dst] = p.src;
  for (int r = 0; r < c.destination_tp; ++r) {
    const int first = destination.shards.heads(r).begin;
    size_t bad = 0, touched_outside = 0;
    ForEachByte(destination.ranks[r],
                [&](int layer, int page, bool is_v, int h, int slot, int b, size_t off) {
                  const auto it = src_of_dst.find(page);
                  if (it == src_of_dst.end()) {
                    touched_outside += dst_writes[r][off] != 0 || dst_mem[r][off] != 0;
                    return;
                  }
                  const uint8_t want = ref_byte(layer, it->second, is_v, first + h, slot, b);
                  bad += dst_writes[r][off] != 1 || dst_mem[r][off] != want;
                });
    EXPECT_EQ(bad, 0u) << "destination rank " << r << ": bytes missing, wrong or written twice";
    EXPECT_EQ(touched_outside, 0u) << "destination rank " << r << ": bytes outside listed pages";
  }

  EXPECT_EQ(plan->ExpectedWritesPerRank(pairs.size(), seed), writes_per_rank);
  uint64_t total = 0;
  for (uint64_t n : writes_per_rank) total += n;
  EXPECT_EQ(plan->ExpectedWrites(pairs.size(), seed), total);
  EXPECT_EQ(plan->ExpectedBytes(pairs.size(), seed), bytes_written);
}

TEST(TransferPlanTest, EveryDestinationByteMatchesTheSingleRankReference) {
  // Out-of-order, non-contiguous pages, different ids on both sides.
  const std::vector<PagePair> pairs = {{3, 8}, {0, 2}, {6, 1}, {5, 4}};
  for (const Config& c : AllConfigs()) {
    for (uint64_t seed : {0, 1, 2, 3, 977}) SimulateAndCheck(c, pairs, seed);
  }
}

TEST(TransferPlanTest, ContiguousAndEmptyPageLists) {
  for (const Config& c : AllConfigs()) {
    SimulateAndCheck(c, {{0, 0}, {1, 1}, {2, 2}}, 5);
    SimulateAndCheck(c, {}, 5);
  }
}

TEST(TransferPlanTest, EqualShardsMoveKAndVOfAPageInOneWrite) {
  const KvSideLayout side = MakeSide(8, 4, kSourcePages);
  auto plan = TransferPlan::Create(side, side);
  ASSERT_TRUE(plan.ok());
  const std::vector<PagePair> pairs = {{1, 2}, {3, 4}};
  auto writes = plan->LayerWrites(pairs, 0, 0);
  ASSERT_TRUE(writes.ok());
  ASSERT_EQ(writes->size(), 4 * pairs.size());  // one per rank and page
  for (const KvWrite& w : *writes) {
    EXPECT_EQ(w.src_rank, w.dst_rank);
    EXPECT_EQ(w.length, side.ranks[0].block_bytes());
  }
  // Different shards split K and V: 2 source ranks each feed half of the one destination's
  // K and half of its V.
  auto split = TransferPlan::Create(side, MakeSide(8, 2, kSourcePages));
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->ExpectedWrites(2, 0), 2u * 4 * 2 * kLayers);
}

// Over many requests, every source rank sends, and roughly its share.
TEST(TransferPlanTest, ReplicaAssignmentSpreadsOverAllSourceRanks) {
  constexpr int kRequests = 400;
  const std::vector<PagePair> pairs = {{0, 0}};
  for (const Config& c : AllConfigs()) {
    SCOPED_TRACE(Name(c));
    auto plan = TransferPlan::Create(MakeSide(c.kv_heads, c.source_tp, 4),
                                     MakeSide(c.kv_heads, c.destination_tp, 4));
    ASSERT_TRUE(plan.ok());
    std::map<int, uint64_t> bytes_by_source;
    uint64_t total = 0;
    for (uint64_t seed = 0; seed < kRequests; ++seed) {
      auto writes = plan->LayerWrites(pairs, 0, seed * 7919 + 13);
      ASSERT_TRUE(writes.ok());
      for (const KvWrite& w : *writes) {
        bytes_by_source[w.src_rank] += w.length;
        total += w.length;
      }
    }
    ASSERT_EQ(bytes_by_source.size(), static_cast<size_t>(c.source_tp));
    const KvShardLayout& src = plan->source().shards;
    for (auto [rank, bytes] : bytes_by_source) {
      // A rank's fair share: its group's share of the heads, split over the group's replicas.
      const double share = static_cast<double>(src.heads(rank).size()) / c.kv_heads /
                           src.group_ranks(src.group_of(rank)).size();
      EXPECT_GT(bytes, 0.6 * share * total) << "source rank " << rank;
    }
  }
}

// An MLA model's latent cache: one head of one component that every rank holds. P TP 2 -> D
// TP 1 and P TP 4 -> D TP 2: each request's latent pages come from one chosen P rank per D rank
// (one copy each, a whole block per page), and over 100 requests every P rank sends within 20%
// of an even share.
TEST(TransferPlanTest, LatentCacheComesOnceFromAnEvenlyChosenReplica) {
  auto latent_side = [](int tp) {
    KvSideLayout side = MakeSide(1, tp, 4);
    for (KvLayout& l : side.ranks) {
      l.kind = KvKind::kLatent;
      l.head_dim = 576;
    }
    return side;
  };
  for (auto [p_tp, d_tp] : {std::pair{2, 1}, {4, 2}}) {
    SCOPED_TRACE("P TP " + std::to_string(p_tp) + " -> D TP " + std::to_string(d_tp));
    auto plan = TransferPlan::Create(latent_side(p_tp), latent_side(d_tp));
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    const std::vector<PagePair> pairs = {{0, 1}, {2, 3}};
    const size_t block = plan->source().ranks[0].block_bytes();
    EXPECT_EQ(block, size_t{kPageTokens} * 576 * 2);  // the latent rows of a page, nothing more
    std::map<int, int> requests_by_source;
    constexpr int kRequests = 100;
    for (uint64_t seed = 0; seed < kRequests; ++seed) {
      auto writes = plan->LayerWrites(pairs, 0, seed * 0x9e3779b97f4a7c15ull + 1);
      ASSERT_TRUE(writes.ok());
      ASSERT_EQ(writes->size(), pairs.size() * d_tp);  // one copy per D rank and page
      std::set<int> senders;
      for (const KvWrite& w : *writes) {
        EXPECT_EQ(w.length, block);
        senders.insert(w.src_rank);
      }
      for (int s : senders) ++requests_by_source[s];
    }
    const double even = static_cast<double>(kRequests) * d_tp / p_tp;
    for (int r = 0; r < p_tp; ++r) {
      EXPECT_GE(requests_by_source[r], 0.8 * even) << "P rank " << r;
      EXPECT_LE(requests_by_source[r], 1.2 * even) << "P rank " << r;
    }
  }
}

// With as many replicas on D as on P, one request already uses every source replica.
TEST(TransferPlanTest, DestinationReplicasTakeDifferentSourceReplicas) {
  auto plan = TransferPlan::Create(MakeSide(2, 4, 4), MakeSide(2, 4, 4));
  ASSERT_TRUE(plan.ok());
  for (uint64_t seed = 0; seed < 20; ++seed) {
    auto writes = plan->LayerWrites(std::vector<PagePair>{{0, 0}}, 0, seed);
    ASSERT_TRUE(writes.ok());
    std::set<int> sources;
    for (const KvWrite& w : *writes) sources.insert(w.src_rank);
    EXPECT_EQ(sources.size(), 4u) << "seed " << seed;
  }
}

TEST(TransferPlanTest, RefusesMismatchedPagesAndDtypes) {
  const KvSideLayout source = MakeSide(4, 2, 8);
  KvSideLayout other = MakeSide(4, 1, 8);
  other.ranks[0].page_tokens = kPageTokens + 1;
  auto r = TransferPlan::Create(source, other);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("page_tokens"), std::string::npos) << r.status().ToString();

  other = MakeSide(4, 1, 8, DType::kF32);
  r = TransferPlan::Create(source, other);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dtype is bf16 on source rank 0 but f32"), std::string::npos)
      << r.status().ToString();

  other = MakeSide(4, 1, 8);
  other.ranks[0].head_dim = 8;
  EXPECT_FALSE(TransferPlan::Create(source, other).ok());
  other = MakeSide(4, 1, 8);
  other.ranks[0].num_layers = kLayers + 1;
  EXPECT_FALSE(TransferPlan::Create(source, other).ok());
  // A source rank disagreeing with its own side is refused too.
  KvSideLayout bad_source = source;
  bad_source.ranks[1].page_tokens = 1;
  EXPECT_FALSE(TransferPlan::Create(bad_source, MakeSide(4, 1, 8)).ok());
}

TEST(TransferPlanTest, RefusesInconsistentShards) {
  // Different model head counts.
  auto r = TransferPlan::Create(MakeSide(4, 2, 8), MakeSide(8, 2, 8));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("4 KV heads, destination 8"), std::string::npos);
  // A rank layout whose head count is not its shard's.
  KvSideLayout side = MakeSide(4, 2, 8);
  side.ranks[0].num_kv_heads = 4;
  EXPECT_FALSE(TransferPlan::Create(side, MakeSide(4, 2, 8)).ok());
  // Fewer rank layouts than shards.
  side = MakeSide(4, 2, 8);
  side.ranks.pop_back();
  EXPECT_FALSE(TransferPlan::Create(side, MakeSide(4, 2, 8)).ok());
}

TEST(TransferPlanTest, RefusesBadPagesAndLayersWithoutWriting) {
  auto plan = TransferPlan::Create(MakeSide(4, 2, 5), MakeSide(4, 1, 6));
  ASSERT_TRUE(plan.ok());
  std::vector<KvWrite> out;
  const std::vector<std::pair<std::vector<PagePair>, int>> bad = {
      {{{5, 0}}, 0},          // source page past the source's 5
      {{{0, 6}}, 0},          // destination page past the destination's 6
      {{{-1, 0}}, 0},         // negative page
      {{{0, 1}, {2, 1}}, 0},  // destination page twice
      {{{0, 1}}, kLayers},    // layer out of range
      {{{0, 1}}, -1},
  };
  for (const auto& [pairs, layer] : bad) {
    const Status s = plan->AppendLayerWrites(pairs, layer, 0, &out);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_TRUE(out.empty());
  }
}

TEST(KvShardLayoutTest, TensorParallelSplitsAndReplicaGroups) {
  auto even = KvShardLayout::ForTensorParallel(8, 4);
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(even->num_groups(), 4);
  EXPECT_EQ(even->heads(3), (HeadRange{6, 8}));

  auto uneven = KvShardLayout::ForTensorParallel(4, 3);
  ASSERT_TRUE(uneven.ok());
  EXPECT_EQ(uneven->rank_heads(), (std::vector<HeadRange>{{0, 2}, {2, 3}, {3, 4}}));

  auto replicas = KvShardLayout::ForTensorParallel(2, 4);
  ASSERT_TRUE(replicas.ok());
  EXPECT_EQ(replicas->num_groups(), 2);
  EXPECT_EQ(replicas->group_ranks(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(replicas->group_ranks(1), (std::vector<int>{2, 3}));
  EXPECT_EQ(replicas->replica_index(3), 1);
  EXPECT_EQ(replicas->group_of(2), 1);

  auto odd = KvShardLayout::ForTensorParallel(2, 3);
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(odd->group_ranks(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(odd->group_ranks(1), (std::vector<int>{2}));
}

TEST(KvShardLayoutTest, RefusesOverlapsGapsAndEmptyRanges) {
  EXPECT_FALSE(KvShardLayout::Create(4, {{0, 2}, {1, 4}}).ok());  // partial overlap
  EXPECT_FALSE(KvShardLayout::Create(4, {{0, 2}, {3, 4}}).ok());  // gap
  EXPECT_FALSE(KvShardLayout::Create(4, {{0, 2}, {2, 3}}).ok());  // head 3 held by nobody
  EXPECT_FALSE(KvShardLayout::Create(4, {{0, 4}, {0, 2}}).ok());  // nested
  EXPECT_FALSE(KvShardLayout::Create(4, {{0, 0}, {0, 4}}).ok());  // empty range
  EXPECT_FALSE(KvShardLayout::Create(4, {}).ok());
  EXPECT_FALSE(KvShardLayout::Create(0, {{0, 1}}).ok());
  // Replica groups may be listed in any rank order.
  auto shuffled = KvShardLayout::Create(2, {{1, 2}, {0, 1}, {1, 2}, {0, 1}});
  ASSERT_TRUE(shuffled.ok()) << shuffled.status().ToString();
  EXPECT_EQ(shuffled->group_ranks(0), (std::vector<int>{1, 3}));
}

TEST(KvLayoutTest, ValidateRefusesOutOfRangeAndOverflowingLayouts) {
  KvLayout l{.num_layers = 2,
             .num_kv_heads = 2,
             .head_dim = 64,
             .page_tokens = 16,
             .dtype = DType::kBF16,
             .num_pages = 10};
  EXPECT_TRUE(l.Validate().ok());
  KvLayout bad = l;
  bad.head_dim = 0;
  EXPECT_FALSE(bad.Validate().ok());
  bad = l;
  bad.dtype = static_cast<DType>(7);
  EXPECT_FALSE(bad.Validate().ok());
  bad = l;
  bad.dtype = DType::kF16;  // a real element type, but not one the KV cache holds
  Status f16 = bad.Validate();
  EXPECT_FALSE(f16.ok());
  EXPECT_NE(f16.ToString().find("f16"), std::string::npos) << f16.ToString();
  bad = l;
  bad.num_layers = 4096;
  bad.num_kv_heads = 4096;
  bad.head_dim = 1 << 14;
  bad.num_pages = 1 << 26;
  EXPECT_FALSE(bad.Validate().ok());
}

}  // namespace
}  // namespace pdserve
