// Speculative decoding with a draft model (engine/draft_model_drafter.h): greedy output
// identical to the target's without speculation, while the draft is accepted often; rejected
// positions rolled back; max_tokens, stop strings, cancels and pages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/draft_model_drafter.h"
#include "engine_test_util.h"
#include "model/synthetic.h"
#include "testing/test_models.h"
#include "testing/test_paths.h"

namespace pdserve {
namespace {

using testing::EngineFixture;
using testing::FixtureOptions;

// The pair: "tiny" with layers 2 and 3 quiet (their output projections x 0.05) is the target;
// "tiny" cut to its first two layers, with the same embedding, final norm and head, drafts it.
std::string SpecTargetDir() {
  return testing::SyntheticModelDir("tiny", {.quiet_from_layer = 2, .quiet_scale = 0.05f});
}
std::string SpecDraftDir() { return testing::SyntheticModelDir("tiny", {.num_layers = 2}); }

std::vector<std::vector<int32_t>> SpecPrompts(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prompts(count);
  for (size_t i = 0; i < prompts.size(); ++i) {
    prompts[i].resize(1 + (i * 13 + rng() % 7) % 45);  // mixed lengths, 1 to 45
    for (int32_t& t : prompts[i]) t = static_cast<int32_t>(3 + rng() % 2000);
  }
  return prompts;
}

FixtureOptions WithDraft(int k, FixtureOptions o = {}) {
  o.draft_dir = SpecDraftDir();
  o.speculative_tokens = k;
  return o;
}

double AcceptanceRate(const Engine& engine) {
  const SpecDecodeStats s = engine.stats().spec;
  return s.draft_tokens == 0 ? 0.0 : static_cast<double>(s.accepted_tokens) / s.draft_tokens;
}

// What the counters must say of any run: each draft's accepted tokens are a prefix of it.
void ExpectConsistentCounters(const Engine& engine, int k) {
  const SpecDecodeStats s = engine.stats().spec;
  ASSERT_EQ(static_cast<int>(s.accepted_per_position.size()), k);
  int64_t sum = 0;
  for (int i = 0; i < k; ++i) {
    sum += s.accepted_per_position[i];
    if (i > 0) {
      EXPECT_LE(s.accepted_per_position[i], s.accepted_per_position[i - 1]);
    }
  }
  EXPECT_EQ(sum, s.accepted_tokens);
  EXPECT_LE(s.accepted_tokens, s.draft_tokens);
  EXPECT_LE(s.draft_tokens, s.drafts * k);
  EXPECT_LE(s.accepted_per_position[0], s.drafts);
}

ModelDir LoadForSpecTest(const std::string& dir) {
  auto loaded = LoadModelDir(dir, {});
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  if (!loaded.ok()) std::abort();
  return std::move(loaded).value();
}

void ExpectNoPages(const Engine& engine) {
  EXPECT_EQ(engine.page_pool().used(), 0);
  ASSERT_NE(engine.drafter(), nullptr);
  // An MTP drafter has no pool of its own (its KV is a layer of the target's pages).
  if (engine.drafter()->page_pool() != nullptr) {
    EXPECT_EQ(engine.drafter()->page_pool()->used(), 0);
  }
}

// The central property: batch-invariant kernels give a verified position the same logits as a
// plain decode step, so greedy output cannot change — alone and in a batch, for every K.
TEST(SpecDecodeTest, GreedyOutputIsIdenticalWithADraftModel) {
  const std::string target = SpecTargetDir();
  const auto prompts = SpecPrompts(8, 5);
  const int n = 64;
  std::vector<std::vector<int32_t>> want;
  {
    EngineFixture plain(target, {});
    want = plain.GreedyBatch(prompts, n);
  }
  for (int k : {1, 3, 5}) {
    {
      EngineFixture fx(target, WithDraft(k));
      for (size_t i = 0; i < 5; ++i) EXPECT_EQ(fx.Greedy(prompts[i], n), want[i]) << "K " << k;
      ExpectNoPages(fx.engine());
      ExpectConsistentCounters(fx.engine(), k);
      const SpecDecodeStats s = fx.engine().stats().spec;
      // Not vacuous: most drafts are accepted, and some are rejected (rollback is exercised).
      EXPECT_GT(AcceptanceRate(fx.engine()), 0.5) << "K " << k;
      EXPECT_LT(s.accepted_tokens, s.draft_tokens) << "K " << k;
      // Fewer target steps than tokens: a step yields 1 + accepted tokens.
      EXPECT_LT(fx.engine().stats().steps, 5 * n) << "K " << k;
      std::printf("K %d alone: %lld drafts, %lld drafted, %lld accepted (%.1f%%), %lld steps\n", k,
                  static_cast<long long>(s.drafts), static_cast<long long>(s.draft_tokens),
                  static_cast<long long>(s.accepted_tokens), 100 * AcceptanceRate(fx.engine()),
                  static_cast<long long>(fx.engine().stats().steps));
    }
    {
      // A batch of 8 of mixed lengths, small pages and a tight budget: drafts, prefill chunks
      // and pages split everywhere.
      EngineFixture fx(target, WithDraft(k, {.page_tokens = 4, .max_batch_tokens = 24}));
      EXPECT_EQ(fx.GreedyBatch(prompts, n), want) << "K " << k;
      ExpectNoPages(fx.engine());
      ExpectConsistentCounters(fx.engine(), k);
      EXPECT_GT(AcceptanceRate(fx.engine()), 0.5) << "K " << k;
    }
  }
}

// A draft model that predicts the target badly changes nothing but the acceptance.
TEST(SpecDecodeTest, APoorDraftModelLeavesTheOutputUnchanged) {
  const std::string target = testing::SyntheticModelDir("tiny");  // no quiet layers
  const auto prompts = SpecPrompts(4, 9);
  EngineFixture plain(target, {});
  const auto want = plain.GreedyBatch(prompts, 32);
  FixtureOptions o = WithDraft(4);
  o.draft_dir = testing::SyntheticModelDir("tiny", {.num_layers = 1});
  EngineFixture fx(target, o);
  EXPECT_EQ(fx.GreedyBatch(prompts, 32), want);
  EXPECT_LT(AcceptanceRate(fx.engine()), 0.5);
  ExpectNoPages(fx.engine());
}

// Speculative pages are taken only when free; preemption under page pressure still gives the
// same tokens, and every page comes back.
TEST(SpecDecodeTest, PagePressureAndPreemptionKeepTheOutput) {
  const std::string target = SpecTargetDir();
  const auto prompts = SpecPrompts(6, 3);
  EngineFixture plain(target, {.page_tokens = 4});
  const auto want = plain.GreedyBatch(prompts, 40);
  EngineFixture tight(target, WithDraft(5, {.page_tokens = 4, .num_pages = 40}));
  EXPECT_EQ(tight.GreedyBatch(prompts, 40), want);
  EXPECT_GT(tight.engine().stats().preemptions, 0);
  ExpectNoPages(tight.engine());
}

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<SampleResult> samples;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  int outputs = 0;
};

std::map<std::string, Collected> RunRequests(Engine& engine, std::vector<EngineRequest> requests) {
  std::map<std::string, Collected> got;
  for (EngineRequest& r : requests) {
    Collected* c = &got[r.id];
    r.on_output = [c](const RequestOutput& o) {
      EXPECT_TRUE(o.status.ok() || o.finish_reason == FinishReason::kCancelled)
          << o.status.ToString();
      c->tokens.insert(c->tokens.end(), o.tokens.begin(), o.tokens.end());
      c->samples.insert(c->samples.end(), o.samples.begin(), o.samples.end());
      c->text += o.text;
      ++c->outputs;
      if (o.finished) c->reason = o.finish_reason;
    };
    EXPECT_TRUE(engine.Submit(std::move(r)).ok());
  }
  engine.RunUntilIdle();
  return got;
}

// A run of accepted tokens that crosses max_tokens or a stop string emits only up to it; the
// logprobs of accepted tokens are the target's; streamed outputs add up to the whole.
TEST(SpecDecodeTest, MaxTokensStopStringsAndLogprobsAsWithoutSpeculation) {
  const std::string target = SpecTargetDir();
  const auto prompts = SpecPrompts(5, 17);
  auto make = [&](const Tokenizer* tok, const std::vector<std::string>& stops) {
    std::vector<EngineRequest> requests;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EngineRequest r;
      r.id = "r" + std::to_string(i);
      r.prompt = prompts[i];
      r.params.temperature = 0;
      r.params.ignore_eos = true;
      r.params.max_tokens = 3 + static_cast<int>(i) * 4;  // 3, 7, 11, 15, 19
      r.params.logprobs = 3;
      if (i < stops.size() && !stops[i].empty()) r.params.stop = {stops[i]};
      (void)tok;
      requests.push_back(std::move(r));
    }
    return requests;
  };
  EngineFixture plain(target, {});
  const auto base = RunRequests(plain.engine(), make(plain.tokenizer(), {}));
  // Stop strings taken from the middle of the plain texts, so they end runs mid-draft.
  std::vector<std::string> stops;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string& t = base.at("r" + std::to_string(i)).text;
    stops.push_back(i % 2 == 1 && t.size() >= 8 ? t.substr(t.size() / 2, 2) : "");
  }
  EngineFixture plain_stops(target, {});
  const auto want = RunRequests(plain_stops.engine(), make(plain_stops.tokenizer(), stops));
  EngineFixture fx(target, WithDraft(5));
  const auto got = RunRequests(fx.engine(), make(fx.tokenizer(), stops));
  int stopped = 0;
  for (const auto& [id, w] : want) {
    const Collected& g = got.at(id);
    EXPECT_EQ(g.tokens, w.tokens) << id;
    EXPECT_EQ(g.text, w.text) << id;
    EXPECT_EQ(g.reason, w.reason) << id;
    stopped += w.reason == FinishReason::kStop;
    ASSERT_EQ(g.samples.size(), w.samples.size()) << id;
    for (size_t j = 0; j < w.samples.size(); ++j) {
      EXPECT_EQ(g.samples[j].token, w.samples[j].token);
      EXPECT_EQ(g.samples[j].logprob, w.samples[j].logprob) << id << " token " << j;
      EXPECT_EQ(g.samples[j].top_logprobs, w.samples[j].top_logprobs) << id << " token " << j;
    }
    // Several tokens per output: fewer outputs than tokens somewhere.
    EXPECT_LE(g.outputs, w.outputs) << id;
  }
  EXPECT_GT(stopped, 0);
  EXPECT_GT(fx.engine().stats().spec.accepted_tokens, 0);
  ExpectNoPages(fx.engine());
}

