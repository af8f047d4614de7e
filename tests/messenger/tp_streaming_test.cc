// The prefill side's LayerStreamer over real fabric (tcp and shm, two transfer engines in this
// process) between sides of different tensor parallelism, with hand-made per-rank KV caches:
// P registers one region per rank, D one per rank and publishes one descriptor per rank
// through an encoded handshake message, D expects TransferPlan::ExpectedWrites, and the
// streamer posts a two-step prefill layer by layer. Every byte of every D rank's pages must be
// the heads its shard holds, taken from the P rank that holds them; D's count must be reached
// exactly; nothing else in D's caches may change.
//
// The messengers themselves (handshake, per-peer registration on D) need an Engine with rank
// workers for TP > 1; their process tests run at TP 1 (disagg_test.cc and the fault tests).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fabric/transfer_engine.h"
#include "kv/kv_cache.h"
#include "messenger/event_log.h"
#include "messenger/immediate.h"
#include "messenger/layer_streamer.h"
#include "messenger/node_info.h"
#include "messenger/protocol.h"

namespace pdserve::messenger {
namespace {

constexpr int kLayers = 3;
constexpr int kPageTokens = 4;
constexpr int kHeadDim = 8;

// Byte `i` of K (or V) of global head `head` of page `page`, layer `layer`, on P. Replicas of a
// head hold the same bytes, as real ones do.
uint8_t Pattern(int layer, PageId page, bool is_v, int head, size_t i) {
  return static_cast<uint8_t>(1 + layer * 59 + page * 31 + (is_v ? 17 : 0) + head * 7 + i * 3);
}

struct Node {
  std::vector<std::unique_ptr<KvCache>> caches;  // outlive the engine that registered them
  std::unique_ptr<fabric::TransferEngine> fabric;
  std::vector<fabric::RegionId> regions;
  NodeInfo info;
};

struct TpCase {
  const char* provider;
  int kv_heads, p_tp, d_tp;
};
void PrintTo(const TpCase& c, std::ostream* os) {
  *os << c.provider << " " << c.kv_heads << " heads, P tp " << c.p_tp << ", D tp " << c.d_tp;
}

// Builds a node of `tp` ranks over `kv_heads` heads, every rank's cache registered; a
// `target` node publishes its descriptors (D), the other none (P).
Node MakeNode(fabric::Provider provider, int kv_heads, int tp, int num_pages, bool target,
              fabric::TransferEngineHandlers handlers = {}) {
  Node n;
  fabric::FabricConfig config;
  config.provider = provider;
  if (provider == fabric::Provider::kTcp) config.node = "127.0.0.1";
  auto fabric = fabric::TransferEngine::Create(config, std::move(handlers));
  EXPECT_TRUE(fabric.ok()) << fabric.status().ToString();
  if (!fabric.ok()) return n;
  n.fabric = std::move(fabric).value();
  auto shards = KvShardLayout::ForTensorParallel(kv_heads, tp);
  EXPECT_TRUE(shards.ok());
  std::vector<KvLayout> layouts;
  std::vector<std::string> memory;
  for (int r = 0; r < tp; ++r) {
    layouts.push_back(KvLayout{.num_layers = kLayers,
                               .num_kv_heads = shards->heads(r).size(),
                               .head_dim = kHeadDim,
                               .page_tokens = kPageTokens,
                               .dtype = DType::kF32,
                               .num_pages = num_pages});
    auto cache = KvCache::Create(layouts.back());
    EXPECT_TRUE(cache.ok()) << cache.status().ToString();
    if (!cache.ok()) return n;
    n.caches.push_back(std::move(cache).value());
    auto region = n.fabric->RegisterMemory(n.caches[r]->base(), n.caches[r]->size_bytes());
    EXPECT_TRUE(region.ok()) << region.status().ToString();
    n.regions.push_back(*region);
    memory.push_back(target ? n.fabric->Describe(*region)->Serialize() : "");
  }
  auto info = MakeLocalNodeInfo(kv_heads, layouts, std::move(memory), "fp", "test");
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  if (info.ok()) n.info = std::move(info).value();
  return n;
}

void FillPrefillCaches(Node& p) {
  for (size_t r = 0; r < p.caches.size(); ++r) {
    KvCache& cache = *p.caches[r];
    const KvLayout& l = cache.layout();
    const int first_head = p.info.kv.shards.heads(static_cast<int>(r)).begin;
    for (int layer = 0; layer < l.num_layers; ++layer) {
      for (PageId page = 0; page < l.num_pages; ++page) {
        for (bool is_v : {false, true}) {
          for (int h = 0; h < l.num_kv_heads; ++h) {
            uint8_t* at = cache.base() + l.ElementOffset(layer, page, is_v, h, 0);
            for (size_t i = 0; i < l.head_bytes(); ++i) {
              at[i] = Pattern(layer, page, is_v, first_head + h, i);
            }
          }
        }
      }
    }
  }
}

template <typename Pred>
bool WaitUntil(Pred pred, Deadline deadline) {
  while (!pred()) {
    if (deadline.Passed()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

class MessengerTpStreamTest : public ::testing::TestWithParam<TpCase> {};

TEST_P(MessengerTpStreamTest, EveryRankReceivesItsHeadsFromTheRightRank) {
  const TpCase c = GetParam();
  auto provider = fabric::ParseProvider(c.provider);
  ASSERT_TRUE(provider.ok());
  std::atomic<int> unexpected_immediates{0};
  fabric::TransferEngineHandlers d_handlers;
  d_handlers.on_unmatched_immediate = [&](fabric::PeerId, uint32_t) {
    ++unexpected_immediates;
    return true;
  };
  Node p = MakeNode(*provider, c.kv_heads, c.p_tp, /*num_pages=*/12, /*target=*/false);
  Node d = MakeNode(*provider, c.kv_heads, c.d_tp, /*num_pages=*/10, /*target=*/true,
                    std::move(d_handlers));
  ASSERT_NE(p.fabric, nullptr);
  ASSERT_NE(d.fabric, nullptr);
  ASSERT_EQ(p.regions.size(), static_cast<size_t>(c.p_tp));
  ASSERT_EQ(d.regions.size(), static_cast<size_t>(c.d_tp));
  FillPrefillCaches(p);

  // D's node info crosses the wire as in the handshake; P parses one descriptor per rank.
  auto bytes = EncodeMessage(HelloFinish{.proof = {}, .node = d.info});
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto message = DecodeMessage(*bytes);
  ASSERT_TRUE(message.ok()) << message.status().ToString();
  const NodeInfo& d_info = std::get<HelloFinish>(*message).node;
  ASSERT_TRUE(CheckPeerCompatible(p.info, d_info).ok());
  auto dst = std::make_shared<std::vector<fabric::MemoryDescriptor>>();
  for (const std::string& m : d_info.rank_memory) {
    auto descriptor = fabric::MemoryDescriptor::Parse(m);
    ASSERT_TRUE(descriptor.ok()) << descriptor.status().ToString();
    dst->push_back(*descriptor);
  }
  auto plan = TransferPlan::Create(p.info.kv, d_info.kv);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto d_plan = TransferPlan::Create(p.info.kv, d.info.kv);  // D's own copy, as D computes it
  ASSERT_TRUE(d_plan.ok());

  auto peer = p.fabric->AddPeer(d.fabric->address());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_TRUE(d.fabric->AddPeer(p.fabric->address()).ok());

  // An 11-token prefill (pages of 4: the last page partly filled) in two chunks.
  const std::vector<PageId> src_pages = {7, 2, 10};
  const std::vector<PageId> dst_pages = {4, 9, 0};
  const int64_t tokens = 11;
  const uint64_t seed = 12345;
  const uint32_t imm = EncodeImmediate({.slot = 3, .generation = 1});
  const uint64_t expected = d_plan->ExpectedWrites(dst_pages.size(), seed);
  std::promise<std::pair<Status, uint32_t>> landed;
  ASSERT_TRUE(d.fabric
                  ->Expect(imm, static_cast<uint32_t>(expected), Deadline::AfterMs(60000),
                           [&](const Status& s, uint32_t arrived) {
                             landed.set_value({s, arrived});
                           })
                  .ok());

  EventLog events;
  auto streamer =
      std::make_unique<LayerStreamer>(p.fabric.get(), kPageTokens, kLayers, c.p_tp, &events,
                                      [](const std::shared_ptr<StreamJob>&) {});
  auto job = std::make_shared<StreamJob>();
  job->engine_id = "job";
  job->transfer_id = 1;
  job->peer = *peer;
  job->src = std::make_shared<const std::vector<fabric::RegionId>>(p.regions);
  job->dst = dst;
  job->plan = std::make_shared<const TransferPlan>(*plan);
  job->seed = seed;
  job->immediate = imm;
  job->num_tokens = tokens;
  job->dst_pages = dst_pages;
  job->deadline = Deadline::AfterMs(60000);
  streamer->Add(job);
  streamer->Start();
  const std::string id = job->engine_id;
  const AnnouncedChunk first{.request_id = &id, .start = 0, .count = 6, .pages = src_pages};
  streamer->OnStepScheduled(1, {&first, 1});
  for (int layer = 0; layer < kLayers; ++layer) streamer->OnLayerDone(1, layer);
  const AnnouncedChunk last{.request_id = &id, .start = 6, .count = 5, .pages = src_pages};
  streamer->OnStepScheduled(2, {&last, 1});
  for (int layer = 0; layer < kLayers; ++layer) streamer->OnLayerDone(2, layer);

  auto future = landed.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "D's expected count was not reached";
  const auto [status, arrived] = future.get();
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(arrived, expected);
  ASSERT_TRUE(WaitUntil(
      [&] {
        const auto progress = streamer->Progress(*job);
        return progress.pages_streamed == 3 &&
               job->writes_completed.load() == progress.writes_posted;
      },
      Deadline::AfterMs(60000)));
  EXPECT_FALSE(job->write_failed.load()) << [&] {
    MutexLock lock(&job->error_mu);
    return job->first_error.ToString();
  }();
  // P posted exactly what D expects.
  EXPECT_EQ(static_cast<uint64_t>(streamer->Progress(*job).writes_posted), expected);
  EXPECT_EQ(static_cast<uint64_t>(streamer->writes_sent()), expected);
  EXPECT_EQ(static_cast<uint64_t>(streamer->bytes_sent()), d_plan->ExpectedBytes(3, seed));
  // And by the rank each write read, as the plan routes them.
  std::vector<int64_t> rank_writes(c.p_tp), rank_bytes(c.p_tp);
  std::vector<PagePair> pairs;
  for (size_t i = 0; i < src_pages.size(); ++i) pairs.push_back({src_pages[i], dst_pages[i]});
  for (int layer = 0; layer < kLayers; ++layer) {
    auto writes = d_plan->LayerWrites(pairs, layer, seed);
    ASSERT_TRUE(writes.ok());
    for (const KvWrite& w : *writes) {
      ++rank_writes[w.src_rank];
      rank_bytes[w.src_rank] += static_cast<int64_t>(w.length);
    }
  }
  EXPECT_EQ(streamer->writes_sent_by_rank(), rank_writes);
  EXPECT_EQ(streamer->bytes_sent_by_rank(), rank_bytes);

  // Every D rank holds its heads of P's pages; D's other pages are untouched.
  for (int r = 0; r < c.d_tp; ++r) {
    const KvCache& cache = *d.caches[r];
    const KvLayout& l = cache.layout();
    const int first_head = d.info.kv.shards.heads(r).begin;
    for (int layer = 0; layer < kLayers; ++layer) {
      for (PageId page = 0; page < l.num_pages; ++page) {
        const auto listed = std::find(dst_pages.begin(), dst_pages.end(), page);
        for (bool is_v : {false, true}) {
          for (int h = 0; h < l.num_kv_heads; ++h) {
            const uint8_t* at = cache.base() + l.ElementOffset(layer, page, is_v, h, 0);
            size_t wrong = 0;
            for (size_t i = 0; i < l.head_bytes(); ++i) {
              const uint8_t want = listed == dst_pages.end()
                                       ? 0
                                       : Pattern(layer, src_pages[listed - dst_pages.begin()], is_v,
                                                 first_head + h, i);
              wrong += at[i] != want;
            }
            EXPECT_EQ(wrong, 0u) << "D rank " << r << " layer " << layer << " page " << page
                                 << (is_v ? " V" : " K") << " head " << first_head + h;
          }
        }
      }
    }
  }
  EXPECT_EQ(unexpected_immediates.load(), 0);

  streamer->Stop();
  p.fabric.reset();  // ends every transfer before the streamer its completions call
  streamer.reset();
}

INSTANTIATE_TEST_SUITE_P(
    TpPairs, MessengerTpStreamTest,
    ::testing::Values(TpCase{"tcp", 4, 1, 1}, TpCase{"tcp", 4, 2, 1}, TpCase{"tcp", 4, 1, 2},
                      TpCase{"tcp", 4, 2, 4}, TpCase{"tcp", 2, 4, 1}, TpCase{"tcp", 2, 1, 4},
                      TpCase{"shm", 4, 2, 1}, TpCase{"shm", 4, 1, 2}, TpCase{"shm", 6, 2, 3}),
    [](const ::testing::TestParamInfo<TpCase>& info) {
      return std::string(info.param.provider) + "Heads" + std::to_string(info.param.kv_heads) +
             "P" + std::to_string(info.param.p_tp) + "D" + std::to_string(info.param.d_tp);
    });

}  // namespace
}  // namespace pdserve::messenger
