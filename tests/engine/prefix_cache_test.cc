// Automatic prefix caching (engine/prefix_cache.h): a request that shares cached pages gives
// the tokens and logprobs, bit for bit, of one that computes everything; multi-turn
// conversations are identical with caching on and off on every tiny preset, wherever the hit
// ends within a page; pages are all free or evictable after eviction pressure, cancels and
// preemptions; the counters count what a model of the cache predicts; prefill-only and
// remote-prefill requests keep their contracts.
#include "engine/prefix_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "testing/test_models.h"

namespace pdserve {
namespace {

using testing::EngineFixture;
using testing::FixtureOptions;

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<SampleResult> samples;
  bool finished = false;
};

EngineRequest MakeRequest(const std::string& id, const std::vector<int32_t>& prompt, int n,
                          Outcome* outcome, SamplingParams params = {}) {
  EngineRequest r;
  r.id = id;
  r.prompt = prompt;
  r.params = params;
  r.params.max_tokens = n;
  r.params.ignore_eos = true;
  r.on_output = [outcome](const RequestOutput& o) {
    EXPECT_TRUE(o.status.ok() || o.finish_reason == FinishReason::kCancelled)
        << o.status.ToString();
    outcome->tokens.insert(outcome->tokens.end(), o.tokens.begin(), o.tokens.end());
    outcome->samples.insert(outcome->samples.end(), o.samples.begin(), o.samples.end());
    outcome->finished = o.finished;
  };
  return r;
}

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

// Runs one request to its end alone; also returns the tokens the cache hit for it.
Outcome RunAlone(Engine& engine, const std::string& id, const std::vector<int32_t>& prompt, int n,
                 SamplingParams params, int64_t* hit = nullptr) {
  const int64_t before = engine.prefix_cache().stats().hits;
  Outcome out;
  EXPECT_TRUE(engine.Submit(MakeRequest(id, prompt, n, &out, params)).ok());
  engine.RunUntilIdle();
  EXPECT_TRUE(out.finished);
  if (hit != nullptr) *hit = engine.prefix_cache().stats().hits - before;
  return out;
}

// Float bits, so that -0 vs 0 or two NaNs are told apart like any other difference.
uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

void ExpectSameSamples(const std::vector<SampleResult>& a, const std::vector<SampleResult>& b,
                       const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].token, b[i].token) << what << " token " << i;
    EXPECT_EQ(Bits(a[i].logprob), Bits(b[i].logprob)) << what << " token " << i;
    ASSERT_EQ(a[i].top_logprobs.size(), b[i].top_logprobs.size()) << what;
    for (size_t j = 0; j < a[i].top_logprobs.size(); ++j) {
      EXPECT_EQ(a[i].top_logprobs[j].token, b[i].top_logprobs[j].token) << what;
      EXPECT_EQ(Bits(a[i].top_logprobs[j].logprob), Bits(b[i].top_logprobs[j].logprob)) << what;
    }
  }
}

// Every page free or evictable: none referenced, and what is cached is evictable.
void ExpectDrained(const Engine& engine) {
  const PagePool& pool = engine.page_pool();
  EXPECT_EQ(pool.used(), 0);
  EXPECT_EQ(pool.free_pages(), pool.capacity());
  EXPECT_EQ(pool.cached_pages(), pool.evictable_pages());
}

