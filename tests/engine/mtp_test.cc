// DeepSeek-V3's MTP modules in the model: built (each rank packs its share, as of a decoder
// layer) and never run by the plain forward pass, whose logits and tokens are bit for bit those
// of the same checkpoint with the modules dropped (and num_nextn_predict_layers 0), in BF16 and
// FP8.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "model/model_dir.h"

namespace pdserve {
namespace {

using testing::CopyModelDir;
using testing::EngineFixture;
using testing::ForwardLogits;
using testing::SyntheticModelDir;

// deepseek-v3-tiny without its MTP module (model.layers.3.*), in the build tree.
std::string DeepseekWithoutMtp(DType dtype) {
  const std::string src = SyntheticModelDir("deepseek-v3-tiny", dtype);
  const std::string dir = src + "-no-mtp";  // renewed with src
  if (std::filesystem::exists(dir + "/config.json")) return dir;
  const std::string tmp = dir + ".tmp." + std::to_string(getpid());
  std::filesystem::remove_all(tmp);
  CopyModelDir(
      src, tmp, [](ModelConfig& c) { c.num_nextn_predict_layers = 0; },
      [](const std::string& name, std::vector<uint8_t>&) {
        return !name.starts_with("model.layers.3.");
      });
  std::error_code ec;
  std::filesystem::rename(tmp, dir, ec);  // fails harmlessly if another process got there first
  if (ec) std::filesystem::remove_all(tmp);
  return dir;
}

std::unique_ptr<Transformer> LoadMtpRank(const std::string& dir, int rank = 0, int size = 1) {
  ModelDirOptions o;
  o.load_tokenizer = false;
  o.transformer.threads = 1;
  o.transformer.tp_rank = rank;
  o.transformer.tp_size = size;
  auto loaded = LoadModelDir(dir, o);
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  return loaded.ok() ? std::move(loaded->transformer) : nullptr;
}

class MtpForwardTest : public ::testing::TestWithParam<DType> {};

TEST_P(MtpForwardTest, PlainForwardIsBitIdenticalWithoutTheModules) {
  const std::string with = SyntheticModelDir("deepseek-v3-tiny", GetParam());
  const std::string without = DeepseekWithoutMtp(GetParam());
  {
    std::unique_ptr<Transformer> a = LoadMtpRank(with), b = LoadMtpRank(without);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->mtp_modules(), 1);
    EXPECT_GT(a->MtpWeightBytes(), 0u);
    EXPECT_EQ(b->mtp_modules(), 0);
    EXPECT_EQ(b->MtpWeightBytes(), 0u);
    EXPECT_EQ(a->WeightBytes(), b->WeightBytes());
    EXPECT_EQ(a->Fingerprint(), b->Fingerprint());
  }
  std::mt19937 rng(5);
  std::vector<int32_t> prompt(45);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 1024);
  for (int chunk : {45, 7}) {
    const std::vector<float> want = ForwardLogits(without, prompt, 4, chunk);
    const std::vector<float> got = ForwardLogits(with, prompt, 4, chunk);
    ASSERT_EQ(got.size(), want.size());
    ASSERT_FALSE(got.empty());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "chunks of " << chunk;
  }
  EngineFixture a(with, {.page_tokens = 4, .max_batch_tokens = 16, .threads = 1});
  EngineFixture b(without, {.page_tokens = 4, .max_batch_tokens = 16, .threads = 1});
  EXPECT_EQ(a.Greedy(prompt, 8), b.Greedy(prompt, 8));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MtpForwardTest, ::testing::Values(DType::kBF16, DType::kF8E4M3),
                         [](const auto& info) { return std::string(DTypeFlagName(info.param)); });

// Each rank holds its share of the module, as of a decoder layer: less than the whole, and
// together at least the whole (the latent's projections are on every rank).
TEST(MtpTpTest, RanksHoldTheirShareOfTheModules) {
  const std::string dir = SyntheticModelDir("deepseek-v3-tiny");
  std::unique_ptr<Transformer> whole = LoadMtpRank(dir);
  ASSERT_TRUE(whole);
  const size_t all = whole->MtpWeightBytes();
  for (int size : {2, 4}) {
    size_t sum = 0;
    for (int rank = 0; rank < size; ++rank) {
      std::unique_ptr<Transformer> r = LoadMtpRank(dir, rank, size);
      ASSERT_TRUE(r);
      EXPECT_EQ(r->mtp_modules(), 1);
      EXPECT_GT(r->MtpWeightBytes(), 0u) << "rank " << rank << " of " << size;
      EXPECT_LT(r->MtpWeightBytes(), all) << "rank " << rank << " of " << size;
      sum += r->MtpWeightBytes();
    }
    EXPECT_GE(sum, all) << "TP " << size;
  }
}

}  // namespace
}  // namespace pdserve
