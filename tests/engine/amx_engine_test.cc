// The real trained model (../shared/models/stories260K) through the AMX kernel paths ("amx",
// and "amx-model", its software model, which runs anywhere). The golden checkpoint is F32, and
// F32 matrices never reach the BF16 products the AMX kernel computes, so these tests use a copy
// with every tensor rounded to BF16: the engine's tokens must not depend on batch, chunks or
// pages, and its logits must agree with the float64 reference of the same BF16 weights as
// closely as the vector path's do.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "engine_test_util.h"
#include "kernels/dispatch.h"
#include "model/safetensors.h"
#include "reference_model.h"
#include "testing/kernel_paths.h"
#include "testing/test_paths.h"

namespace pdserve {
namespace {

constexpr char kModel[] = "models/stories260K";

// A directory removed when the test program exits.
struct TempDir {
  std::string path;
  ~TempDir() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
};

// A BF16 copy of stories260K in a temporary directory, written once per process (empty on
// failure, reported where it happened).
const std::string& Bf16Stories() {
  static const TempDir dir{[] {
    const std::string src = ::pdserve::testing::SharedPath(kModel);
    const std::string out = ::pdserve::testing::MakeTempDir("pdserve_stories_bf16_");
    auto set = SafetensorsSet::Open(src);
    EXPECT_TRUE(set.ok()) << set.status().ToString();
    if (!set.ok()) return std::string();
    std::vector<std::vector<uint16_t>> data;
    std::vector<TensorToWrite> tensors;
    const std::vector<std::string> names = (*set)->Names();
    data.reserve(names.size());
    for (const std::string& name : names) {
      const TensorView t = *(*set)->Find(name);
      EXPECT_EQ(t.dtype, DType::kF32) << name;
      std::vector<float> f32(t.numel());
      ConvertToF32(t.dtype, t.data, f32.data(), f32.size());
      data.emplace_back(f32.size());
      ConvertFromF32(DType::kBF16, f32.data(), data.back().data(), f32.size());
      tensors.push_back({name, DType::kBF16, t.shape, data.back().data()});
    }
    const Status s = WriteSafetensors(out + "/model.safetensors", tensors);
    EXPECT_TRUE(s.ok()) << s.ToString();
    for (const char* file :
         {"config.json", "generation_config.json", "tokenizer.model", "tokenizer_config.json"}) {
      std::filesystem::copy_file(src + "/" + file, out + "/" + file);
    }
    return s.ok() ? out : std::string();
  }()};
  return dir.path;
}

std::vector<std::vector<int32_t>> GoldenPrompts() {
  std::ifstream in(::pdserve::testing::SharedPath(std::string(kModel) + "/golden.json"));
  const nlohmann::json golden = nlohmann::json::parse(in);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : golden["cases"]) {
    prompts.push_back(c["prompt_ids"].get<std::vector<int32_t>>());
  }
  return prompts;
}

// Largest |got - want| over the last-position logits of every golden prompt, relative to the
// largest |want| (at least 1), on the active path.
double LogitsError(const std::string& dir, const testing::ReferenceModel& reference) {
  double worst = 0;
  for (const std::vector<int32_t>& prompt : GoldenPrompts()) {
    const std::vector<double> want = reference.Logits(prompt);
    const std::vector<float> got = ::pdserve::testing::ForwardLogits(dir, prompt, 4, 3);
    EXPECT_EQ(got.size(), want.size());
    if (got.size() != want.size()) return 1e30;
    double max_abs = 1, max_err = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      max_abs = std::max(max_abs, std::abs(want[i]));
      max_err = std::max(max_err, std::abs(want[i] - got[i]));
    }
    worst = std::max(worst, max_err / max_abs);
  }
  return worst;
}

class AmxEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ::pdserve::testing::UseKernelPath(GetParam()); }
  void TearDown() override { (void)kernels::SelectPath("auto"); }
};

TEST_P(AmxEngineTest, TokensDoNotDependOnBatchChunksOrPages) {
  PD_REQUIRE_SHARED(kModel);
  const std::string& dir = Bf16Stories();
  ASSERT_FALSE(dir.empty());
  const std::vector<std::vector<int32_t>> prompts = GoldenPrompts();
  constexpr int kTokens = 24;
  // All at once over small pages with a chunk budget that splits prompts...
  ::pdserve::testing::EngineFixture batched(dir, {.page_tokens = 4, .max_batch_tokens = 16});
  const auto together = batched.GreedyBatch(prompts, kTokens);
  // ... and each alone over large pages in one chunk.
  ::pdserve::testing::EngineFixture alone(dir, {.page_tokens = 32, .max_batch_tokens = 512});
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(together[i], alone.Greedy(prompts[i], kTokens)) << "prompt " << i;
  }
}

TEST_P(AmxEngineTest, LogitsAgreeWithTheFloat64ReferenceLikeTheVectorPath) {
  PD_REQUIRE_SHARED(kModel);
  const std::string& dir = Bf16Stories();
  ASSERT_FALSE(dir.empty());
  auto reference = testing::ReferenceModel::Load(dir);
  ASSERT_TRUE(reference.ok()) << reference.status().ToString();
  const double amx = LogitsError(dir, *reference);
  // The vector path this CPU runs best, on the same weights: activations are rounded to BF16
  // before every product on both, which dominates the error; the AMX order must not add to it
  // beyond noise.
  const std::string vector_path(kernels::SupportedPaths()[GetParam() == "amx" ? 1 : 0]);
  ASSERT_TRUE(kernels::SelectPath(vector_path).ok());
  const double vector = LogitsError(dir, *reference);
  EXPECT_LT(amx, 2 * vector + 1e-5) << GetParam() << " vs " << vector_path;
  EXPECT_LT(amx, 2e-2) << GetParam();
  std::printf("last-position logits vs float64, worst relative error: %s %.3g, %s %.3g\n",
              GetParam().c_str(), amx, vector_path.c_str(), vector);
}

INSTANTIATE_TEST_SUITE_P(Paths, AmxEngineTest, ::testing::Values("amx", "amx-model"),
                         [](const auto& info) {
                           return ::pdserve::testing::KernelPathTestName(info.param);
                         });

}  // namespace
}  // namespace pdserve