std::vector<int32_t> Tokens(int n, uint32_t seed, int vocab = 250) {
  return testing::SeededTokens(n, vocab, seed);
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A hit gives a miss's tokens and logprobs bit for bit: greedy with top-5 logprobs, and a seeded
// sampled request, each run on an engine without caching, then twice on one with it (a miss,
// then a hit of every full page but the last token's).
TEST(PrefixCacheTest, HitGivesTheMissTokensAndLogprobsBitForBit) {
  const std::string dir = testing::SyntheticModelDir("tiny-qwen2", DType::kBF16);
  SamplingParams greedy = Greedy();
  greedy.logprobs = 5;
  SamplingParams sampled;
  sampled.temperature = 0.8f;
  sampled.top_p = 0.9f;
  sampled.seed = 42;
  sampled.logprobs = 3;
  EngineFixture off(dir, {.page_tokens = 4, .max_batch_tokens = 7, .prefix_caching = false});
  EngineFixture on(dir, {.page_tokens = 4, .max_batch_tokens = 7});
  int id = 0;
  for (int len : {9, 10, 11, 12, 30}) {  // every residue modulo the page
    const std::vector<int32_t> prompt = Tokens(len, 100 + len);
    for (const SamplingParams& params : {greedy, sampled}) {
      const std::string what =
          "length " + std::to_string(len) + (params.greedy() ? " greedy" : " sampled");
      const Outcome want = RunAlone(off.engine(), "r" + std::to_string(id++), prompt, 12, params);
      int64_t miss_hit = -1, hit = -1;
      const Outcome first =
          RunAlone(on.engine(), "r" + std::to_string(id++), prompt, 12, params, &miss_hit);
      const Outcome second =
          RunAlone(on.engine(), "r" + std::to_string(id++), prompt, 12, params, &hit);
      if (params.greedy()) {
        EXPECT_EQ(miss_hit, 0) << what;
      }
      EXPECT_EQ(hit, (len - 1) / 4 * 4) << what;
      ExpectSameSamples(first.samples, want.samples, what + " miss");
      ExpectSameSamples(second.samples, want.samples, what + " hit");
      EXPECT_EQ(second.tokens, want.tokens) << what;
    }
  }
  EXPECT_EQ(off.engine().prefix_cache().stats().hits, 0);
  EXPECT_EQ(off.engine().page_pool().cached_pages(), 0);
  ExpectDrained(on.engine());
}

// 20 conversations: a shared system prompt, then turns that each add a user message (1 to 11
// tokens) to the history of earlier messages and greedy answers; each turn's requests run as one
// batch. Every turn's tokens are the same with caching on and off, on every tiny preset; prompt
// lengths cover every residue modulo the page size, so hits end at every offset within the last
// page before the computed part.
class PrefixCacheConversationTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PrefixCacheConversationTest, EveryTurnIsIdenticalWithCachingOnAndOff) {
  const std::string dir = testing::SyntheticModelDir(GetParam(), DType::kBF16);
  constexpr int kPage = 4, kConversations = 20, kTurns = 4, kAnswer = 5;
  EngineFixture off(dir, {.page_tokens = kPage, .max_batch_tokens = 48, .prefix_caching = false});
  EngineFixture on(dir, {.page_tokens = kPage, .max_batch_tokens = 48});
  std::mt19937 rng(5);
  const std::vector<int32_t> system = Tokens(23, 1);
  std::vector<std::vector<int32_t>> history(kConversations, system);
  std::set<int> residues;
  for (int turn = 0; turn < kTurns; ++turn) {
    std::vector<std::vector<int32_t>> prompts;
    for (auto& h : history) {
      h = Concat(h, Tokens(1 + static_cast<int>(rng() % 11), static_cast<uint32_t>(rng())));
      prompts.push_back(h);
      if (turn > 0) residues.insert(static_cast<int>(h.size() % kPage));
    }
    const int64_t hits_before = on.engine().prefix_cache().stats().hits;
    const auto want = off.GreedyBatch(prompts, kAnswer);
    const auto got = on.GreedyBatch(prompts, kAnswer);
    for (int c = 0; c < kConversations; ++c) {
      ASSERT_EQ(got[c], want[c]) << GetParam() << " conversation " << c << " turn " << turn;
      history[c] = Concat(history[c], got[c]);
    }
    // From the second turn on, each conversation finds at least its previous turn cached.
    if (turn > 0) {
      EXPECT_GE(on.engine().prefix_cache().stats().hits - hits_before,
                kConversations * static_cast<int64_t>(system.size() / kPage * kPage))
          << "turn " << turn;
    }
  }
  EXPECT_EQ(residues.size(), static_cast<size_t>(kPage)) << "hits ending at every offset";
  EXPECT_EQ(off.engine().prefix_cache().stats().hits, 0);
  ExpectDrained(on.engine());
  ExpectDrained(off.engine());
}

