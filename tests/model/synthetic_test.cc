#include "model/synthetic.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "loader_test_util.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace pdserve {
namespace {

using pdserve::testing::Mentions;
using pdserve::testing::ScopedTempDir;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Mean and standard deviation of a held tensor's values.
std::pair<double, double> Moments(const Tensor& t) {
  std::vector<float> v(t.numel());
  ConvertToF32(t.dtype(), t.data(), v.data(), v.size());
  double sum = 0, sq = 0;
  for (float x : v) {
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  const double mean = sum / v.size();
  return {mean, std::sqrt(sq / v.size() - mean * mean)};
}

class SyntheticPresetTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SyntheticPresetTest, WritesAModelThatLoadsBack) {
  const std::string preset = GetParam();
  ScopedTempDir tmp("pd_synth_");
  ASSERT_TRUE(WriteSyntheticModel(preset, tmp.path(), /*seed=*/7).ok());
  Result<ModelConfig> expected = SyntheticPresetConfig(preset);
  ASSERT_TRUE(expected.ok());

  Result<ModelConfig> c = ModelConfig::Load(tmp.path());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, expected->arch);
  EXPECT_EQ(c->hidden_size, expected->hidden_size);
  EXPECT_EQ(c->num_layers, expected->num_layers);
  EXPECT_EQ(c->num_heads, expected->num_heads);
  EXPECT_EQ(c->num_kv_heads, expected->num_kv_heads);
  EXPECT_EQ(c->head_dim, expected->head_dim);
  EXPECT_EQ(c->vocab_size, expected->vocab_size);
  EXPECT_EQ(c->tie_word_embeddings, expected->tie_word_embeddings);
  EXPECT_EQ(c->qkv_bias, expected->qkv_bias);
  EXPECT_EQ(c->qk_norm, expected->qk_norm);
  EXPECT_EQ(c->sliding_window, expected->sliding_window);
  EXPECT_EQ(c->rope_scaling.type, expected->rope_scaling.type);
  EXPECT_EQ(c->Fingerprint(), expected->Fingerprint());
  EXPECT_EQ(c->torch_dtype, "bfloat16");

  // BOS/EOS in config.json are the tokenizer's own special tokens.
  auto tok_config = nlohmann::json::parse(ReadBytes(tmp.path() + "/tokenizer_config.json"));
  auto tokenizer = nlohmann::json::parse(ReadBytes(tmp.path() + "/tokenizer.json"));
  ASSERT_TRUE(c->bos_token_id.has_value());
  ASSERT_EQ(c->eos_token_ids.size(), 1u);
  int matched = 0;
  for (const auto& t : tokenizer["added_tokens"]) {
    if (t["id"] == *c->bos_token_id && t["content"] == tok_config["bos_token"]) ++matched;
    if (t["id"] == c->eos_token_ids[0] && t["content"] == tok_config["eos_token"]) ++matched;
  }
  EXPECT_EQ(matched, 2);
  EXPECT_LT(c->eos_token_ids[0], c->vocab_size);