// Many mixed requests — greedy with speculation, sampled ones without, stop strings, cancels
// at random steps — leave both page pools empty.
TEST(SpecDecodeTest, NoPagesLeakWithCancelsStopsAndRejections) {
  const std::string target = SpecTargetDir();
  EngineFixture fx(target,
                   WithDraft(4, {.page_tokens = 4, .max_batch_tokens = 64, .num_pages = 120}));
  Engine& engine = fx.engine();
  std::mt19937 rng(7);
  const auto prompts = SpecPrompts(40, 23);
  int finished = 0, cancelled = 0;
  for (int round = 0; round < 5; ++round) {
    std::vector<std::string> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EngineRequest r;
      r.id = "m" + std::to_string(round) + "-" + std::to_string(i);
      r.prompt = prompts[i];
      r.params.temperature = rng() % 4 == 0 ? 0.8f : 0.0f;
      r.params.max_tokens = 1 + static_cast<int>(rng() % 40);
      if (rng() % 3 == 0) r.params.stop = {"e", " t"};
      r.on_output = [&finished, &cancelled](const RequestOutput& o) {
        if (!o.finished) return;
        ++finished;
        cancelled += o.finish_reason == FinishReason::kCancelled;
      };
      ids.push_back(r.id);
      ASSERT_TRUE(engine.Submit(std::move(r)).ok());
    }
    for (int step = 0; step < 200 && engine.Step(); ++step) {
      if (rng() % 5 == 0) engine.Cancel(ids[rng() % ids.size()]);
    }
    engine.RunUntilIdle();
  }
  EXPECT_EQ(finished, 5 * 40);
  EXPECT_GT(cancelled, 0);
  EXPECT_GT(engine.stats().spec.accepted_tokens, 0);
  EXPECT_LT(engine.stats().spec.accepted_tokens, engine.stats().spec.draft_tokens);
  ExpectNoPages(engine);
}

