// Engine tests on synthetic models of every supported architecture, checked against the
// independent float64 reference, and on the invariants the disaggregated design relies on:
// batch-, chunk- and page-split invariance, preemption, cancel, deferred admission.
#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "reference_model.h"

namespace pdserve {
namespace {

using testing::EngineFixture;

class EngineVsReferenceTest : public ::testing::TestWithParam<std::string> {};

// Prompts span several pages (page size 4) and chunks (budget 7); greedy tokens must equal the
// float64 reference's and every sampled position's logits agree closely (F32 weights).
TEST_P(EngineVsReferenceTest, GreedyTokensAndLogitsMatchTheReference) {
  const std::string dir = testing::SyntheticModelDir(GetParam(), DType::kF32);
  auto reference = testing::ReferenceModel::Load(dir);
  ASSERT_TRUE(reference.ok()) << reference.status().ToString();
  EngineFixture fx(dir, {.page_tokens = 4, .max_batch_tokens = 7});
  std::mt19937 rng(7);
  for (int len : {1, 5, 13, 22}) {
    std::vector<int32_t> prompt(len);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % reference->config().vocab_size);
    const int n = 6;
    EXPECT_EQ(fx.Greedy(prompt, n), reference->Greedy(prompt, n))
        << GetParam() << " prompt length " << len;
    // Last-position logits, prefilled in chunks of 3 over pages of 4, vs the reference.
    std::vector<double> want = reference->Logits(prompt);
    std::vector<float> got = testing::ForwardLogits(dir, prompt, 4, 3);
    ASSERT_EQ(got.size(), want.size());
    double max_abs = 0, max_err = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      max_abs = std::max(max_abs, std::abs(want[i]));
      max_err = std::max(max_err, std::abs(want[i] - got[i]));
    }
    EXPECT_LT(max_err, 1e-4 * std::max(1.0, max_abs)) << GetParam() << " len " << len;
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, EngineVsReferenceTest,
                         ::testing::Values("tiny", "tiny-qwen2", "tiny-qwen3", "tiny-mistral",
                                           "tiny-llama3"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

int VocabOf(const std::string& dir) {
  auto config = ModelConfig::Load(dir);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? config->vocab_size : 1;
}

std::vector<std::vector<int32_t>> RandomPrompts(int count, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prompts(count);
  for (auto& p : prompts) {
    p.resize(1 + rng() % 40);
    for (int32_t& t : p) t = static_cast<int32_t>(rng() % vocab);
  }
  return prompts;
}

// BF16 weights: batching, chunk budget and page size must not change a single token.
TEST(EngineInvarianceTest, BatchChunkAndPageSplitsGiveIdenticalTokens) {
  const std::string dir = testing::SyntheticModelDir("tiny-qwen2", DType::kBF16);
  auto prompts = RandomPrompts(6, VocabOf(dir), 11);
  const int n = 12;
  // Alone, generous budget.
  std::vector<std::vector<int32_t>> alone;
  {
    EngineFixture fx(dir, {.page_tokens = 16, .max_batch_tokens = 512});
    for (auto& p : prompts) alone.push_back(fx.Greedy(p, n));
  }
  // All at once, in various splits.
  for (auto [page, budget] : {std::pair{16, 512}, {4, 7}, {3, 33}, {8, 1}}) {
    EngineFixture fx(dir, {.page_tokens = page, .max_batch_tokens = budget});
    auto together = fx.GreedyBatch(prompts, n);
    EXPECT_EQ(together, alone) << "page " << page << " budget " << budget;
    EXPECT_EQ(fx.engine().page_pool().used(), 0);
  }
}

// Long prompts make every kernel take its multi-threaded path; the tokens must not change.
TEST(EngineInvarianceTest, ThreadCountDoesNotChangeTokens) {
  const std::string dir = testing::SyntheticModelDir("tiny-llama3", DType::kBF16);
  std::vector<std::vector<int32_t>> prompts = RandomPrompts(3, VocabOf(dir), 21);
  prompts[0].resize(300, 17);
  std::vector<std::vector<int32_t>> one, two;
  {
    EngineFixture fx(dir, {.max_batch_tokens = 256, .threads = 1});
    one = fx.GreedyBatch(prompts, 8);
  }
  {
    EngineFixture fx(dir, {.max_batch_tokens = 256, .threads = 2});
    two = fx.GreedyBatch(prompts, 8);
  }
  EXPECT_EQ(one, two);
}

TEST(EngineInvarianceTest, PreemptionUnderPagePressureReproducesTheSameTokens) {
  const std::string dir = testing::SyntheticModelDir("tiny", DType::kBF16);
  auto prompts = RandomPrompts(5, VocabOf(dir), 3);
  const int n = 20;
  EngineFixture roomy(dir, {.page_tokens = 4, .max_batch_tokens = 64});
  auto want = roomy.GreedyBatch(prompts, n);
  // 24 pages of 4 tokens cannot hold 5 sequences of up to 60 tokens: preemption must happen.
  EngineFixture tight(dir, {.page_tokens = 4, .max_batch_tokens = 64, .num_pages = 24});
  auto got = tight.GreedyBatch(prompts, n);
  EXPECT_EQ(got, want);
  EXPECT_GT(tight.engine().stats().preemptions, 0);
  EXPECT_EQ(tight.engine().page_pool().used(), 0);
}

// The KV cache type follows the weights unless chosen, and a type the cache cannot hold is an
// error when the model is loaded, not a crash in the attention kernel.
TEST(EngineTest, KvCacheDTypeFollowsTheWeightsUnlessChosen) {
  const std::string dir = testing::SyntheticModelDir("tiny", DType::kF32);
  ModelDirOptions options;
  options.load_tokenizer = false;
  auto as_weights = LoadModelDir(dir, options);
  ASSERT_TRUE(as_weights.ok()) << as_weights.status().ToString();
  EXPECT_EQ(as_weights->transformer->kv_dtype(), DType::kF32);
  EXPECT_EQ(as_weights->transformer->MakeKvLayout(4, 16).dtype, DType::kF32);

  options.transformer.kv_dtype = DType::kBF16;
  auto chosen = LoadModelDir(dir, options);
  ASSERT_TRUE(chosen.ok()) << chosen.status().ToString();
  EXPECT_EQ(chosen->transformer->kv_dtype(), DType::kBF16);

  options.transformer.kv_dtype = DType::kF16;
  auto refused = LoadModelDir(dir, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().ToString().find("f16"), std::string::npos)
      << refused.status().ToString();
}

TEST(EngineTest, CancelFreesPagesAndEndsTheRequest) {
  const std::string dir = testing::SyntheticModelDir("tiny", DType::kBF16);
  EngineFixture fx(dir, {.page_tokens = 4, .max_batch_tokens = 16});
  std::vector<RequestOutput> outputs;
  EngineRequest req;
  req.id = "c1";
  req.prompt = std::vector<int32_t>(30, 5);
  req.params.temperature = 0;
  req.params.max_tokens = 1000;
  req.params.ignore_eos = true;
  req.on_output = [&](const RequestOutput& o) { outputs.push_back(o); };
  ASSERT_TRUE(fx.engine().Submit(std::move(req)).ok());
  for (int i = 0; i < 5; ++i) fx.engine().Step();
  EXPECT_GT(fx.engine().page_pool().used(), 0);
  fx.engine().Cancel("c1");
  fx.engine().Step();
  ASSERT_FALSE(outputs.empty());
  EXPECT_TRUE(outputs.back().finished);
  EXPECT_EQ(outputs.back().finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(fx.engine().page_pool().used(), 0);
}

// A prefill node's pages are the source of KV writes that may still be in flight when its
// request is cancelled: the engine keeps them (and reports them) until ReleaseHeldPages.
TEST(EngineTest, CancelledPrefillOnlyKeepsItsPagesUntilReleased) {
  const std::string dir = testing::SyntheticModelDir("tiny", DType::kBF16);
  EngineFixture fx(dir, {.page_tokens = 4, .max_batch_tokens = 8});
  std::vector<RequestOutput> outputs;
  EngineRequest req;
  req.id = "p1";
  req.prompt = std::vector<int32_t>(40, 5);
  req.kind = RequestKind::kPrefillOnly;
  req.on_output = [&](const RequestOutput& o) { outputs.push_back(o); };
  ASSERT_TRUE(fx.engine().Submit(std::move(req)).ok());
  for (int i = 0; i < 2; ++i) fx.engine().Step();  // 16 of 40 tokens prefilled
  const int pinned = fx.engine().page_pool().used();
  ASSERT_GT(pinned, 0);
  fx.engine().Cancel("p1");
  for (int i = 0; i < 3; ++i) fx.engine().Step();
  ASSERT_FALSE(outputs.empty());
  EXPECT_TRUE(outputs.back().finished);
  EXPECT_EQ(outputs.back().finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(static_cast<int>(outputs.back().held_pages.size()), pinned);
  EXPECT_EQ(fx.engine().page_pool().used(), pinned) << "freed while writes may read them";
  fx.engine().ReleaseHeldPages("p1");
  fx.engine().Step();
  EXPECT_EQ(fx.engine().page_pool().used(), 0);
  // Cancelled before its first step: it holds nothing, and the release is a no-op.
  EngineRequest queued;
  queued.id = "p2";
  queued.prompt = std::vector<int32_t>(9, 5);
  queued.kind = RequestKind::kPrefillOnly;
  queued.on_output = [&](const RequestOutput& o) { outputs.push_back(o); };
  ASSERT_TRUE(fx.engine().Submit(std::move(queued)).ok());
  fx.engine().Cancel("p2");
  fx.engine().Step();
  EXPECT_TRUE(outputs.back().held_pages.empty());
  EXPECT_EQ(fx.engine().page_pool().used(), 0);
}

TEST(EngineTest, RejectsBadRequestsWithClearErrors) {
  const std::string dir = testing::SyntheticModelDir("tiny", DType::kBF16);
  EngineFixture fx(dir, {});
  auto submit = [&](std::vector<int32_t> prompt, SamplingParams params) {
    EngineRequest req;
    req.id = "bad";
    req.prompt = std::move(prompt);
    req.params = params;
    req.on_output = [](const RequestOutput&) {};
    return fx.engine().Submit(std::move(req));
  };
  EXPECT_EQ(submit({}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(submit({1, 99999}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(submit({1, -1}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(submit(std::vector<int32_t>(100000, 1), {}).code(), StatusCode::kOutOfRange);
  SamplingParams bad;
  bad.temperature = -1;
  EXPECT_EQ(submit({1}, bad).code(), StatusCode::kInvalidArgument);
}

// A greedy kRemotePrefill request of `n` tokens (eos ignored) whose pages, tokens and end land
// in the caller's variables.
EngineRequest GreedyRemotePrefill(const std::string& id, const std::vector<int32_t>& prompt, int n,
                                  std::vector<PageId>* pages, std::vector<int32_t>* tokens,
                                  bool* finished) {
  EngineRequest r;
  r.id = id;
  r.prompt = prompt;
  r.params.temperature = 0;
  r.params.max_tokens = n;
  r.params.ignore_eos = true;
  r.kind = RequestKind::kRemotePrefill;
  r.on_pages_allocated = [pages](const std::vector<PageId>& p, int) { *pages = p; };
  r.on_output = [tokens, finished](const RequestOutput& o) {
    tokens->insert(tokens->end(), o.tokens.begin(), o.tokens.end());
    *finished = o.finished;
  };
  return r;
}

// The disaggregated flow without a messenger: engine P prefills [0, n-1) with kPrefillOnly,
// its pages are copied into the pages engine D allocated for a kRemotePrefill request, D is
// told Admit — and D's tokens equal a colocated run's.
TEST(EngineTest, PrefillOnlyPlusRemoteAdmissionEqualsColocated) {
  const std::string dir = testing::SyntheticModelDir("tiny-qwen3", DType::kBF16);
  auto prompts = RandomPrompts(3, VocabOf(dir), 5);
  const int n = 10;
  EngineFixture colocated(dir, {.page_tokens = 4, .max_batch_tokens = 64});
  auto want = colocated.GreedyBatch(prompts, n);

  EngineFixture p(dir, {.page_tokens = 4, .max_batch_tokens = 5});
  EngineFixture d(dir, {.page_tokens = 4, .max_batch_tokens = 64});
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].size() < 2) continue;
    std::vector<PageId> d_pages;
    std::vector<int32_t> got;
    bool finished = false;
    ASSERT_TRUE(d.engine()
                    .Submit(GreedyRemotePrefill("r" + std::to_string(i), prompts[i], n, &d_pages,
                                                &got, &finished))
                    .ok());
    d.engine().Step();
    ASSERT_FALSE(d_pages.empty());
    EXPECT_TRUE(got.empty());  // not admitted yet: nothing runs
    EXPECT_EQ(d.engine().stats().awaiting_kv, 1);

    std::vector<PageId> p_pages;
    EngineRequest preq;
    preq.id = "p" + std::to_string(i);
    preq.prompt.assign(prompts[i].begin(), prompts[i].end() - 1);
    preq.kind = RequestKind::kPrefillOnly;
    preq.on_output = [&](const RequestOutput& o) {
      EXPECT_TRUE(o.tokens.empty());  // a prefill node never samples
      if (o.finished) p_pages = o.held_pages;
    };
    ASSERT_TRUE(p.engine().Submit(std::move(preq)).ok());
    p.engine().RunUntilIdle();
    ASSERT_FALSE(p_pages.empty());
    // "Transfer": every layer's block of every page, P -> D.
    const KvLayout& layout = p.engine().kv_layout();
    for (int layer = 0; layer < layout.num_layers; ++layer) {
      for (size_t j = 0; j < p_pages.size(); ++j) {
        std::memcpy(d.engine().kv_cache().Block(layer, d_pages[j], false),
                    p.engine().kv_cache().Block(layer, p_pages[j], false), layout.block_bytes());
      }
    }
    p.engine().ReleaseHeldPages("p" + std::to_string(i));
    p.engine().Step();
    EXPECT_EQ(p.engine().page_pool().used(), 0);
    d.engine().Admit("r" + std::to_string(i));
    d.engine().RunUntilIdle();
    EXPECT_TRUE(finished);
    EXPECT_EQ(got, want[i]) << "prompt " << i;
  }
  EXPECT_EQ(d.engine().page_pool().used(), 0);
}

// A kRemotePrefill request whose KV will never come (no prefill node is usable) is prefilled by
// its own engine, into the pages it holds, chunk by chunk: the colocated tokens, and its pages
// are freed at the end like any request's. Admit afterwards changes nothing.
TEST(EngineTest, RemotePrefillRequestPrefilledLocallyEqualsColocated) {
  const std::string dir = testing::SyntheticModelDir("tiny-qwen3", DType::kBF16);
  auto prompts = RandomPrompts(3, VocabOf(dir), 7);
  const int n = 10;
  EngineFixture colocated(dir, {.page_tokens = 4, .max_batch_tokens = 64});
  auto want = colocated.GreedyBatch(prompts, n);

  EngineFixture d(dir, {.page_tokens = 4, .max_batch_tokens = 5});
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<PageId> d_pages;
    std::vector<int32_t> got;
    bool finished = false;
    ASSERT_TRUE(d.engine()
                    .Submit(GreedyRemotePrefill("r" + std::to_string(i), prompts[i], n, &d_pages,
                                                &got, &finished))
                    .ok());
    d.engine().Step();
    ASSERT_FALSE(d_pages.empty());
    EXPECT_EQ(d.engine().stats().awaiting_kv, 1);
    d.engine().PrefillLocally("r" + std::to_string(i));
    d.engine().Step();
    EXPECT_EQ(d.engine().stats().awaiting_kv, 0);
    d.engine().Admit("r" + std::to_string(i));  // no longer awaiting KV: ignored
    d.engine().RunUntilIdle();
    EXPECT_TRUE(finished);
    EXPECT_EQ(got, want[i]) << "prompt " << i;
    EXPECT_EQ(d.engine().page_pool().used(), 0);
  }
}

// The step announcements and the layer counter the messenger will watch.
TEST(EngineTest, AnnouncesStepsAndCountsLayers) {
  const std::string dir = testing::SyntheticModelDir("tiny", DType::kBF16);
  EngineFixture fx(dir, {.page_tokens = 4, .max_batch_tokens = 6});
  struct Recorder : StepObserver {
    std::vector<std::pair<int64_t, int64_t>> chunks;
    std::vector<int> layers;
    void OnStepScheduled(uint64_t, std::span<const AnnouncedChunk> cs) override {
      for (const auto& c : cs) chunks.emplace_back(c.start, c.count);
    }
    void OnLayerDone(uint64_t, int layer) override { layers.push_back(layer); }
  } recorder;
  fx.engine().SetStepObserver(&recorder);
  auto tokens = fx.Greedy(std::vector<int32_t>(10, 3), 2);
  EXPECT_EQ(tokens.size(), 2u);
  // 10-token prompt in chunks of 6 and 4, then one decode step for the second token.
  EXPECT_EQ(recorder.chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 6}, {6, 4}, {10, 1}}));
  const int layers = fx.engine().model().config().num_layers;
  EXPECT_EQ(static_cast<int>(recorder.layers.size()), 3 * layers);
  EXPECT_EQ(fx.engine().layer_progress(), static_cast<uint64_t>(3 * layers));
  EXPECT_EQ(recorder.layers[layers], 0);
}

}  // namespace
}  // namespace pdserve