  Result<ModelWeights> w = LoadWeights(*c, tmp.path());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->matrix_dtype, DType::kBF16);
  EXPECT_EQ(w->lm_head.empty(), c->tie_word_embeddings);
  // Scaled so activations stay near unit variance: matrices ~ N(0, 1/fan_in), norms ~ 1.
  auto [q_mean, q_std] = Moments(w->layers[0].q_proj);
  EXPECT_NEAR(q_mean, 0.0, 0.01);
  EXPECT_NEAR(q_std * std::sqrt(c->hidden_size), 1.0, 0.05);
  auto [d_mean, d_std] = Moments(w->layers.back().down_proj);
  EXPECT_NEAR(d_std * std::sqrt(c->intermediate_size), 1.0, 0.05);
  auto [n_mean, n_std] = Moments(w->final_norm);
  EXPECT_NEAR(n_mean, 1.0, 0.05);
  EXPECT_GT(n_std, 0.0);
  if (c->qkv_bias) {
    EXPECT_GT(Moments(w->layers[0].k_bias).second, 0.0);
  }
  if (c->qk_norm) {
    EXPECT_NEAR(Moments(w->layers[0].q_norm).first, 1.0, 0.1);
  }
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, SyntheticPresetTest,
                         ::testing::Values("tiny", "tiny-qwen2", "tiny-qwen3", "tiny-mistral",
                                           "tiny-llama3"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

TEST(SyntheticTest, SameSeedSameBytesOtherSeedOtherWeights) {
  ScopedTempDir a("pd_synth_"), b("pd_synth_"), other("pd_synth_");
  ASSERT_TRUE(WriteSyntheticModel("tiny-qwen2", a.path(), 1).ok());
  ASSERT_TRUE(WriteSyntheticModel("tiny-qwen2", b.path(), 1).ok());
  ASSERT_TRUE(WriteSyntheticModel("tiny-qwen2", other.path(), 2).ok());
  for (const char* file : {"/model.safetensors", "/config.json", "/tokenizer.json"}) {
    EXPECT_EQ(ReadBytes(a.path() + file), ReadBytes(b.path() + file)) << file;
  }
  EXPECT_NE(ReadBytes(a.path() + "/model.safetensors"),
            ReadBytes(other.path() + "/model.safetensors"));
  // Different tensors of one model are not copies of each other.
  auto set = SafetensorsSet::Open(a.path());
  ASSERT_TRUE(set.ok());
  auto k = (*set)->Find("model.layers.0.self_attn.k_proj.weight");
  auto v = (*set)->Find("model.layers.0.self_attn.v_proj.weight");
  ASSERT_TRUE(k.ok() && v.ok());
  EXPECT_NE(std::memcmp(k->data, v->data, k->nbytes), 0);
}

TEST(SyntheticTest, OtherDtypes) {
  ScopedTempDir f32("pd_synth_"), f16("pd_synth_");
  ASSERT_TRUE(WriteSyntheticModel("tiny-qwen3", f32.path(), 3, DType::kF32).ok());
  ASSERT_TRUE(WriteSyntheticModel("tiny-qwen3", f16.path(), 3, DType::kF16).ok());
  Result<ModelConfig> c = ModelConfig::Load(f32.path());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->torch_dtype, "float32");
  Result<ModelWeights> w32 = LoadWeights(*c, f32.path());
  Result<ModelWeights> w16 = LoadWeights(*c, f16.path());
  ASSERT_TRUE(w32.ok() && w16.ok());
  EXPECT_EQ(w32->matrix_dtype, DType::kF32);
  EXPECT_EQ(w16->matrix_dtype, DType::kBF16);
  // Same seed: the F16 file holds the F32 values rounded (then widened to BF16 on load).
  const float a = w32->layers[1].up_proj.as<float>()[100];
  const float b = BF16ToF32(w16->layers[1].up_proj.as<uint16_t>()[100]);
  EXPECT_NEAR(a, b, std::abs(a) * 0.01 + 1e-4);
}

TEST(SyntheticTest, ArbitraryConfig) {
  Result<ModelConfig> c = SyntheticPresetConfig("tiny");
  ASSERT_TRUE(c.ok());
  c->num_layers = 1;
  c->vocab_size = 512;
  c->tie_word_embeddings = false;
  ScopedTempDir tmp("pd_synth_");
  ASSERT_TRUE(WriteSyntheticModelFromConfig(*c, tmp.path(), 5).ok());
  Result<ModelConfig> loaded = ModelConfig::Load(tmp.path());
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->num_layers, 1);
  Result<ModelWeights> w = LoadWeights(*loaded, tmp.path());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->lm_head.shape(), (std::vector<int64_t>{512, 256}));

  c->vocab_size = 100;  // below the synthetic tokenizer's minimum
  EXPECT_FALSE(WriteSyntheticModelFromConfig(*c, tmp.path(), 5).ok());
}