INSTANTIATE_TEST_SUITE_P(Presets, PrefixCacheConversationTest,
                         ::testing::Values("tiny", "tiny-qwen2", "tiny-qwen3", "tiny-mistral",
                                           "tiny-llama3", "qwen3-moe-tiny", "deepseek-v3-tiny"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           std::replace(name.begin(), name.end(), '.', '_');
                           return name;
                         });

// The counters, request by request, equal what a model of the cache predicts: the cache holds
// every page-aligned prefix of what earlier requests computed (prompt and answer but its last
// token); a request hits the longest one it starts with, capped at its length - 1 rounded down
// to a page; queries count its prompt. Prompts extend, cut and vary earlier ones at random
// lengths; the pool is large enough that nothing is evicted.
TEST(PrefixCacheTest, CountersEqualTheExpectedTokens) {
  const std::string dir = testing::SyntheticModelDir("tiny", DType::kBF16);
  constexpr int kPage = 4, kAnswer = 3;
  EngineFixture fx(dir, {.page_tokens = kPage, .max_batch_tokens = 16});
  std::set<std::vector<int32_t>> cached;  // page-aligned prefixes
  std::vector<std::vector<int32_t>> seen = {Tokens(30, 7)};
  std::mt19937 rng(9);
  int64_t queries = 0, hits = 0;
  for (int i = 0; i < 40; ++i) {
    const std::vector<int32_t>& base = seen[rng() % seen.size()];
    std::vector<int32_t> prompt(base.begin(),
                                base.begin() + 1 + static_cast<ptrdiff_t>(rng() % base.size()));
    if (rng() % 2 == 0) {
      prompt =
          Concat(prompt, Tokens(1 + static_cast<int>(rng() % 9), static_cast<uint32_t>(rng())));
    }
    int64_t want = 0;
    for (size_t k = 1; k * kPage <= prompt.size() - 1; ++k) {
      if (cached.count(std::vector<int32_t>(prompt.begin(), prompt.begin() + k * kPage)) == 0)
        break;
      want = static_cast<int64_t>(k) * kPage;
    }
    int64_t hit = -1;
    const Outcome out =
        RunAlone(fx.engine(), "r" + std::to_string(i), prompt, kAnswer, Greedy(), &hit);
    EXPECT_EQ(hit, want) << "request " << i << " of " << prompt.size() << " tokens";
    queries += static_cast<int64_t>(prompt.size());
    hits += want;
    const std::vector<int32_t> computed =
        Concat(prompt, std::vector<int32_t>(out.tokens.begin(), out.tokens.end() - 1));
    for (size_t k = 1; k * kPage <= computed.size(); ++k) {
      cached.insert(std::vector<int32_t>(computed.begin(), computed.begin() + k * kPage));
    }
    seen.push_back(Concat(prompt, out.tokens));
  }
  EXPECT_EQ(fx.engine().prefix_cache().stats().queries, queries);
  EXPECT_EQ(fx.engine().prefix_cache().stats().hits, hits);
  EXPECT_GT(hits, 0);
  EXPECT_EQ(fx.engine().page_pool().evictions(), 0);
  EXPECT_EQ(fx.engine().page_pool().cached_pages(), static_cast<int>(cached.size()));
  // The engine's published snapshot says the same.
  fx.engine().Step();
  const EngineStats stats = fx.engine().stats();
  EXPECT_EQ(stats.prefix_cache.queries, queries);
  EXPECT_EQ(stats.prefix_cache.hits, hits);
  EXPECT_EQ(stats.pages_cached, static_cast<int>(cached.size()));
  EXPECT_EQ(stats.pages_evictable, static_cast<int>(cached.size()));
  ExpectDrained(fx.engine());
}

