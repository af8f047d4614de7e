// Validates the float64 reference forward itself: against the golden continuations of the real
// stories260K model (computed by an independent numpy implementation of the HF Llama forward),
// for internal consistency of its three entry points, for loading every synthetic
// architecture, and for the rope frequencies.
#include "engine/reference_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/engine_test_util.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

// Loaded once for all tests of this file (the load widens every weight to double).
const Result<ReferenceModel>& Stories() {
  static const Result<ReferenceModel> model = ReferenceModel::Load(SharedPath(kGoldenModel));
  return model;
}

TEST(ReferenceModelTest, ReproducesStoriesGoldenGreedyAndLogits) {
  PD_REQUIRE_SHARED(kGoldenModel);
  ASSERT_TRUE(Stories().ok()) << Stories().status().ToString();
  const ReferenceModel& model = *Stories();
  const nlohmann::json golden = ReadGolden();
  ASSERT_EQ(golden["cases"].size(), 5u);
  for (const nlohmann::json& c : golden["cases"]) {
    SCOPED_TRACE("prompt: \"" + c["prompt"].get<std::string>() + "\"");
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto expected = c["greedy_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(model.Greedy(prompt, static_cast<int>(expected.size())), expected);

    const std::vector<double> logits = model.Logits(prompt);
    ASSERT_EQ(logits.size(), 512u);
    std::vector<int32_t> order(logits.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    const nlohmann::json& top5 = c["last_logits_top5"];
    ASSERT_EQ(top5.size(), 5u);
    for (size_t rank = 0; rank < 5; ++rank) {
      const int32_t id = top5[rank][0].get<int32_t>();
      const double value = top5[rank][1].get<double>();
      EXPECT_EQ(order[rank], id) << "rank " << rank;
      EXPECT_NEAR(logits[id], value, 1e-6 * std::abs(value)) << "id " << id;
    }
  }
}

// Logits, AllLogits and Greedy run the same forward through different loops; they must agree
// exactly, and the greedy path (one cached step per token) must pick the argmax of every row.
TEST(ReferenceModelTest, EntryPointsAgree) {
  PD_REQUIRE_SHARED(kGoldenModel);
  ASSERT_TRUE(Stories().ok()) << Stories().status().ToString();
  const ReferenceModel& model = *Stories();
  const std::vector<int32_t> prompt = {1, 317, 269, 274, 287, 263};
  const std::vector<int32_t> continuation = model.Greedy(prompt, 6);
  ASSERT_EQ(continuation.size(), 6u);

  std::vector<int32_t> all = prompt;
  all.insert(all.end(), continuation.begin(), continuation.end() - 1);
  const std::vector<std::vector<double>> rows = model.AllLogits(all);
  ASSERT_EQ(rows.size(), all.size());
  EXPECT_EQ(rows.back(), model.Logits(all));
  EXPECT_EQ(rows[prompt.size() - 1], model.Logits(prompt));
  for (size_t i = 0; i < continuation.size(); ++i) {
    const std::vector<double>& row = rows[prompt.size() - 1 + i];
    const auto argmax = std::max_element(row.begin(), row.end()) - row.begin();
    EXPECT_EQ(argmax, continuation[i]) << "step " << i;
  }
}

// Every architecture's tensors (Qwen2 biases, Qwen3 q/k norms, untied lm_head) load from the
// synthetic writer's files and give finite logits. Agreement with the engine is tested apart.
TEST(ReferenceModelTest, LoadsEverySyntheticArchitecture) {
  const std::vector<std::pair<std::string, Architecture>> presets = {
      {"tiny", Architecture::kLlama},
      {"tiny-qwen2", Architecture::kQwen2},
      {"tiny-qwen3", Architecture::kQwen3},
      {"tiny-mistral", Architecture::kMistral},
      {"tiny-llama3", Architecture::kLlama}};
  for (const auto& [preset, arch] : presets) {
    SCOPED_TRACE(preset);
    Result<ReferenceModel> model = ReferenceModel::Load(SyntheticModelDir(preset, DType::kBF16));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    EXPECT_EQ(model->config().arch, arch);
    const std::vector<int32_t> prompt = {1, 5, 300, 7, 42};
    const std::vector<double> logits = model->Logits(prompt);
    ASSERT_EQ(logits.size(), static_cast<size_t>(model->config().vocab_size));
    for (double v : logits) ASSERT_TRUE(std::isfinite(v));
    const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(model->Greedy(prompt, 1), std::vector<int32_t>{static_cast<int32_t>(argmax)});
  }
}

TEST(ReferenceModelTest, LoadOfMissingDirectoryIsAnError) {
  const std::string dir = MakeTempDir("pdserve_ref_empty_");
  Result<ReferenceModel> loaded = ReferenceModel::Load(dir);
  std::filesystem::remove_all(dir);
  EXPECT_FALSE(loaded.ok());
}

ModelConfig RopeConfig(RopeScaling::Type type) {
  ModelConfig config;
  config.head_dim = 8;
  config.rope_theta = 10000.0;  // inv_freq = 10000^(-i/4): 1, 0.1, 0.01, 0.001
  config.rope_scaling.type = type;
  config.rope_scaling.factor = 8.0;
  config.rope_scaling.low_freq_factor = 1.0;
  config.rope_scaling.high_freq_factor = 4.0;
  config.rope_scaling.original_max_position_embeddings = 1024;
  return config;
}

TEST(ReferenceModelTest, RopeFrequenciesWithoutScaling) {
  const std::vector<double> f = ReferenceModel::RopeInverseFrequencies(RopeConfig({}));
  ASSERT_EQ(f.size(), 4u);
  EXPECT_NEAR(f[0], 1.0, 1e-15);
  EXPECT_NEAR(f[1], 0.1, 1e-15);
  EXPECT_NEAR(f[2], 0.01, 1e-15);
  EXPECT_NEAR(f[3], 0.001, 1e-15);
}

TEST(ReferenceModelTest, RopeFrequenciesLinearScaling) {
  const std::vector<double> f =
      ReferenceModel::RopeInverseFrequencies(RopeConfig(RopeScaling::Type::kLinear));
  ASSERT_EQ(f.size(), 4u);
  EXPECT_NEAR(f[0], 1.0 / 8, 1e-15);
  EXPECT_NEAR(f[3], 0.001 / 8, 1e-15);
}

// Llama-3 scaling with original context 1024, low/high freq factors 1/4, factor 8: wavelengths
// above 1024 are slowed 8x, those below 256 kept, those between interpolated.
TEST(ReferenceModelTest, RopeFrequenciesLlama3Scaling) {
  const std::vector<double> f =
      ReferenceModel::RopeInverseFrequencies(RopeConfig(RopeScaling::Type::kLlama3));
  ASSERT_EQ(f.size(), 4u);
  // Wavelengths 2*pi/f: 6.28 and 62.8 are below 256 -> unchanged.
  EXPECT_NEAR(f[0], 1.0, 1e-15);
  EXPECT_NEAR(f[1], 0.1, 1e-15);
  // 200*pi = 628.3 lies in [256, 1024]: smooth = (1024 / (200 pi) - 1) / (4 - 1)
  // = (5.12 / pi - 1) / 3 = 0.2099155..., f = 0.01 * ((1 - smooth) / 8 + smooth)
  // = 0.00125 + 0.00875 * smooth = 0.0030867609670...
  const double smooth = (5.12 / std::numbers::pi - 1.0) / 3.0;
  EXPECT_NEAR(smooth, 0.2099155390870, 1e-12);
  EXPECT_NEAR(f[2], 0.00125 + 0.00875 * smooth, 1e-15);
  EXPECT_NEAR(f[2], 0.0030867609670, 1e-12);
  // 2000*pi = 6283 is above 1024 -> divided by the factor.
  EXPECT_NEAR(f[3], 0.000125, 1e-15);
}

}  // namespace
}  // namespace pdserve::testing
