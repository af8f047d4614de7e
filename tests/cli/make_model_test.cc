// `pdserve make-model --num-layers N`: a preset's first N layers, a model that loads.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "model/config.h"
#include "model/synthetic.h"
#include "model/weights.h"
#include "testing/processes.h"
#include "testing/test_paths.h"

namespace pdserve {
namespace {

TEST(MakeModelTest, NumLayersGivesThePresetsFirstLayers) {
  const std::string dir = testing::MakeTempDir("make_model_layers_") + "/m";
  const testing::CommandRun run = testing::RunPdserve(
      {"make-model", "--preset", "qwen3-moe-tiny", "--num-layers", "3", "--out", dir},
      Deadline::AfterMs(120'000));
  ASSERT_TRUE(run.finished && run.exit.success()) << run.output;
  Result<ModelConfig> config = ModelConfig::Load(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Result<ModelConfig> preset = SyntheticPresetConfig("qwen3-moe-tiny");
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(config->num_layers, 3);
  EXPECT_GT(preset->num_layers, 3);
  EXPECT_EQ(config->hidden_size, preset->hidden_size);
  EXPECT_EQ(config->moe.num_experts, preset->moe.num_experts);
  Result<ModelWeights> weights = LoadWeights(*config, dir);
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  EXPECT_EQ(weights->layers.size(), 3u);

  // More layers than the preset has: refused before anything is written.
  const std::string other = testing::MakeTempDir("make_model_layers_") + "/m";
  const testing::CommandRun zero =
      testing::RunPdserve({"make-model", "--preset", "tiny", "--num-layers", "99", "--out", other},
                          Deadline::AfterMs(60'000));
  ASSERT_TRUE(zero.finished);
  EXPECT_FALSE(zero.exit.success());
  EXPECT_NE(zero.output.find("99 layers"), std::string::npos) << zero.output;
  EXPECT_FALSE(std::filesystem::exists(other + "/config.json"));
  for (const std::string& d : {dir, other}) {
    std::filesystem::remove_all(std::filesystem::path(d).parent_path());
  }
}

}  // namespace
}  // namespace pdserve
