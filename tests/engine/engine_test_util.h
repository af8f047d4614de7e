// Test helpers for the engine: a fixture that runs greedy requests to completion (synthetic
// model directories come from testing/test_models.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "engine/engine.h"
#include "model/model_dir.h"
#include "testing/test_models.h"

namespace pdserve::testing {

// The shared model whose golden.json holds reference greedy continuations (golden tests).
inline constexpr char kGoldenModel[] = "models/stories260K";
// kGoldenModel's golden.json: its cases (prompts and their greedy continuations, logits).
nlohmann::json ReadGolden();

struct FixtureOptions {
  int page_tokens = 16;
  int max_batch_tokens = 512;
  int num_pages = 0;                                  // 0: 64 MiB worth
  int threads = 0;                                    // 0: the OpenMP default (OMP_NUM_THREADS)
  std::optional<DType> weight_format = std::nullopt;  // `--weights`: the checkpoint's own
  // Speculative decoding with this draft model (engine/draft_model_drafter.h), when not empty.
  std::string draft_dir = {};
  int speculative_tokens = 3;
  // Speculative decoding with the model's own MTP module (engine/mtp_drafter.h).
  bool mtp = false;
  bool prefix_caching = true;  // EngineOptions::prefix_caching
};

class EngineFixture {
 public:
  EngineFixture(const std::string& model_dir, const FixtureOptions& options);
  Engine& engine() { return *engine_; }
  const Tokenizer* tokenizer() const { return dir_.tokenizer.get(); }

  // Greedy, ignore_eos, exactly n tokens.
  std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int n);
  // All prompts submitted at once, run together; tokens per prompt.
  std::vector<std::vector<int32_t>> GreedyBatch(const std::vector<std::vector<int32_t>>& prompts,
                                                int n);

 private:
  ModelDir dir_;
  std::unique_ptr<Engine> engine_;
  int next_id_ = 0;
};

// Logits of the last prompt position from `dir`'s Transformer on a fresh cache, prefilled in
// chunks of `chunk` tokens over pages of `page_tokens` (scattered, not in order).
std::vector<float> ChunkedLogits(ModelDir& dir, const std::vector<int32_t>& prompt, int page_tokens,
                                 int chunk);
// The same from a fresh load of `model_dir`.
std::vector<float> ForwardLogits(const std::string& model_dir, const std::vector<int32_t>& prompt,
                                 int page_tokens, int chunk);
// `model_dir` loaded without its tokenizer, on one thread, with these weight options
// (ModelDirOptions::weight_dtype, weight_format and head_format).
ModelDir LoadForLogits(const std::string& model_dir, std::optional<DType> dtype,
                       std::optional<DType> format = std::nullopt,
                       std::optional<DType> head = std::nullopt);
// n tokens in [0, vocab) drawn from `seed`.
std::vector<int32_t> SeededTokens(int n, int vocab, uint32_t seed);

}  // namespace pdserve::testing
