// Speculative decoding with DeepSeek-V3's own MTP module (engine/mtp_drafter.h): greedy output
// identical to the model's without speculation, alone and in a batch, for K = 1, 3, 5, while the
// module's drafts are accepted often; the module's KV lives in the target's pages (layer
// num_layers), so nothing is left held; and the drafts themselves do not depend on the batch.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "model/synthetic.h"
#include "testing/test_models.h"

namespace pdserve {
namespace {

using testing::EngineFixture;
using testing::FixtureOptions;

// The pair (make-model --preset deepseek-v3-tiny --quiet-from-layer 0 --quiet-scale 0.01
// --head-scale 8 --mtp-mimic): every layer adds little, and the MTP module passes the next
// token's embedding to the shared head, so it drafts about what the model says next.
std::string MtpTargetDir() {
  return testing::SyntheticModelDir(
      "deepseek-v3-tiny",
      {.quiet_from_layer = 0, .quiet_scale = 0.01f, .head_scale = 8.0f, .mtp_mimic = true});
}

std::vector<std::vector<int32_t>> MtpPrompts(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prompts(count);
  for (size_t i = 0; i < prompts.size(); ++i) {
    prompts[i].resize(1 + (i * 13 + rng() % 7) % 45);  // mixed lengths, 1 to 45
    for (int32_t& t : prompts[i]) t = static_cast<int32_t>(3 + rng() % 1000);
  }
  return prompts;
}

FixtureOptions WithMtp(int k, FixtureOptions o = {}) {
  o.mtp = true;
  o.speculative_tokens = k;
  return o;
}

double MtpAcceptance(const SpecDecodeStats& s) {
  return s.draft_tokens == 0 ? 0.0 : static_cast<double>(s.accepted_tokens) / s.draft_tokens;
}

TEST(MtpSpecTest, GreedyOutputIsIdenticalWithTheMtpModule) {
  const std::string target = MtpTargetDir();
  const auto prompts = MtpPrompts(8, 5);
  const int n = 64;
  std::vector<std::vector<int32_t>> want;
  {
    EngineFixture plain(target, {});
    want = plain.GreedyBatch(prompts, n);
  }
  for (int k : {1, 3, 5}) {
    SpecDecodeStats alone;
    {
      EngineFixture fx(target, WithMtp(k));
      for (size_t i = 0; i < 5; ++i) EXPECT_EQ(fx.Greedy(prompts[i], n), want[i]) << "K " << k;
      EXPECT_EQ(fx.engine().page_pool().used(), 0);
      ASSERT_NE(fx.engine().drafter(), nullptr);
      EXPECT_EQ(fx.engine().drafter()->page_pool(), nullptr);  // the target's pages hold it
      alone = fx.engine().stats().spec;
      // Not vacuous: many drafts are accepted (46%, 30%, 19% of the drafted tokens for K = 1, 3,
      // 5 on this pair), some are rejected (rollback is exercised), and a step yields more than
      // one token.
      EXPECT_GT(MtpAcceptance(alone), 0.15) << "K " << k;
      EXPECT_LT(alone.accepted_tokens, alone.draft_tokens) << "K " << k;
      EXPECT_LT(fx.engine().stats().steps, 5 * n) << "K " << k;
      std::printf("K %d alone: %lld drafts, %lld drafted, %lld accepted (%.1f%%), %lld steps\n", k,
                  static_cast<long long>(alone.drafts), static_cast<long long>(alone.draft_tokens),
                  static_cast<long long>(alone.accepted_tokens), 100 * MtpAcceptance(alone),
                  static_cast<long long>(fx.engine().stats().steps));
    }
    {
      // A batch of 8 of mixed lengths, small pages and a tight budget: drafts, prefill chunks
      // and pages split everywhere.
      EngineFixture fx(target, WithMtp(k, {.page_tokens = 4, .max_batch_tokens = 24}));
      EXPECT_EQ(fx.GreedyBatch(prompts, n), want) << "K " << k;
      EXPECT_EQ(fx.engine().page_pool().used(), 0);
      const SpecDecodeStats s = fx.engine().stats().spec;
      EXPECT_GT(MtpAcceptance(s), 0.15) << "K " << k;
    }
  }
}

// The drafts are the same bits wherever a sequence runs: alone, or in a batch with others,
// over other pages and chunks, each request drafts and accepts exactly as many tokens.
TEST(MtpSpecTest, DraftsDoNotDependOnTheBatch) {
  const std::string target = MtpTargetDir();
  const auto prompts = MtpPrompts(6, 11);
  std::vector<SpecDecodeStats> alone;
  for (const auto& p : prompts) {
    EngineFixture fx(target, WithMtp(3));
    fx.Greedy(p, 40);
    alone.push_back(fx.engine().stats().spec);
  }
  SpecDecodeStats sum;
  for (const SpecDecodeStats& s : alone) {
    sum.drafts += s.drafts;
    sum.draft_tokens += s.draft_tokens;
    sum.accepted_tokens += s.accepted_tokens;
  }
  EngineFixture batch(target, WithMtp(3, {.page_tokens = 4}));  // budget for every draft
  batch.GreedyBatch(prompts, 40);
  const SpecDecodeStats together = batch.engine().stats().spec;
  EXPECT_EQ(together.draft_tokens, sum.draft_tokens);
  EXPECT_EQ(together.accepted_tokens, sum.accepted_tokens);
  EXPECT_GT(sum.accepted_tokens, 0);
}

// Per-request counters: one request at a time, the differences of the engine's totals.
struct RequestSpec {
  std::vector<int32_t> tokens;
  int64_t draft_tokens = 0;
  int64_t accepted = 0;
  bool operator==(const RequestSpec&) const = default;
};

RequestSpec Delta(const SpecDecodeStats& before, const SpecDecodeStats& after,
                  std::vector<int32_t> tokens) {
  return {std::move(tokens), after.draft_tokens - before.draft_tokens,
          after.accepted_tokens - before.accepted_tokens};
}

// The disaggregated flow without a messenger (as engine_test's): engine P, with the MTP KV
// layer but drafting nothing, prefills [0, n-1) — the module's KV too — and hands on the hidden
// state of position n-2; its pages, every layer's, are copied into D's and D is admitted with
// that state. D then drafts and accepts exactly as many tokens as a colocated engine, request by
// request; with the state corrupted, the tokens stay (verification hides it) but the counts
// move — what the acceptance-parity check of a real 1P1D run relies on.
std::vector<RequestSpec> RunDisaggregated(const std::string& target,
                                          const std::vector<std::vector<int32_t>>& prompts, int n,
                                          bool corrupt) {
  FixtureOptions p_options = WithMtp(0, {.page_tokens = 4, .max_batch_tokens = 5});
  EngineFixture p(target, p_options);
  EXPECT_EQ(p.engine().drafter(), nullptr);  // a prefill node never drafts
  EngineFixture d(target, WithMtp(3, {.page_tokens = 4}));
  std::vector<RequestSpec> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    std::vector<PageId> d_pages;
    std::vector<int32_t> got;
    bool finished = false;
    EngineRequest r;
    r.id = id;
    r.prompt = prompts[i];
    r.params.temperature = 0;
    r.params.max_tokens = n;
    r.params.ignore_eos = true;
    r.kind = RequestKind::kRemotePrefill;
    r.on_pages_allocated = [&](const std::vector<PageId>& pages, int) { d_pages = pages; };
    r.on_output = [&](const RequestOutput& o) {
      got.insert(got.end(), o.tokens.begin(), o.tokens.end());
      finished = o.finished;
    };
    EXPECT_TRUE(d.engine().Submit(std::move(r)).ok());
    d.engine().Step();
    EXPECT_FALSE(d_pages.empty());

    std::vector<PageId> p_pages;
    std::vector<float> hidden;
    EngineRequest pr;
    pr.id = "p" + id;
    pr.prompt.assign(prompts[i].begin(), prompts[i].end() - 1);
    pr.kind = RequestKind::kPrefillOnly;
    pr.on_output = [&](const RequestOutput& o) {
      if (!o.finished) return;
      p_pages = o.held_pages;
      hidden = o.mtp_hidden;
    };
    EXPECT_TRUE(p.engine().Submit(std::move(pr)).ok());
    p.engine().RunUntilIdle();
    EXPECT_EQ(hidden.size(), 128u);  // deepseek-v3-tiny's hidden size
    const KvLayout& layout = p.engine().kv_layout();
    EXPECT_EQ(layout.num_layers, 4);  // 3 decoder layers and the MTP module's
    for (int layer = 0; layer < layout.num_layers; ++layer) {
      for (size_t j = 0; j < p_pages.size(); ++j) {
        std::memcpy(d.engine().kv_cache().base() + layout.BlockOffset(layer, d_pages[j]),
                    p.engine().kv_cache().base() + layout.BlockOffset(layer, p_pages[j]),
                    layout.block_bytes());
      }
    }
    p.engine().ReleaseHeldPages("p" + id);
    p.engine().Step();
    if (corrupt) {
      for (float& x : hidden) x = -x;
    }
    const SpecDecodeStats before = d.engine().stats().spec;
    d.engine().Admit(id, hidden);
    d.engine().RunUntilIdle();
    EXPECT_TRUE(finished);
    out.push_back(Delta(before, d.engine().stats().spec, got));
  }
  EXPECT_EQ(p.engine().page_pool().used(), 0);
  EXPECT_EQ(d.engine().page_pool().used(), 0);
  return out;
}

TEST(MtpSpecTest, DisaggregatedDraftsAndAcceptsExactlyAsColocated) {
  const std::string target = MtpTargetDir();
  auto prompts = MtpPrompts(6, 21);
  std::erase_if(prompts, [](const std::vector<int32_t>& p) { return p.size() < 2; });
  ASSERT_GE(prompts.size(), 4u);
  const int n = 40;
  std::vector<RequestSpec> colocated;
  {
    EngineFixture fx(target, WithMtp(3));
    for (const auto& prompt : prompts) {
      const SpecDecodeStats before = fx.engine().stats().spec;
      std::vector<int32_t> tokens = fx.Greedy(prompt, n);
      colocated.push_back(Delta(before, fx.engine().stats().spec, std::move(tokens)));
    }
  }
  const std::vector<RequestSpec> disaggregated = RunDisaggregated(target, prompts, n, false);
  ASSERT_EQ(disaggregated.size(), colocated.size());
  for (size_t i = 0; i < colocated.size(); ++i) {
    EXPECT_EQ(disaggregated[i].tokens, colocated[i].tokens) << "prompt " << i;
    EXPECT_EQ(disaggregated[i].draft_tokens, colocated[i].draft_tokens) << "prompt " << i;
    EXPECT_EQ(disaggregated[i].accepted, colocated[i].accepted) << "prompt " << i;
    EXPECT_GT(colocated[i].accepted, 0) << "prompt " << i;
  }
  // A corrupted context changes no token, only the acceptance: parity catches it.
  const std::vector<RequestSpec> corrupted = RunDisaggregated(target, prompts, n, true);
  int64_t moved = 0;
  for (size_t i = 0; i < colocated.size(); ++i) {
    EXPECT_EQ(corrupted[i].tokens, colocated[i].tokens) << "prompt " << i;
    moved += corrupted[i].accepted != colocated[i].accepted;
  }
  EXPECT_GT(moved, 0) << "the hidden state handed on does not matter to the drafts";
}

// ---- Prefix caching with the MTP KV layer (engine/prefix_cache.h: a lookahead of one token,
// and pages sealed below Sequence::mtp_final).

std::vector<int32_t> MtpTokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(3 + rng() % 1000);
  return t;
}