// SyntheticWeightBytes (what `make-model --list` shows) is what the writer writes.
TEST(SyntheticTest, WeightBytesAreTheWrittenTensors) {
  for (auto [preset, dtype] : {std::pair{"tiny", DType::kBF16},
                               {"tiny-qwen3", DType::kF32},
                               {"deepseek-v3-tiny", DType::kF8E4M3},
                               {"deepseek-v2-lite-tiny", DType::kF8E4M3},
                               {"qwen3-moe-tiny", DType::kBF16}}) {
    SCOPED_TRACE(std::string(preset) + " " + std::string(DTypeName(dtype)));
    ScopedTempDir tmp("pd_synth_");
    ASSERT_TRUE(WriteSyntheticModel(preset, tmp.path(), 1, dtype).ok());
    auto set = SafetensorsSet::Open(tmp.path());
    ASSERT_TRUE(set.ok());
    uint64_t written = 0;
    for (const std::string& name : (*set)->Names()) written += (*set)->Find(name)->nbytes;
    Result<ModelConfig> c = SyntheticPresetConfig(preset);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(SyntheticWeightBytes(*c, dtype), written);
  }
}

TEST(SyntheticTest, UnknownPresetListsKnownOnes) {
  ScopedTempDir tmp("pd_synth_");
  Status s = WriteSyntheticModel("gpt-5", tmp.path(), 0);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Mentions(s.message(), "gpt-5"));
  EXPECT_TRUE(Mentions(s.message(), "qwen2.5-0.5b"));
  EXPECT_TRUE(Mentions(s.message(), "tiny"));
}

TEST(SyntheticTest, RefusesDirectoryWithOtherShards) {
  ScopedTempDir tmp("pd_synth_");
  std::ofstream(tmp.path() + "/model-00001-of-00002.safetensors") << "x";
  Status s = WriteSyntheticModel("tiny", tmp.path(), 0);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Mentions(s.message(), "model-00001-of-00002.safetensors"));
}