// A working set three times the cache: 12 prompts of 40 tokens (10 pages of 4, 120 pages) over
// a pool of 40, requested round after round alone and in batches of 3. Tokens equal the
// uncached engine's; pages are evicted and hit again; at the end every page is free or
// evictable.
TEST(PrefixCacheTest, EvictionPressureKeepsTokensAndDrainsThePool) {
  const std::string dir = testing::SyntheticModelDir("tiny", DType::kBF16);
  constexpr int kAnswer = 4;
  EngineFixture off(dir, {.page_tokens = 4, .max_batch_tokens = 64, .prefix_caching = false});
  EngineFixture on(dir, {.page_tokens = 4, .max_batch_tokens = 64, .num_pages = 40});
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t i = 0; i < 12; ++i) prompts.push_back(Tokens(40, 200 + i));
  std::map<size_t, std::vector<int32_t>> want;
  for (size_t i = 0; i < prompts.size(); ++i) want[i] = off.Greedy(prompts[i], kAnswer);
  std::mt19937 rng(3);
  for (int round = 0; round < 4; ++round) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(on.Greedy(prompts[i], kAnswer), want[i]) << "round " << round << " prompt " << i;
      // And a recent one again, which must still be cached.
      if (i > 0 && rng() % 3 == 0) {
        int64_t hit = 0;
        RunAlone(on.engine(), "again" + std::to_string(round) + "-" + std::to_string(i),
                 prompts[i - 1], kAnswer, Greedy(), &hit);
        EXPECT_EQ(hit, 36) << "round " << round << " prompt " << i - 1;
      }
    }
    for (size_t i = 0; i + 3 <= prompts.size(); i += 3) {
      const size_t a = rng() % prompts.size(), b = rng() % prompts.size(), c = i;
      const auto got = on.GreedyBatch({prompts[a], prompts[b], prompts[c]}, kAnswer);
      EXPECT_EQ(got[0], want[a]);
      EXPECT_EQ(got[1], want[b]);
      EXPECT_EQ(got[2], want[c]);
    }
  }
  EXPECT_GT(on.engine().page_pool().evictions(), 0);
  EXPECT_GT(on.engine().prefix_cache().stats().hits, 0);
  EXPECT_LE(on.engine().page_pool().cached_pages(), on.engine().page_pool().capacity());
  ExpectDrained(on.engine());
}

// A request cancelled mid-prefill while it shares pages with a running one: the running one's
// tokens do not change, the shared pages stay cached, the cancelled request's own pages are
// freed, and a later request still hits the shared prefix.
TEST(PrefixCacheTest, CancelMidPrefillOfASharingRequest) {
  const std::string dir = testing::SyntheticModelDir("tiny-llama3", DType::kBF16);
  EngineFixture off(dir, {.page_tokens = 4, .max_batch_tokens = 8, .prefix_caching = false});
  EngineFixture on(dir, {.page_tokens = 4, .max_batch_tokens = 8});
  const std::vector<int32_t> shared = Tokens(24, 11);
  const std::vector<int32_t> a = Concat(shared, Tokens(3, 12));
  const std::vector<int32_t> b = Concat(shared, Tokens(40, 13));
  const std::vector<int32_t> c = Concat(shared, Tokens(5, 14));
  const std::vector<int32_t> want_a = off.Greedy(a, 30);
  const std::vector<int32_t> want_c = off.Greedy(c, 6);

  Engine& engine = on.engine();
  Outcome out_a, out_b;
  ASSERT_TRUE(engine.Submit(MakeRequest("a", a, 30, &out_a, Greedy())).ok());
  for (int i = 0; i < 5; ++i) engine.Step();  // a's prompt (27 tokens) is in, a decodes
  ASSERT_FALSE(out_a.tokens.empty());
  ASSERT_TRUE(engine.Submit(MakeRequest("b", b, 10, &out_b, Greedy())).ok());
  engine.Step();
  engine.Step();  // b shares a's 6 prompt pages and has prefilled some of its own
  EXPECT_EQ(engine.prefix_cache().stats().hits, 24);
  EXPECT_FALSE(out_b.finished);
  EXPECT_TRUE(out_b.tokens.empty());
  engine.Cancel("b");
  engine.RunUntilIdle();
  EXPECT_TRUE(out_b.finished);
  EXPECT_TRUE(out_a.finished);
  EXPECT_EQ(out_a.tokens, want_a);
  ExpectDrained(engine);
  int64_t hit = 0;
  EXPECT_EQ(RunAlone(engine, "c", c, 6, Greedy(), &hit).tokens, want_c);
  EXPECT_EQ(hit, 24);  // c's 7th page differs from a's and b's
  ExpectDrained(engine);
}