std::vector<int32_t> Joined(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Requests that reuse one another, run one at a time with 4-token pages, each handed to
// `after` with its prompt and answer: a conversation (each turn is the history — earlier
// prompts and answers — and a new message of 1 to 4 tokens); prompts of 9 to 12 tokens (every
// residue modulo the page) twice each; and pairs of prompts that share 8 to 11 tokens and part
// there (at 8: right after a page, where only the lookahead tells the two apart).
void RunCachingWorkload(
    EngineFixture& fx, int n,
    const std::function<void(const std::vector<int32_t>& prompt, const RequestSpec& got)>& after) {
  auto run = [&](const std::vector<int32_t>& prompt) {
    const SpecDecodeStats before = fx.engine().stats().spec;
    std::vector<int32_t> tokens = fx.Greedy(prompt, n);
    const RequestSpec got = Delta(before, fx.engine().stats().spec, std::move(tokens));
    after(prompt, got);
    return got.tokens;
  };
  std::vector<int32_t> history = MtpTokens(9, 1);
  for (int turn = 0; turn < 4; ++turn) {
    history = Joined(history, MtpTokens(1 + turn, 10 + static_cast<uint32_t>(turn)));
    history = Joined(history, run(history));
  }
  for (int length = 9; length <= 12; ++length) {
    const std::vector<int32_t> prompt = MtpTokens(length, 100 + static_cast<uint32_t>(length));
    run(prompt);
    run(prompt);
  }
  for (int shared = 8; shared <= 11; ++shared) {
    const std::vector<int32_t> head = MtpTokens(shared, 200 + static_cast<uint32_t>(shared));
    const std::vector<int32_t> a = MtpTokens(5, 300 + static_cast<uint32_t>(shared));
    const std::vector<int32_t> b = MtpTokens(5, 400 + static_cast<uint32_t>(shared));
    ASSERT_NE(a[0], b[0]);
    run(Joined(head, a));
    run(Joined(head, b));
  }
}

// Caching on gives, request by request, the tokens and the drafted and accepted counts of
// caching off, for K = 1 and 3 (verification keeps the tokens right whatever the drafts; the
// counts show the drafts). On this pair the drafts hardly depend on the module's KV — a wrong
// entry in a shared page (no lookahead, a rejected draft's entry sealed) moved no count — so
// the next test compares the pages' bits.
TEST(MtpSpecTest, PrefixCachingDraftsAndAcceptsExactlyAsWithoutIt) {
  const std::string target = MtpTargetDir();
  const int n = 8;
  for (int k : {1, 3}) {
    std::vector<RequestSpec> want, got;
    std::vector<int64_t> hits;
    {
      EngineFixture off(target, WithMtp(k, {.page_tokens = 4, .prefix_caching = false}));
      RunCachingWorkload(
          off, n, [&](const std::vector<int32_t>&, const RequestSpec& r) { want.push_back(r); });
      EXPECT_EQ(off.engine().prefix_cache().stats().hits, 0);
    }
    EngineFixture on(target, WithMtp(k, {.page_tokens = 4}));
    std::set<size_t> residues;
    int64_t last_hits = 0;
    RunCachingWorkload(on, n, [&](const std::vector<int32_t>& prompt, const RequestSpec& r) {
      got.push_back(r);
      const int64_t total = on.engine().prefix_cache().stats().hits;
      hits.push_back(total - last_hits);
      last_hits = total;
      residues.insert(prompt.size() % 4);
    });
    ASSERT_EQ(got.size(), want.size());
    int64_t accepted = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "K " << k << " request " << i;
      EXPECT_EQ(got[i].draft_tokens, want[i].draft_tokens) << "K " << k << " request " << i;
      EXPECT_EQ(got[i].accepted, want[i].accepted) << "K " << k << " request " << i;
      accepted += got[i].accepted;
    }
    EXPECT_GT(accepted, 0) << "K " << k;
    EXPECT_EQ(residues.size(), 4u);
    // Hits: the conversation's later turns, every repeated prompt, and the second of each pair
    // (the shared pages; at 8 shared tokens only the first page, whose lookahead they share).
    int with_hits = 0;
    for (int64_t h : hits) with_hits += h > 0;
    EXPECT_GE(with_hits, 3 + 4 + 4) << "K " << k;
    const PagePool& pool = on.engine().page_pool();
    EXPECT_EQ(pool.used(), 0);
    EXPECT_GT(pool.cached_pages(), 0);
    EXPECT_EQ(pool.cached_pages(), pool.evictable_pages());
  }
}