// Tokens 2..4 of `count` sampled continuations of one prompt (seeds first_seed, ...): token 1
// comes from the prefill, the others from verification steps (with speculation).
std::vector<std::vector<int32_t>> SampleContinuations(Engine& engine,
                                                      const std::vector<int32_t>& prompt, int count,
                                                      uint64_t first_seed) {
  std::vector<std::vector<int32_t>> tokens(count);
  constexpr int kBatch = 1000;
  for (int begin = 0; begin < count; begin += kBatch) {
    for (int i = begin; i < std::min(count, begin + kBatch); ++i) {
      EngineRequest r;
      r.id = "s" + std::to_string(i);
      r.prompt = prompt;
      r.params.temperature = 0.7f;
      r.params.top_p = 0.9f;
      r.params.seed = first_seed + i;
      r.params.max_tokens = 4;
      r.params.ignore_eos = true;
      std::vector<int32_t>* out = &tokens[i];
      r.on_output = [out](const RequestOutput& o) {
        out->insert(out->end(), o.tokens.begin(), o.tokens.end());
      };
      EXPECT_TRUE(engine.Submit(std::move(r)).ok());
    }
    engine.RunUntilIdle();
  }
  return tokens;
}

// Two-sample chi-square statistic over the values of `a` and `b` (equal sizes); values seen
// fewer than 20 times in both together are pooled into one bin. Returns (statistic, df).
std::pair<double, int> TwoSampleChiSquare(const std::vector<int64_t>& a,
                                          const std::vector<int64_t>& b) {
  std::map<int64_t, std::pair<int, int>> counts;
  for (int64_t v : a) ++counts[v].first;
  for (int64_t v : b) ++counts[v].second;
  double stat = 0.0;
  int bins = 0;
  std::pair<int, int> pooled{0, 0};
  auto add = [&](std::pair<int, int> c) {
    const double d = c.first - c.second;
    stat += d * d / (c.first + c.second);
    ++bins;
  };
  for (const auto& [value, c] : counts) {
    if (c.first + c.second < 20) {
      pooled.first += c.first;
      pooled.second += c.second;
    } else {
      add(c);
    }
  }
  if (pooled.first + pooled.second > 0) add(pooled);
  return {stat, bins - 1};
}

