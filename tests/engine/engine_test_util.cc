#include "engine_test_util.h"

#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "engine/draft_model_drafter.h"
#include "testing/test_paths.h"

namespace pdserve::testing {

nlohmann::json ReadGolden() {
  std::ifstream in(SharedPath(std::string(kGoldenModel) + "/golden.json"));
  return nlohmann::json::parse(in);
}

EngineFixture::EngineFixture(const std::string& model_dir, const FixtureOptions& options) {
  ModelDirOptions mo;
  mo.transformer.threads = options.threads;
  mo.weight_format = options.weight_format;
  mo.transformer.mtp_kv = options.mtp;
  auto dir = LoadModelDir(model_dir, mo);
  if (!dir.ok()) {
    ADD_FAILURE() << dir.status().ToString();
    std::abort();
  }
  dir_ = std::move(dir).value();
  EngineOptions eo;
  eo.page_tokens = options.page_tokens;
  eo.num_pages = options.num_pages;
  eo.kv_cache_bytes = size_t{64} << 20;
  eo.scheduler.max_batch_tokens = options.max_batch_tokens;
  eo.prefix_caching = options.prefix_caching;
  std::unique_ptr<Drafter> drafter;
  if (options.mtp) eo.num_speculative_tokens = options.speculative_tokens;
  if (!options.draft_dir.empty()) {
    mo.load_tokenizer = false;
    auto draft = LoadModelDir(options.draft_dir, mo);
    if (!draft.ok()) {
      ADD_FAILURE() << draft.status().ToString();
      std::abort();
    }
    auto made = DraftModelDrafter::Create(std::move(draft->transformer), dir_.config);
    if (!made.ok()) {
      ADD_FAILURE() << made.status().ToString();
      std::abort();
    }
    drafter = std::move(made).value();
    eo.num_speculative_tokens = options.speculative_tokens;
  }
  auto engine =
      Engine::Create(std::move(dir_.transformer), dir_.tokenizer.get(), eo, std::move(drafter));
  if (!engine.ok()) {
    ADD_FAILURE() << engine.status().ToString();
    std::abort();
  }
  engine_ = std::move(engine).value();
}

std::vector<int32_t> EngineFixture::Greedy(const std::vector<int32_t>& prompt, int n) {
  return GreedyBatch({prompt}, n)[0];
}

std::vector<std::vector<int32_t>> EngineFixture::GreedyBatch(
    const std::vector<std::vector<int32_t>>& prompts, int n) {
  std::vector<std::vector<int32_t>> tokens(prompts.size());
  std::vector<bool> finished(prompts.size(), false);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest req;
    req.id = "t" + std::to_string(next_id_++);
    req.prompt = prompts[i];
    req.params.temperature = 0;
    req.params.max_tokens = n;
    req.params.ignore_eos = true;
    req.on_output = [&tokens, &finished, i](const RequestOutput& o) {
      EXPECT_TRUE(o.status.ok()) << o.status.ToString();
      tokens[i].insert(tokens[i].end(), o.tokens.begin(), o.tokens.end());
      if (o.finished) finished[i] = true;
    };
    Status s = engine_->Submit(std::move(req));
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  engine_->RunUntilIdle();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_TRUE(finished[i]) << "request " << i;
  return tokens;
}

std::vector<float> ChunkedLogits(ModelDir& dir, const std::vector<int32_t>& prompt, int page_tokens,
                                 int chunk) {
  Transformer& model = *dir.transformer;
  const int pages = static_cast<int>((prompt.size() + page_tokens - 1) / page_tokens);
  auto cache = KvCache::Create(model.MakeKvLayout(pages, page_tokens));
  EXPECT_TRUE(cache.ok());
  if (!cache.ok()) return {};
  std::vector<PageId> table(pages);
  for (int i = 0; i < pages; ++i) table[i] = pages - 1 - i;  // scattered, not in order
  std::vector<float> logits;
  for (size_t start = 0; start < prompt.size(); start += chunk) {
    const size_t count = std::min<size_t>(chunk, prompt.size() - start);
    SequenceChunk c{.tokens = std::span<const int32_t>(prompt).subspan(start, count),
                    .start = static_cast<int64_t>(start),
                    .pages = table,
                    .want_logits = start + count == prompt.size()};
    Status s = model.Forward(std::span<const SequenceChunk>(&c, 1), **cache, &logits);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return logits;
}

std::vector<float> ForwardLogits(const std::string& model_dir, const std::vector<int32_t>& prompt,
                                 int page_tokens, int chunk) {
  ModelDirOptions mo;
  mo.load_tokenizer = false;
  auto dir = LoadModelDir(model_dir, mo);
  EXPECT_TRUE(dir.ok()) << dir.status().ToString();
  if (!dir.ok()) return {};
  return ChunkedLogits(*dir, prompt, page_tokens, chunk);
}

ModelDir LoadForLogits(const std::string& model_dir, std::optional<DType> dtype,
                       std::optional<DType> format, std::optional<DType> head) {
  ModelDirOptions options;
  options.load_tokenizer = false;
  options.weight_dtype = dtype;
  options.weight_format = format;
  options.head_format = head;
  options.transformer.threads = 1;
  auto dir = LoadModelDir(model_dir, options);
  EXPECT_TRUE(dir.ok()) << dir.status().ToString();
  return std::move(*dir);
}

std::vector<int32_t> SeededTokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

}  // namespace pdserve::testing
