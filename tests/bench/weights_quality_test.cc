// The 8-bit weight formats against BF16 weights of the same checkpoint (bench/weights_quality.h,
// `pdserve bench quality`): greedy continuations of 256 tokens agree for most of their length and
// the next-token distributions over a text stay close (mean KL bounded), on the trained
// stories260K (skipped loudly without the shared models) and on synthetic presets. The bounds
// sit a few times off the measured figures (docs/benchmarks.md), so a broken quantiser or kernel
// (a wrong scale, a misplaced byte) fails them.
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "bench/weights_quality.h"
#include "model/model_dir.h"
#include "testing/test_models.h"
#include "testing/test_paths.h"

namespace pdserve {
namespace {

ModelDir LoadForQuality(const std::string& path, DType format) {
  ModelDirOptions options;
  options.weight_format = format;
  auto dir = LoadModelDir(path, options);
  EXPECT_TRUE(dir.ok()) << dir.status().ToString();
  return std::move(*dir);
}

struct QualityBounds {
  double identical_prefix;  // at least
  double mean_kl;           // at most
  double top1 = 0.0;        // at least
};

bench::WeightsQuality Measure(const std::string& path, DType format,
                              const bench::WeightsQualityOptions& options) {
  ModelDir bf16 = LoadForQuality(path, DType::kBF16);
  ModelDir candidate = LoadForQuality(path, format);
  auto q = bench::CompareWeights(*bf16.transformer, *candidate.transformer, options);
  EXPECT_TRUE(q.ok()) << q.status().ToString();
  return q.ok() ? *q : bench::WeightsQuality{};
}

void ExpectWithin(const bench::WeightsQuality& q, const QualityBounds& b, const std::string& what) {
  EXPECT_GE(q.identical_prefix, b.identical_prefix) << what;
  EXPECT_LE(q.mean_kl, b.mean_kl) << what;
  EXPECT_GE(q.top1_agreement, b.top1) << what;
  EXPECT_GT(q.mean_kl, 0.0) << what << ": the formats must differ from bf16";
  std::printf(
      "%s: identical prefix %.1f%%, tokens equal %.1f%%, mean KL %.2e, max KL %.2e, "
      "top-1 %.1f%%\n",
      what.c_str(), 100 * q.identical_prefix, 100 * q.tokens_equal, q.mean_kl, q.max_kl,
      100 * q.top1_agreement);
}

TEST(WeightsQualityTest, IdenticalLogitsHaveNoDivergence) {
  const std::vector<float> a = {1.0f, -2.0f, 0.5f, 3.0f};
  EXPECT_EQ(bench::KlDivergence(a, a), 0.0);
  EXPECT_GT(bench::KlDivergence(a, {3.0f, -2.0f, 0.5f, 1.0f}), 0.1);
  const std::string path = testing::SyntheticModelDir("tiny", DType::kBF16);
  ModelDir x = LoadForQuality(path, DType::kBF16), y = LoadForQuality(path, DType::kBF16);
  bench::WeightsQualityOptions options{.prompts = {{1, 2, 3}}, .continuation = 20, .text = {}};
  for (int i = 0; i < 30; ++i) options.text.push_back(7 * i % 2048);
  auto q = bench::CompareWeights(*x.transformer, *y.transformer, options);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->identical_prefix, 1.0);
  EXPECT_EQ(q->mean_kl, 0.0);
  EXPECT_EQ(q->top1_agreement, 1.0);
}

TEST(WeightsQualityTest, Stories260KStaysCloseToBf16) {
  PD_REQUIRE_SHARED("models/stories260K");
  const std::string path = testing::SharedPath("models/stories260K");
  ModelDir bf16 = LoadForQuality(path, DType::kBF16);
  const std::vector<int32_t> text = bf16.tokenizer->Encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day, she saw a big red ball under a tree. She ran to the ball "
      "and picked it up. It was soft and round. Lily wanted to share the ball with her friend "
      "Tom. She looked for Tom everywhere, but she could not find him. Then she heard a sound.",
      true);
  bench::WeightsQualityOptions options;
  options.text = text;
  options.continuation = 256;
  for (size_t begin : {size_t{0}, size_t{20}, size_t{40}, size_t{60}}) {
    options.prompts.emplace_back(text.begin() + begin, text.begin() + begin + 12);
  }
  // Measured: int8 24.0% identical prefix, mean KL 1.04e-3 with the lm_head INT8 too (--lm-head
  // auto; 21.4%, 6.4e-4 with it BF16; activations quantised to 8 bits per row and 128 values);
  // fp8 9.9%, 4.5e-3 (a 260K-parameter F32 model, whose greedy choices are often near ties).
  ExpectWithin(Measure(path, DType::kI8, options),
               {.identical_prefix = 0.15, .mean_kl = 2.5e-3, .top1 = 0.9}, "stories260K int8");
  ExpectWithin(Measure(path, DType::kF8E4M3, options),
               {.identical_prefix = 0.05, .mean_kl = 1.5e-2, .top1 = 0.85}, "stories260K fp8");
}

class SyntheticQualityTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SyntheticQualityTest, StaysCloseToBf16) {
  const std::string path = testing::SyntheticModelDir(GetParam(), DType::kBF16);
  std::mt19937 rng(17);
  bench::WeightsQualityOptions options;
  options.continuation = 256;
  for (int p = 0; p < 4; ++p) {
    std::vector<int32_t> prompt(12);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 1024);
    options.prompts.push_back(prompt);
  }
  for (int i = 0; i < 200; ++i) options.text.push_back(static_cast<int32_t>(rng() % 1024));
  const std::string name = GetParam();
  // Random weights give nearly flat next-token distributions, whose greedy choices are near ties
  // that any change of the last bits flips (measured identical prefixes: 1-6%); the KL and the
  // top-1 agreement over the text are what bound them. Measured with the INT8 lm_head (auto):
  // int8 KL 6.5e-4 / 1.0e-3, top-1 94.0% / 94.5% (with a BF16 head 6.1e-4 / 9.7e-4); fp8
  // 6.8e-3 / 7.5e-3, 80% / 75% (tiny-qwen2 / tiny-llama3).
  ExpectWithin(Measure(path, DType::kI8, options),
               {.identical_prefix = 0.0, .mean_kl = 2.5e-3, .top1 = 0.85}, name + " int8");
  ExpectWithin(Measure(path, DType::kF8E4M3, options),
               {.identical_prefix = 0.0, .mean_kl = 3e-2, .top1 = 0.6}, name + " fp8");
}

INSTANTIATE_TEST_SUITE_P(Presets, SyntheticQualityTest,
                         ::testing::Values("tiny-qwen2", "tiny-llama3"), [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace pdserve