// Every page the cache holds has, in every layer (the MTP module's included), the bits a
// prefill of its tokens computes. After each request of the workload (drafts with K = 3,
// caching on), a prefill-only request of everything it holds (prompt and answer) shares the
// pages cached for it; they, and the pages after them, are compared with an engine's without
// caching. A page sealed with an entry of a rejected draft, or registered under a hash that
// does not cover its last slot's next token, differs in the MTP layer.
TEST(MtpSpecTest, EveryCachedPageHoldsWhatAPrefillComputes) {
  const std::string target = MtpTargetDir();
  EngineFixture on(target, WithMtp(3, {.page_tokens = 4}));
  EngineFixture ref(target, WithMtp(0, {.page_tokens = 4, .prefix_caching = false}));
  int id = 0;
  int64_t compared_hit_pages = 0;
  auto prefill = [&id](Engine& engine, const std::vector<int32_t>& prompt) {
    std::vector<PageId> held;
    EngineRequest r;
    r.id = "p" + std::to_string(id++);
    r.prompt = prompt;
    r.kind = RequestKind::kPrefillOnly;
    r.on_output = [&held](const RequestOutput& o) {
      EXPECT_TRUE(o.status.ok()) << o.status.ToString();
      if (o.finished) held = o.held_pages;
    };
    const std::string rid = r.id;
    EXPECT_TRUE(engine.Submit(std::move(r)).ok());
    engine.RunUntilIdle();
    return std::make_pair(rid, held);
  };
  RunCachingWorkload(on, 8, [&](const std::vector<int32_t>& prompt, const RequestSpec& r) {
    const std::vector<int32_t> all = Joined(prompt, r.tokens);
    const int64_t hits_before = on.engine().prefix_cache().stats().hits;
    const auto [on_id, on_pages] = prefill(on.engine(), all);
    const int64_t hit_pages = (on.engine().prefix_cache().stats().hits - hits_before) / 4;
    const auto [ref_id, ref_pages] = prefill(ref.engine(), all);
    ASSERT_EQ(on_pages.size(), ref_pages.size());
    // The pages whose every MTP entry is final after a prefill of `all`: below its last token.
    const size_t final_pages = (all.size() - 1) / 4;
    EXPECT_GE(hit_pages, 1) << all.size() << " tokens";
    compared_hit_pages += hit_pages;
    const KvLayout& layout = on.engine().kv_layout();
    for (int layer = 0; layer < layout.num_layers; ++layer) {
      for (size_t j = 0; j < final_pages; ++j) {
        EXPECT_EQ(
            std::memcmp(on.engine().kv_cache().base() + layout.BlockOffset(layer, on_pages[j]),
                        ref.engine().kv_cache().base() + layout.BlockOffset(layer, ref_pages[j]),
                        layout.block_bytes()),
            0)
            << all.size() << " tokens, layer " << layer << ", page " << j << " ("
            << (static_cast<int64_t>(j) < hit_pages ? "shared" : "computed") << ")";
      }
    }
    on.engine().ReleaseHeldPages(on_id);
    ref.engine().ReleaseHeldPages(ref_id);
    on.engine().Step();
    ref.engine().Step();
  });
  EXPECT_GT(compared_hit_pages, 20);
  EXPECT_EQ(on.engine().page_pool().used(), 0);
  EXPECT_EQ(ref.engine().page_pool().used(), 0);
}

// A model without an MTP module cannot be loaded for MTP drafting.
TEST(MtpSpecTest, AModelWithoutAnMtpModuleIsRefused) {
  ModelDirOptions o;
  o.load_tokenizer = false;
  o.transformer.mtp_kv = true;
  auto loaded = LoadModelDir(testing::SyntheticModelDir("deepseek-v2-lite-tiny"), o);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("MTP module"), std::string::npos)
      << loaded.status().ToString();
}

}  // namespace
}  // namespace pdserve