// Requests sharing a long prefix under page pressure: preemption releases a sharer's
// references, not the pages others hold; readmission hits its own pages again. Tokens equal a
// roomy uncached engine's.
TEST(PrefixCacheTest, PreemptionWhileSharing) {
  const std::string dir = testing::SyntheticModelDir("tiny", DType::kBF16);
  const std::vector<int32_t> shared = Tokens(21, 31);
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t i = 0; i < 6; ++i) prompts.push_back(Concat(shared, Tokens(1 + i * 3, 40 + i)));
  const int n = 24;
  EngineFixture off(dir, {.page_tokens = 4, .max_batch_tokens = 64, .prefix_caching = false});
  const auto want = off.GreedyBatch(prompts, n);
  // Six sequences of up to 60 tokens (15 pages each, 5 of them shared) in 30 pages.
  EngineFixture on(dir, {.page_tokens = 4, .max_batch_tokens = 64, .num_pages = 30});
  on.Greedy(shared, 1);  // the shared prefix is cached before they come
  const auto got = on.GreedyBatch(prompts, n);
  EXPECT_EQ(got, want);
  EXPECT_GT(on.engine().stats().preemptions, 0);
  // vLLM's counters leave readmissions after preemption out: the first admissions' prompts
  // (and the shared prefix's own run), and their hits of the 5 shared pages.
  int64_t queries = static_cast<int64_t>(shared.size());
  for (const auto& p : prompts) queries += static_cast<int64_t>(p.size());
  EXPECT_EQ(on.engine().prefix_cache().stats().queries, queries);
  EXPECT_EQ(on.engine().prefix_cache().stats().hits, 6 * 20);
  ExpectDrained(on.engine());
}

