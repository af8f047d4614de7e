// Linear layers held in 8 bits through the engine: a BF16 checkpoint quantised at load
// (`--weights fp8|int8`, LoadWeights' linear_format) holds exactly what `make-model --dtype
// fp8|int8` writes, so its logits are those of that checkpoint bit for bit; the matrices take one
// byte a weight plus the scales; and greedy tokens do not depend on the batch, the chunking or the
// page size (DESIGN.md §6). Tensor parallelism of these formats is in tp_forward_test.cc, their
// quality against BF16 in weights_quality_test.cc.
#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "model/model_dir.h"

namespace pdserve {
namespace {

using testing::EngineFixture;
using testing::SyntheticModelDir;

class QuantisedAtLoadTest : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

// The BF16 checkpoint loaded with --weights fp8 (int8) against the checkpoint make-model writes
// in fp8 (int8), loaded as it is: the same bytes and scales in memory, hence the same logits bit
// for bit and the same weight bytes; and against the BF16 model: a different fingerprint (their
// KV differs) and about half the bytes.
TEST_P(QuantisedAtLoadTest, HoldsWhatMakeModelWritesBitForBit) {
  const auto [preset, format] = GetParam();
  ModelDir at_load =
      testing::LoadForLogits(SyntheticModelDir(preset, DType::kBF16), std::nullopt, format);
  ModelDir written = testing::LoadForLogits(SyntheticModelDir(preset, format), std::nullopt);
  ModelDir bf16 = testing::LoadForLogits(SyntheticModelDir(preset, DType::kBF16), std::nullopt);
  const std::vector<int32_t> prompt = testing::SeededTokens(30, at_load.config.vocab_size, 3);
  const std::vector<float> a = testing::ChunkedLogits(at_load, prompt, 4, 7);
  const std::vector<float> b = testing::ChunkedLogits(written, prompt, 4, 7);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_EQ(at_load.transformer->WeightBytes(), written.transformer->WeightBytes());
  EXPECT_NE(at_load.transformer->Fingerprint(), bf16.transformer->Fingerprint());
  // One byte a weight plus 4 per 128 (the BF16 lm_head and embedding stay).
  EXPECT_LT(at_load.transformer->WeightBytes(), bf16.transformer->WeightBytes() * 0.7);
  const std::vector<float> c = testing::ChunkedLogits(bf16, prompt, 4, 7);
  EXPECT_NE(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Presets, QuantisedAtLoadTest,
                         ::testing::Combine(::testing::Values("tiny", "tiny-qwen2",
                                                              "qwen3-moe-tiny", "deepseek-v3-tiny"),
                                            ::testing::Values(DType::kF8E4M3, DType::kI8)),
                         [](const auto& info) {
                           std::string name = std::string(std::get<0>(info.param)) + "_" +
                                              std::string(DTypeFlagName(std::get<1>(info.param)));
                           for (char& ch : name) {
                             if (ch == '-' || ch == '.') ch = '_';
                           }
                           return name;
                         });

// The checkpoint's format, a format asked for and the checkpoint the fixture loads.
struct EightBitCase {
  const char* name;
  DType checkpoint;
  std::optional<DType> format;
};

class EightBitInvarianceTest : public ::testing::TestWithParam<EightBitCase> {};

// Eight prompts alone, then all together in one batch, prefilled in chunks of various budgets
// over pages of various sizes: the same greedy tokens, and every page back in the pool.
TEST_P(EightBitInvarianceTest, AloneInABatchOfEightAndChunkedGiveIdenticalTokens) {
  const EightBitCase c = GetParam();
  const std::string dir = SyntheticModelDir("tiny-qwen2", c.checkpoint);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(testing::SeededTokens(3 + 7 * i, 1024, 40 + i));
  const int n = 12;
  std::vector<std::vector<int32_t>> alone;
  {
    EngineFixture fx(dir, {.page_tokens = 16, .max_batch_tokens = 512, .weight_format = c.format});
    for (const auto& p : prompts) alone.push_back(fx.Greedy(p, n));
  }
  for (auto [page, budget] : {std::pair{16, 512}, {4, 7}, {3, 33}}) {
    EngineFixture fx(dir,
                     {.page_tokens = page, .max_batch_tokens = budget, .weight_format = c.format});
    EXPECT_EQ(fx.GreedyBatch(prompts, n), alone) << "page " << page << " budget " << budget;
    EXPECT_EQ(fx.engine().page_pool().used(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, EightBitInvarianceTest,
                         ::testing::Values(EightBitCase{"int8", DType::kI8, std::nullopt},
                                           EightBitCase{"bf16_as_int8", DType::kBF16, DType::kI8},
                                           EightBitCase{"bf16_as_fp8", DType::kBF16,
                                                        DType::kF8E4M3}),
                         [](const auto& info) { return std::string(info.param.name); });

// An INT8 checkpoint: kept INT8 by default; --weights bf16 dequantises it (each value int8 *
// scale, rounded to BF16) and --weights fp8 requantises it, each a model of its own fingerprint.
TEST(EightBitWeightsTest, Int8CheckpointStaysInt8UnlessAskedOtherwise) {
  const std::string path = SyntheticModelDir("tiny", DType::kI8);
  ModelDir kept = testing::LoadForLogits(path, std::nullopt);
  ModelDir dequantised = testing::LoadForLogits(path, std::nullopt, DType::kBF16);
  ModelDir fp8 = testing::LoadForLogits(path, std::nullopt, DType::kF8E4M3);
  ASSERT_TRUE(kept.config.quantization.int8());
  EXPECT_LT(kept.transformer->WeightBytes(), dequantised.transformer->WeightBytes() * 0.7);
  // Both 8-bit layouts hold a byte a weight and a 4-byte scale per column and 128-wide k block
  // (kernel_table.h: INT8's offset is undone per row of x, not stored per column).
  EXPECT_EQ(kept.transformer->WeightBytes(), fp8.transformer->WeightBytes());
  EXPECT_NE(kept.transformer->Fingerprint(), dequantised.transformer->Fingerprint());
  EXPECT_NE(kept.transformer->Fingerprint(), fp8.transformer->Fingerprint());
  const std::vector<int32_t> prompt = testing::SeededTokens(20, kept.config.vocab_size, 9);
  const std::vector<float> a = testing::ChunkedLogits(kept, prompt, 4, 7);
  const std::vector<float> b = testing::ChunkedLogits(dequantised, prompt, 4, 7);
  ASSERT_EQ(a.size(), b.size());
  float largest = 0, worst = 0;
  for (float v : b) largest = std::max(largest, std::fabs(v));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  // BF16 rounding of the values and activations (bf16) against activations quantised to 8 bits
  // per row and 128 values (int8; measured 2.4% of the largest logit on this random model).
  EXPECT_LE(worst, 4e-2f * largest);
}

// Refused with the reason: a format the loader does not hold, and --weights bf16 against
// --dtype f32.
TEST(EightBitWeightsTest, RefusesContradictoryFormats) {
  const std::string path = SyntheticModelDir("tiny", DType::kBF16);
  ModelDirOptions options;
  options.load_tokenizer = false;
  options.weight_format = DType::kF16;
  EXPECT_FALSE(LoadModelDir(path, options).ok());
  options.weight_format = DType::kBF16;
  options.weight_dtype = DType::kF32;
  auto refused = LoadModelDir(path, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--dtype f32"), std::string::npos)
      << refused.status().ToString();
}

}  // namespace
}  // namespace pdserve