TEST(SyntheticTest, RealSizePresetConfigs) {
  // Only the configs: writing these takes seconds and a gigabyte or more.
  Result<ModelConfig> q = SyntheticPresetConfig("qwen2.5-0.5b");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->arch, Architecture::kQwen2);
  EXPECT_EQ(q->hidden_size, 896);
  EXPECT_EQ(q->num_layers, 24);
  EXPECT_EQ(q->num_heads, 14);
  EXPECT_EQ(q->num_kv_heads, 2);
  EXPECT_EQ(q->head_dim, 64);
  EXPECT_EQ(q->intermediate_size, 4864);
  EXPECT_EQ(q->vocab_size, 151936);
  EXPECT_TRUE(q->tie_word_embeddings);
  EXPECT_TRUE(q->qkv_bias);
  EXPECT_DOUBLE_EQ(q->rope_theta, 1e6);

  Result<ModelConfig> l = SyntheticPresetConfig("llama-3.2-1b");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->arch, Architecture::kLlama);
  EXPECT_EQ(l->hidden_size, 2048);
  EXPECT_EQ(l->num_layers, 16);
  EXPECT_EQ(l->num_heads, 32);
  EXPECT_EQ(l->num_kv_heads, 8);
  EXPECT_EQ(l->intermediate_size, 8192);
  EXPECT_EQ(l->vocab_size, 128256);
  EXPECT_TRUE(l->tie_word_embeddings);
  EXPECT_EQ(l->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(l->rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(l->rope_theta, 500000.0);

  // DeepSeek-V2-Lite's layers exactly as its config.json gives them, 4 of its 27.
  Result<ModelConfig> d = SyntheticPresetConfig("deepseek-v2-lite-4l");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->arch, Architecture::kDeepseekV2);
  EXPECT_EQ(d->hidden_size, 2048);
  EXPECT_EQ(d->num_layers, 4);
  EXPECT_EQ(d->num_heads, 16);
  EXPECT_EQ(d->vocab_size, 102400);
  EXPECT_EQ(d->intermediate_size, 10944);
  EXPECT_FALSE(d->tie_word_embeddings);
  EXPECT_EQ(d->max_position_embeddings, 163840);
  EXPECT_DOUBLE_EQ(d->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(d->rope_theta, 10000.0);
  EXPECT_EQ(d->mla.q_lora_rank, 0);
  EXPECT_EQ(d->mla.kv_lora_rank, 512);
  EXPECT_EQ(d->mla.qk_nope_head_dim, 128);
  EXPECT_EQ(d->mla.qk_rope_head_dim, 64);
  EXPECT_EQ(d->mla.v_head_dim, 128);
  EXPECT_EQ(d->num_kv_heads, 1);
  EXPECT_EQ(d->head_dim, 576);
  EXPECT_EQ(d->moe.num_experts, 64);
  EXPECT_EQ(d->moe.expert_intermediate, 1408);
  EXPECT_EQ(d->moe.experts_per_token, 6);
  EXPECT_EQ(d->moe.shared_experts, 2);
  EXPECT_EQ(d->moe.first_dense, 1);
  EXPECT_EQ(d->moe.topk_method, MoeConfig::TopK::kGreedy);
  EXPECT_EQ(d->moe.scoring, MoeConfig::Scoring::kSoftmax);
  EXPECT_FALSE(d->moe.norm_topk_prob);
  EXPECT_DOUBLE_EQ(d->moe.routed_scaling_factor, 1.0);
  EXPECT_FALSE(d->IsMoeLayer(0));
  EXPECT_TRUE(d->IsMoeLayer(1) && d->IsMoeLayer(3));
  EXPECT_EQ(d->num_nextn_predict_layers, 0);  // V2 has no MTP module
  EXPECT_EQ(d->rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_DOUBLE_EQ(d->rope_scaling.factor, 40.0);
  EXPECT_EQ(d->rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(d->rope_scaling.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(d->rope_scaling.beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(d->rope_scaling.mscale, 0.707);
  EXPECT_DOUBLE_EQ(d->rope_scaling.mscale_all_dim, 0.707);
  EXPECT_NEAR(d->softmax_scale(), 0.114721, 1e-6);  // issue 32's figure for V2-Lite
  // Its size (docs/benchmarks.md), counted here from V2-Lite's shapes: the embedding and the
  // lm_head, per layer MLA (q_proj, kv_a_proj_with_mqa, its norm, kv_b_proj, o_proj) and two
  // norms, the dense first MLP, then the router, 64 experts and the 2 shared ones.
  const int64_t h = 2048,
                attention = 16 * 192 * h + 576 * h + 512 + 16 * 256 * 512 + h * 16 * 128 + 2 * h;
  const int64_t moe = 64 * h + 64 * 3 * 1408 * h + 3 * 2816 * h;
  const int64_t params = 2 * 102400 * h + h + 4 * attention + 3 * 10944 * h + 3 * moe;
  EXPECT_EQ(params, 2254983168);  // 2.3B, as its description says
  EXPECT_EQ(SyntheticWeightBytes(*d, DType::kBF16), static_cast<uint64_t>(2 * params));
  // FP8: one byte per quantised weight plus its 128 x 128 block's F32 scale; the embedding,
  // lm_head, norms and routers stay BF16.
  const uint64_t fp8 = SyntheticWeightBytes(*d, DType::kF8E4M3);
  EXPECT_GT(fp8, static_cast<uint64_t>(params + 2 * 102400 * h));
  EXPECT_LT(fp8, static_cast<uint64_t>(params + 2 * 102400 * h) * 1.01);

  // Every preset is a valid config that survives config.json.
  for (const SyntheticPreset& p : SyntheticPresets()) {
    EXPECT_TRUE(p.config.Validate().ok()) << p.name;
    Result<ModelConfig> back = ModelConfig::FromJson(p.config.ToJson());
    ASSERT_TRUE(back.ok()) << p.name << ": " << back.status().ToString();
    EXPECT_EQ(back->Fingerprint(), p.config.Fingerprint()) << p.name;
  }
  EXPECT_EQ(SyntheticPresetNames().front(), "tiny");
}

}  // namespace
}  // namespace pdserve