// A prefill node's request that hits the cache (kPrefillOnly): its held pages start with the
// shared ones and hold, bit for bit, the KV the first request's pages hold; copied to a decode
// engine they give the colocated tokens. The decode engine registers those pages once the
// request is admitted (its KV landed), so the same prompt again asks only for the page past
// its cached ones (the last, partly filled page of [0, n-1)), and still gives those tokens.
TEST(PrefixCacheTest, PrefillOnlyHitsAndRemotePrefillRegistersItsLandedPages) {
  const std::string dir = testing::SyntheticModelDir("tiny-qwen3", DType::kBF16);
  const std::vector<int32_t> prompt = Tokens(26, 51);
  const int n = 8;
  EngineFixture colocated(dir, {.page_tokens = 4, .prefix_caching = false});
  const std::vector<int32_t> want = colocated.Greedy(prompt, n);

  EngineFixture p(dir, {.page_tokens = 4, .max_batch_tokens = 5});
  EngineFixture d(dir, {.page_tokens = 4});
  const std::vector<int32_t> head(prompt.begin(), prompt.end() - 1);  // P prefills [0, n-1)
  std::vector<std::vector<PageId>> held(2);
  for (int run = 0; run < 2; ++run) {
    EngineRequest req;
    req.id = "p" + std::to_string(run);
    req.prompt = head;
    req.kind = RequestKind::kPrefillOnly;
    req.on_output = [&held, run](const RequestOutput& o) {
      if (o.finished) held[run] = o.held_pages;
    };
    ASSERT_TRUE(p.engine().Submit(std::move(req)).ok());
    p.engine().RunUntilIdle();
  }
  // 25 tokens: the second run shares the first 6 pages (24 tokens) and computes the 7th.
  EXPECT_EQ(p.engine().prefix_cache().stats().hits, 24);
  ASSERT_EQ(held[0].size(), 7u);
  ASSERT_EQ(held[1].size(), 7u);
  EXPECT_TRUE(std::equal(held[0].begin(), held[0].begin() + 6, held[1].begin()));
  EXPECT_NE(held[0][6], held[1][6]);
  // Token 24's KV, computed in a chunk of 5 the first time and alone the second.
  const KvLayout& layout = p.engine().kv_layout();
  const uint8_t* base = p.engine().kv_cache().base();
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    for (KvComponent c : layout.components()) {
      for (int h = 0; h < layout.num_kv_heads; ++h) {
        EXPECT_EQ(std::memcmp(base + layout.ElementOffset(layer, held[0][6], c, h, 0),
                              base + layout.ElementOffset(layer, held[1][6], c, h, 0),
                              layout.head_dim * layout.elem_size()),
                  0)
            << "layer " << layer << " head " << h;
      }
    }
  }
  p.engine().ReleaseHeldPages("p0");

  // Two remote requests for the prompt, one after the other: the first gets no cached page
  // and all 7 copied; the second shares D's 6 full pages of [0, 24) and gets only the 7th.
  for (int run = 0; run < 2; ++run) {
    std::vector<PageId> d_pages;
    int cached = -1;
    Outcome got;
    EngineRequest r = MakeRequest("r" + std::to_string(run), prompt, n, &got, Greedy());
    r.kind = RequestKind::kRemotePrefill;
    r.on_pages_allocated = [&](const std::vector<PageId>& pages, int cached_pages) {
      d_pages = pages;
      cached = cached_pages;
    };
    ASSERT_TRUE(d.engine().Submit(std::move(r)).ok());
    d.engine().Step();
    ASSERT_EQ(d_pages.size(), 7u);
    ASSERT_EQ(cached, run == 0 ? 0 : 6);
    for (int layer = 0; layer < layout.num_layers; ++layer) {
      for (size_t j = static_cast<size_t>(cached); j < d_pages.size(); ++j) {
        std::memcpy(d.engine().kv_cache().Block(layer, d_pages[j], false),
                    p.engine().kv_cache().Block(layer, held[1][j], false), layout.block_bytes());
      }
    }
    d.engine().Admit("r" + std::to_string(run));
    d.engine().RunUntilIdle();
    EXPECT_EQ(got.tokens, want) << "run " << run;
    // 26 prompt + 8 generated tokens, 33 computed: 8 full pages registered.
    EXPECT_EQ(d.engine().page_pool().cached_pages(), 8) << "run " << run;
    EXPECT_EQ(d.engine().prefix_cache().stats().queries, 26 * (run + 1));
    EXPECT_EQ(d.engine().prefix_cache().stats().hits, 24 * run);
  }
  p.engine().ReleaseHeldPages("p1");
  p.engine().Step();
  ExpectDrained(p.engine());
  EXPECT_EQ(p.engine().page_pool().cached_pages(), 6);  // the 7th page was computed twice
  ExpectDrained(d.engine());
}

