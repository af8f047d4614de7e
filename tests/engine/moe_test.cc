// The mixture-of-experts feed-forward (model/moe_mlp.h) and, for DeepSeek, latent attention
// (model/mla_attention.h) on the tiny presets: what the router chooses (its trace), and the
// invariances the disaggregated design relies on — a
// sequence's logits and expert choices are the same bits alone, in a batch of mixed lengths,
// prefilled in chunks, on more threads, and its greedy tokens the same through the engine's
// batching, chunking and paging. TP lives in tp_forward_test.cc; the comparison with an
// independent float64 reference in hf_reference_test.cc.
#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "model/model_dir.h"

namespace pdserve {
namespace {

using testing::EngineFixture;

constexpr const char* kPreset = "qwen3-moe-tiny";

std::vector<int32_t> RandomTokensFrom(std::mt19937& rng, int n, int vocab) {
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

ModelDir LoadModel(const std::string& path, int threads = 1) {
  ModelDirOptions options;
  options.load_tokenizer = false;
  options.transformer.threads = threads;
  auto dir = LoadModelDir(path, options);
  EXPECT_TRUE(dir.ok()) << dir.status().ToString();
  return std::move(*dir);
}

// One sequence's rows in a pass: its last logits and, per MoE layer, its rows' choices.
struct SequenceResult {
  std::vector<float> logits;
  std::map<int, std::vector<int32_t>> experts;  // layer -> [positions][k], all positions so far
  std::map<int, std::vector<float>> weights;
};

// Runs `sequences` through a fresh model and cache, prefilled in chunks of at most `chunk`
// tokens, all sequences' chunks together in each pass; returns what `watched` saw.
SequenceResult RunBatch(const std::string& path, const std::vector<std::vector<int32_t>>& sequences,
                        int chunk, size_t watched, int threads = 1) {
  ModelDir dir = LoadModel(path, threads);
  Transformer& model = *dir.transformer;
  constexpr int kPageTokens = 4;
  int total_pages = 0;
  std::vector<std::vector<PageId>> tables;
  for (const auto& s : sequences) {
    const int pages = static_cast<int>((s.size() + kPageTokens - 1) / kPageTokens);
    std::vector<PageId> table(pages);
    for (int i = 0; i < pages; ++i) table[i] = total_pages + pages - 1 - i;
    total_pages += pages;
    tables.push_back(table);
  }
  auto cache = KvCache::Create(model.MakeKvLayout(total_pages, kPageTokens));
  EXPECT_TRUE(cache.ok());
  RoutingTrace trace;
  model.set_routing_trace(&trace);
  SequenceResult result;
  std::vector<size_t> done(sequences.size(), 0);
  for (bool more = true; more;) {
    more = false;
    std::vector<SequenceChunk> chunks;
    std::vector<size_t> owner;
    for (size_t i = 0; i < sequences.size(); ++i) {
      if (done[i] == sequences[i].size()) continue;
      const size_t n = std::min<size_t>(chunk, sequences[i].size() - done[i]);
      chunks.push_back({.tokens = std::span<const int32_t>(sequences[i]).subspan(done[i], n),
                        .start = static_cast<int64_t>(done[i]),
                        .pages = tables[i],
                        .want_logits = done[i] + n == sequences[i].size()});
      owner.push_back(i);
    }
    if (chunks.empty()) break;
    more = true;
    std::vector<float> logits;
    Status s = model.Forward(chunks, **cache, &logits);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) return result;
    // The watched sequence's rows of this pass, and its logits when it finished.
    int row = 0, logit_row = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      const int n = static_cast<int>(chunks[c].tokens.size());
      if (owner[c] == watched) {
        for (const RoutingTrace::Layer& l : trace.layers) {
          const int k = l.experts_per_token;
          auto& e = result.experts[l.layer];
          auto& w = result.weights[l.layer];
          e.insert(e.end(), l.experts.begin() + row * k, l.experts.begin() + (row + n) * k);
          w.insert(w.end(), l.weights.begin() + row * k, l.weights.begin() + (row + n) * k);
        }
        if (chunks[c].want_logits) {
          const int vocab = model.config().vocab_size;
          result.logits.assign(logits.begin() + logit_row * vocab,
                               logits.begin() + (logit_row + 1) * vocab);
        }
      }
      if (chunks[c].want_logits) ++logit_row;
      row += n;
      done[owner[c]] += n;
    }
  }
  return result;
}

TEST(MoeTest, RouterChoosesDistinctExpertsWithRenormalisedWeights) {
  const std::string path = testing::SyntheticModelDir(kPreset, DType::kBF16);
  ModelDir dir = LoadModel(path);
  const MoeConfig& moe = dir.config.moe;
  ASSERT_EQ(moe.num_experts, 8);
  ASSERT_EQ(moe.experts_per_token, 2);
  std::mt19937 rng(3);
  const std::vector<int32_t> prompt = RandomTokensFrom(rng, 40, dir.config.vocab_size);
  SequenceResult r = RunBatch(path, {prompt}, 64, 0);
  // Layers 0, 1 and 3 are MoE; layer 2 is in mlp_only_layers.
  std::vector<int> layers;
  for (const auto& [layer, _] : r.experts) layers.push_back(layer);
  EXPECT_EQ(layers, (std::vector<int>{0, 1, 3}));
  std::set<int32_t> used;
  for (const auto& [layer, experts] : r.experts) {
    const std::vector<float>& weights = r.weights[layer];
    ASSERT_EQ(experts.size(), prompt.size() * 2);
    for (size_t p = 0; p < prompt.size(); ++p) {
      const int32_t a = experts[2 * p], b = experts[2 * p + 1];
      EXPECT_NE(a, b);
      EXPECT_TRUE(a >= 0 && a < 8 && b >= 0 && b < 8);
      EXPECT_GE(weights[2 * p], weights[2 * p + 1]) << "the router's order is by probability";
      EXPECT_NEAR(weights[2 * p] + weights[2 * p + 1], 1.0f, 1e-6f) << "norm_topk_prob";
      used.insert(a);
      used.insert(b);
    }
  }
  EXPECT_GE(used.size(), 6u) << "random routing over 120 rows should reach most experts";
}

class MoeInvarianceTest : public ::testing::TestWithParam<std::string> {};

// A sequence's logits and choices: the same bits alone in one chunk, chunked among seven other
// sequences of mixed lengths, and with two threads.
TEST_P(MoeInvarianceTest, BatchChunkAndThreadsDoNotChangeABit) {
  const std::string path = testing::SyntheticModelDir(GetParam(), DType::kBF16);
  const int vocab = LoadModel(path).config.vocab_size;
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> batch;
  for (int len : {23, 1, 7, 40, 3, 17, 9, 30}) batch.push_back(RandomTokensFrom(rng, len, vocab));
  const SequenceResult alone = RunBatch(path, {batch[0]}, 1024, 0);
  ASSERT_FALSE(alone.logits.empty());
  for (int chunk : {1, 5, 8}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const SequenceResult together = RunBatch(path, batch, chunk, 0);
    ASSERT_EQ(together.logits.size(), alone.logits.size());
    EXPECT_EQ(std::memcmp(together.logits.data(), alone.logits.data(),
                          alone.logits.size() * sizeof(float)),
              0);
    EXPECT_EQ(together.experts, alone.experts);
    EXPECT_EQ(together.weights, alone.weights);
  }
  const SequenceResult threaded = RunBatch(path, batch, 8, 0, /*threads=*/2);
  EXPECT_EQ(
      std::memcmp(threaded.logits.data(), alone.logits.data(), alone.logits.size() * sizeof(float)),
      0);
  EXPECT_EQ(threaded.experts, alone.experts);
}

// Through the engine: batching, the chunk budget and the page size change no token, and every
// page comes back.
TEST_P(MoeInvarianceTest, EngineSplitsGiveIdenticalTokens) {
  const std::string path = testing::SyntheticModelDir(GetParam(), DType::kBF16);
  const int vocab = LoadModel(path).config.vocab_size;
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {12, 1, 33, 5, 20, 8}) prompts.push_back(RandomTokensFrom(rng, len, vocab));
  const int n = 10;
  std::vector<std::vector<int32_t>> alone;
  {
    EngineFixture fx(path, {.page_tokens = 16, .max_batch_tokens = 512});
    for (const auto& p : prompts) alone.push_back(fx.Greedy(p, n));
  }
  for (auto [page, budget] : {std::pair{16, 512}, {4, 7}, {3, 1}}) {
    EngineFixture fx(path, {.page_tokens = page, .max_batch_tokens = budget});
    EXPECT_EQ(fx.GreedyBatch(prompts, n), alone) << "page " << page << " budget " << budget;
    EXPECT_EQ(fx.engine().page_pool().used(), 0);
  }
}

// DeepSeek's: MLA over a latent cache, grouped noaux_tc routing with shared experts (V3),
// greedy softmax routing (V2).
INSTANTIATE_TEST_SUITE_P(Presets, MoeInvarianceTest,
                         ::testing::Values("qwen3-moe-tiny", "deepseek-v3-tiny",
                                           "deepseek-v2-lite-tiny"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace pdserve