// The chi-square quantile of upper tail 0.001 (Wilson-Hilferty).
double ChiSquareCritical(int df) {
  const double z = 3.0902, k = df;
  const double t = 1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k));
  return k * t * t * t;
}

// 20,000 sampled continuations at temperature 0.7 and top-p 0.9 of `target` with the
// speculation `spec` configures are distributed as 20,000 without it (each position's token,
// and tokens 2-3 together), while at least `min_accepted` of the drafted tokens are accepted
// and no more than 90% (rejections happen).
void ExpectSampledAsTheTargetAlone(const std::string& target, const FixtureOptions& spec,
                                   double min_accepted) {
  const std::vector<int32_t> prompt = {17};
  const int n = 20000;
  EngineFixture plain(target, {});
  const auto want = SampleContinuations(plain.engine(), prompt, n, 1);
  EngineFixture fx(target, spec);
  const auto got = SampleContinuations(fx.engine(), prompt, n, 1000001);
  ExpectNoPages(fx.engine());
  const SpecDecodeStats s = fx.engine().stats().spec;
  EXPECT_GT(static_cast<double>(s.accepted_tokens), min_accepted * s.draft_tokens);
  EXPECT_LT(s.accepted_tokens, s.draft_tokens * 9 / 10);
  std::printf("sampling: %lld drafted, %lld accepted (%.1f%%)\n",
              static_cast<long long>(s.draft_tokens), static_cast<long long>(s.accepted_tokens),
              100.0 * s.accepted_tokens / std::max<int64_t>(s.draft_tokens, 1));
  for (int position = 0; position <= 4; ++position) {  // 4: tokens 2 and 3 together
    std::vector<int64_t> a, b;
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(want[i].size(), 4u);
      ASSERT_EQ(got[i].size(), 4u);
      if (position < 4) {
        a.push_back(want[i][position]);
        b.push_back(got[i][position]);
      } else {  // tokens 2 and 3 together
        a.push_back(int64_t{want[i][1]} * 65536 + want[i][2]);
        b.push_back(int64_t{got[i][1]} * 65536 + got[i][2]);
      }
    }
    const auto [stat, df] = TwoSampleChiSquare(a, b);
    std::printf("position %d: chi-square %.1f, %d degrees of freedom, critical %.1f\n", position,
                stat, df, ChiSquareCritical(df));
    // Token 1 (from the prefill) may be nearly certain; the verified ones must spread.
    if (position > 0) {
      EXPECT_GE(df, 3) << position;
    }
    if (df > 0) {
      EXPECT_LT(stat, ChiSquareCritical(df)) << "position " << position;
    }
  }
}