// Speculative decoding over shared pages: rejected drafts truncate only a sequence's own tail
// (never a sealed page), and greedy output equals the uncached engine's without speculation.
TEST(PrefixCacheTest, SpeculativeDecodingOverSharedPages) {
  const std::string target =
      testing::SyntheticModelDir("tiny", {.quiet_from_layer = 2, .quiet_scale = 0.05f});
  const std::string draft = testing::SyntheticModelDir("tiny", {.num_layers = 2});
  const std::vector<int32_t> shared = Tokens(18, 61);
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t i = 0; i < 5; ++i) prompts.push_back(Concat(shared, Tokens(2 + i, 70 + i)));
  EngineFixture off(target, {.page_tokens = 4, .prefix_caching = false});
  const auto want = off.GreedyBatch(prompts, 20);
  EngineFixture on(target, {.page_tokens = 4, .draft_dir = draft, .speculative_tokens = 3});
  on.Greedy(shared, 2);
  EXPECT_EQ(on.GreedyBatch(prompts, 20), want);
  EXPECT_EQ(on.GreedyBatch(prompts, 20), want);  // now every prompt hits its own pages
  EXPECT_GT(on.engine().stats().spec.draft_tokens, on.engine().stats().spec.accepted_tokens);
  EXPECT_GE(on.engine().prefix_cache().stats().hits, 5 * 16 + 5 * 16);
  ExpectDrained(on.engine());
  EXPECT_EQ(on.engine().drafter()->page_pool()->used(), 0);
}

// A speculative sequence that stops on a token the target chose over a rejected draft counts
// that draft's position computed when it finishes (verification did not roll back): the KV
// there is the draft's, not the stop token's, and must never be registered. With pages of one
// token, each continuation (the prompt, the answer up to its stop token, a new turn) is
// checked against an engine without caching or speculation, logprobs bit for bit; the stop
// token is each of the greedy answer's tokens in turn, so some stops fall on rejections.
TEST(PrefixCacheTest, SpeculativeStopRegistersNoRejectedDraft) {
  const std::string target =
      testing::SyntheticModelDir("tiny", {.quiet_from_layer = 2, .quiet_scale = 0.05f});
  const std::string draft = testing::SyntheticModelDir("tiny", {.num_layers = 2});
  EngineFixture off(target, {.page_tokens = 1, .prefix_caching = false});
  EngineFixture on(target, {.page_tokens = 1, .draft_dir = draft, .speculative_tokens = 4});
  const std::vector<int32_t> prompt = Tokens(10, 81);
  const std::vector<int32_t> answer = off.Greedy(prompt, 24);
  SamplingParams params = Greedy();
  params.logprobs = 2;
  int id = 0;
  for (size_t j = 1; j < answer.size(); ++j) {
    if (std::find(answer.begin(), answer.begin() + j, answer[j]) != answer.begin() + j) continue;
    SamplingParams stop = params;
    stop.stop_token_ids = {answer[j]};
    const Outcome stopped = RunAlone(on.engine(), "s" + std::to_string(id++), prompt, 24, stop);
    ASSERT_EQ(stopped.tokens, std::vector<int32_t>(answer.begin(), answer.begin() + j + 1));
    const std::vector<int32_t> next =
        Concat(Concat(prompt, stopped.tokens), Tokens(3, 90 + static_cast<uint32_t>(j)));
    const Outcome want = RunAlone(off.engine(), "w" + std::to_string(id++), next, 4, params);
    int64_t hit = 0;
    const Outcome got = RunAlone(on.engine(), "n" + std::to_string(id++), next, 4, params, &hit);
    EXPECT_GE(hit, static_cast<int64_t>(prompt.size() + j)) << "stop at " << j;
    ExpectSameSamples(got.samples, want.samples, "stop at " + std::to_string(j));
  }
  EXPECT_GT(on.engine().stats().spec.draft_tokens, on.engine().stats().spec.accepted_tokens);
  ExpectDrained(on.engine());
}

}  // namespace
}  // namespace pdserve