// The rejection scheme returns the target's distribution with a draft model. A pair with sharp
// distributions (tiny-llama3, its lm_head x 3) so that the test has the power to see a wrong
// scheme (it fails when every draft is kept).
TEST(SpecDecodeTest, SampledContinuationsAreDistributedAsTheTargetsAlone) {
  FixtureOptions with_draft;
  with_draft.draft_dir =
      testing::SyntheticModelDir("tiny-llama3", {.num_layers = 2, .head_scale = 3.0f});
  with_draft.speculative_tokens = 2;
  ExpectSampledAsTheTargetAlone(
      testing::SyntheticModelDir("tiny-llama3",
                                 {.quiet_from_layer = 2, .quiet_scale = 0.3f, .head_scale = 3.0f}),
      with_draft, 1.0 / 3);
}

// The same with DeepSeek-V3's MTP module drafting (its own pair: the module mimics the quieted
// model, tests/engine/mtp_spec_test.cc), so the sampled path of the MTP drafter is covered too.
TEST(SpecDecodeTest, SampledContinuationsWithMtpAreDistributedAsTheTargetsAlone) {
  FixtureOptions with_mtp;
  with_mtp.mtp = true;
  with_mtp.speculative_tokens = 2;
  ExpectSampledAsTheTargetAlone(
      testing::SyntheticModelDir(
          "deepseek-v3-tiny",
          {.quiet_from_layer = 0, .quiet_scale = 0.01f, .head_scale = 3.0f, .mtp_mimic = true}),
      with_mtp, 0.1);
}

// A seeded sampled request gives the same tokens alone and in a batch, with speculation.
TEST(SpecDecodeTest, SeededSampledRequestsAreReproducible) {
  const std::string target = SpecTargetDir();
  const auto prompts = SpecPrompts(8, 31);
  auto run = [&](Engine& engine, const std::vector<size_t>& which) {
    std::vector<EngineRequest> requests;
    for (size_t i : which) {
      EngineRequest r;
      r.id = "q" + std::to_string(i);
      r.prompt = prompts[i];
      r.params.temperature = 0.8f;
      r.params.top_k = 50;
      r.params.seed = 100 + i;
      r.params.max_tokens = 32;
      r.params.ignore_eos = true;
      requests.push_back(std::move(r));
    }
    return RunRequests(engine, std::move(requests));
  };
  EngineFixture alone(target, WithDraft(3));
  std::map<std::string, Collected> first;
  for (size_t i = 0; i < prompts.size(); ++i) first.merge(run(alone.engine(), {i}));
  EngineFixture batched(target, WithDraft(3));
  const auto together = run(batched.engine(), {0, 1, 2, 3, 4, 5, 6, 7});
  for (const auto& [id, c] : first) {
    EXPECT_EQ(together.at(id).tokens, c.tokens) << id;
    EXPECT_EQ(c.tokens.size(), 32u);
  }
  EXPECT_GT(batched.engine().stats().spec.accepted_tokens, 0);
}

TEST(SpecDecodeTest, IncompatibleDraftModelsAreRefusedAtStartUp) {
  auto target = LoadForSpecTest(SpecTargetDir());
  // Another vocabulary size.
  auto other_vocab = LoadForSpecTest(testing::SyntheticModelDir("tiny-qwen2"));
  Status s = CheckDraftCompatible(target.config, target.tokenizer.get(), other_vocab.config,
                                  other_vocab.tokenizer.get());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("vocabulary"), std::string::npos) << s.message();
  EXPECT_FALSE(DraftModelDrafter::Create(std::move(other_vocab.transformer), target.config).ok());
  // The same size, other tokens.
  auto draft = LoadForSpecTest(SpecDraftDir());
  EXPECT_TRUE(CheckDraftCompatible(target.config, target.tokenizer.get(), draft.config,
                                   draft.tokenizer.get())
                  .ok());
  const std::string other_tokens = testing::BinaryPath("test-models/spec-other-tokenizer");
  ASSERT_TRUE(
      WriteSyntheticModel("tiny", other_tokens, /*seed=*/2, DType::kBF16, {.num_layers = 1}).ok());
  auto retokenised = LoadForSpecTest(other_tokens);
  s = CheckDraftCompatible(target.config, target.tokenizer.get(), retokenised.config,
                           retokenised.tokenizer.get());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("token"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace pdserve
