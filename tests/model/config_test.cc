#include "model/config.h"

#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "loader_test_util.h"
#include "testing/test_paths.h"

namespace pdserve {
namespace {

using pdserve::testing::Mentions;
using pdserve::testing::ScopedTempDir;

constexpr char kLlama3[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "tie_word_embeddings": true, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
  "attention_bias": false, "mlp_bias": false, "hidden_act": "silu"
})";

constexpr char kQwen2[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
  "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
  "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
  "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "use_sliding_window": false, "max_window_layers": 21,
  "tie_word_embeddings": true, "bos_token_id": 151643, "eos_token_id": 151643,
  "rope_scaling": null, "hidden_act": "silu"
})";

constexpr char kQwen3[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072,
  "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
  "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
  "rope_theta": 1000000, "attention_bias": false, "tie_word_embeddings": true,
  "eos_token_id": 151645
})";

constexpr char kMistral[] = R"({
  "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
  "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096,
  "rope_theta": 10000.0, "eos_token_id": 2, "bos_token_id": 1
})";

// Qwen3-30B-A3B's config.json (abridged to the fields the engine reads, plus two it ignores).
constexpr char kQwen3Moe[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
  "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
  "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
  "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
  "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
  "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
  "output_router_logits": false, "router_aux_loss_coef": 0.001, "tie_word_embeddings": false,
  "use_sliding_window": false, "sliding_window": null, "attention_bias": false
})";

// DeepSeek-V3's config.json (abridged: the fields the engine reads and a few it ignores).
constexpr char kDeepseekV3[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
  "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
  "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
  "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "first_k_dense_replace": 3,
  "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
  "norm_topk_prob": true, "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 1,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "attention_bias": false, "hidden_act": "silu", "tie_word_embeddings": false,
  "aux_loss_alpha": 0.001, "ep_size": 1, "seq_aux": true, "bos_token_id": 0, "eos_token_id": 1
})";

// Fingerprint of kQwen2; a change here breaks handshakes between old and new builds.
constexpr uint64_t kQwen2Fingerprint = 9780605419320660778ull;

ModelConfig ParseOk(const std::string& text) {
  Result<ModelConfig> c = ModelConfig::FromJson(text);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : ModelConfig{};
}

// Parses kLlama3 with one top-level field replaced (or removed when value is empty).
Result<ModelConfig> ParseLlamaWith(const std::string& key, const std::string& value) {
  nlohmann::json j = nlohmann::json::parse(kLlama3);
  if (value.empty()) {
    j.erase(key);
  } else {
    j[key] = nlohmann::json::parse(value);
  }
  return ModelConfig::FromJson(j.dump());
}

TEST(ConfigTest, ParsesLlama3WithRopeScaling) {
  ModelConfig c = ParseOk(kLlama3);
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.architecture_name, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_layers, 16);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 64);  // derived: hidden / heads
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
  EXPECT_EQ(c.MaxContext(), 131072);
}

TEST(ConfigTest, ParsesLinearRopeScalingWithLegacyTypeKey) {
  Result<ModelConfig> c = ParseLlamaWith("rope_scaling", R"({"type": "linear", "factor": 2.0})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 2.0);
}

TEST(ConfigTest, ReadsNewerRopeParametersAndDtypeKeys) {
  nlohmann::json j = nlohmann::json::parse(kLlama3);
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j.erase("torch_dtype");
  j["dtype"] = "float16";
  j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 250000.0},
                          {"factor", 16.0},          {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  ModelConfig c = ParseOk(j.dump());
  EXPECT_DOUBLE_EQ(c.rope_theta, 250000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 16.0);
  EXPECT_EQ(c.torch_dtype, "float16");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  c = ParseOk(j.dump());
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
}

TEST(ConfigTest, DefaultsKvHeadsToHeads) {
  Result<ModelConfig> c = ParseLlamaWith("num_key_value_heads", "");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->num_kv_heads, 32);
}

TEST(ConfigTest, ParsesQwen2WithQkvBias) {
  ModelConfig c = ParseOk(kQwen2);
  EXPECT_EQ(c.arch, Architecture::kQwen2);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
  // use_sliding_window is false: the window does not apply.
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{151643});
}

TEST(ConfigTest, ParsesQwen3WithQkNormAndExplicitHeadDim) {
  ModelConfig c = ParseOk(kQwen3);
  EXPECT_EQ(c.arch, Architecture::kQwen3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.head_dim, 128);           // not hidden / heads (= 64)
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);  // an integer in the file
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
}

// Each case edits one top-level field of `base` (an empty value removes it); the config must be
// refused with a message naming `field`.
using FieldEdits = std::vector<std::pair<std::pair<std::string, std::string>, std::string>>;
void ExpectFieldErrors(const char* base, const FieldEdits& cases) {
  for (const auto& [edit, field] : cases) {
    nlohmann::json j = nlohmann::json::parse(base);
    if (edit.second.empty()) {
      j.erase(edit.first);
    } else {
      j[edit.first] = nlohmann::json::parse(edit.second);
    }
    Result<ModelConfig> c = ModelConfig::FromJson(j.dump());
    ASSERT_FALSE(c.ok()) << edit.first << " = " << edit.second;
    EXPECT_TRUE(Mentions(c.status().message(), field)) << c.status().ToString();
  }
}

TEST(ConfigTest, ParsesQwen3MoeExperts) {
  ModelConfig c = ParseOk(kQwen3Moe);
  EXPECT_EQ(c.arch, Architecture::kQwen3Moe);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.moe.num_experts, 128);
  EXPECT_EQ(c.moe.experts_per_token, 8);
  EXPECT_EQ(c.moe.expert_intermediate, 768);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  for (int layer = 0; layer < 48; ++layer) EXPECT_TRUE(c.IsMoeLayer(layer)) << layer;

  // decoder_sparse_step 2 and mlp_only_layers: layer i is MoE iff (i + 1) % 2 == 0 and i is
  // not listed; norm_topk_prob defaults to false (Qwen3MoeConfig).
  nlohmann::json j = nlohmann::json::parse(kQwen3Moe);
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3, 10};
  j.erase("norm_topk_prob");
  c = ParseOk(j.dump());
  EXPECT_FALSE(c.moe.norm_topk_prob);
  std::vector<int> moe_layers;
  for (int layer = 0; layer < 12; ++layer) {
    if (c.IsMoeLayer(layer)) moe_layers.push_back(layer);
  }
  EXPECT_EQ(moe_layers, (std::vector<int>{1, 5, 7, 9, 11}));
  EXPECT_NE(c.Fingerprint(), ParseOk(kQwen3Moe).Fingerprint());

  // num_experts 0: a valid config whose layers are all dense.
  j["num_experts"] = 0;
  c = ParseOk(j.dump());
  EXPECT_FALSE(c.IsMoeLayer(1));
}

TEST(ConfigTest, ParsesDeepseekV3LatentAttentionAndRouting) {
  ModelConfig c = ParseOk(kDeepseekV3);
  EXPECT_EQ(c.arch, Architecture::kDeepseekV3);
  ASSERT_TRUE(c.is_mla());
  EXPECT_EQ(c.mla.q_lora_rank, 1536);
  EXPECT_EQ(c.mla.latent_dim(), 576);
  EXPECT_EQ(c.num_kv_heads, 1);  // the latent, whatever num_key_value_heads says
  EXPECT_EQ(c.head_dim, 576);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_EQ(c.moe.num_experts, 256);
  EXPECT_EQ(c.moe.shared_experts, 1);
  EXPECT_EQ(c.moe.topk_method, MoeConfig::TopK::kNoAuxTc);
  EXPECT_EQ(c.moe.scoring, MoeConfig::Scoring::kSigmoid);
  EXPECT_EQ(c.moe.n_group, 8);
  EXPECT_EQ(c.moe.topk_group, 4);
  EXPECT_DOUBLE_EQ(c.moe.routed_scaling_factor, 2.5);
  EXPECT_FALSE(c.IsMoeLayer(2));  // first_k_dense_replace 3
  EXPECT_TRUE(c.IsMoeLayer(3));
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kYarn);
  // The softmax scale: 1/sqrt(192) * (0.1 * 1.0 * ln 40 + 1)^2 = 0.135234 (the number other
  // engines missed; it only shows from the second position on).
  EXPECT_NEAR(c.softmax_scale(), 0.135234, 1e-6);
  ModelConfig back = ParseOk(c.ToJson());
  EXPECT_EQ(back.Fingerprint(), c.Fingerprint());
  EXPECT_EQ(back.moe.n_group, 8);

  // V2-Lite: q_proj (q_lora_rank null), greedy softmax, mscale_all_dim 0.707.
  nlohmann::json j = nlohmann::json::parse(kDeepseekV3);
  j["architectures"] = {"DeepseekV2ForCausalLM"};
  j["q_lora_rank"] = nullptr;
  j["rope_scaling"]["mscale"] = 0.707;
  j["rope_scaling"]["mscale_all_dim"] = 0.707;
  j.erase("topk_method");
  j.erase("scoring_func");
  c = ParseOk(j.dump());
  EXPECT_EQ(c.mla.q_lora_rank, 0);
  EXPECT_EQ(c.moe.topk_method, MoeConfig::TopK::kGreedy);
  EXPECT_EQ(c.moe.scoring, MoeConfig::Scoring::kSoftmax);
  EXPECT_TRUE(c.moe.scale_only_unnormalised);
  EXPECT_NEAR(c.softmax_scale(), 0.114721, 1e-6);
}

TEST(ConfigTest, BadDeepseekFieldsAreNamed) {
  const FieldEdits cases = {
      {{"n_group", "7"}, "n_group"},  // does not divide 256 experts
      {{"topk_group", "9"}, "topk_group"},
      {{"kv_lora_rank", ""}, "kv_lora_rank"},
      {{"qk_rope_head_dim", "63"}, "qk_rope_head_dim"},
      {{"topk_method", "\"random\""}, "topk_method"},
      {{"scoring_func", "\"tanh\""}, "scoring_func"},
      {{"num_experts_per_tok", ""}, "num_experts_per_tok"},
  };
  ExpectFieldErrors(kDeepseekV3, cases);
}

TEST(ConfigTest, BadQwen3MoeFieldsAreNamed) {
  const FieldEdits cases = {
      {{"num_experts_per_tok", ""}, "num_experts_per_tok"},
      {{"num_experts_per_tok", "129"}, "num_experts_per_tok"},
      {{"moe_intermediate_size", "0"}, "moe_intermediate_size"},
      {{"decoder_sparse_step", "0"}, "decoder_sparse_step"},
      {{"mlp_only_layers", "[48]"}, "mlp_only_layers"},
      {{"mlp_only_layers", "\"all\""}, "mlp_only_layers"},
      {{"num_experts", ""}, "num_experts"},
  };
  ExpectFieldErrors(kQwen3Moe, cases);
}

TEST(ConfigTest, RejectsAttentionBiasOutsideQwen2) {
  nlohmann::json j = nlohmann::json::parse(kQwen3);
  j["attention_bias"] = true;
  Result<ModelConfig> c = ModelConfig::FromJson(j.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Mentions(c.status().message(), "attention_bias"));
}

TEST(ConfigTest, ParsesMistralSlidingWindow) {
  ModelConfig c = ParseOk(kMistral);
  EXPECT_EQ(c.arch, Architecture::kMistral);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.MaxContext(), 4096);
  nlohmann::json j = nlohmann::json::parse(kMistral);
  j["sliding_window"] = nullptr;
  ModelConfig no_window = ParseOk(j.dump());
  EXPECT_FALSE(no_window.sliding_window.has_value());
  EXPECT_EQ(no_window.MaxContext(), 32768);
}

TEST(ConfigTest, UnsupportedArchitectureNamesItAndTheSupportedOnes) {
  Result<ModelConfig> c = ParseLlamaWith("architectures", R"(["GPT2LMHeadModel"])");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(c.status().message(), "GPT2LMHeadModel"));
  EXPECT_TRUE(Mentions(c.status().message(), "Qwen2ForCausalLM"));
  EXPECT_TRUE(Mentions(c.status().message(), "MistralForCausalLM"));
}

TEST(ConfigTest, FallsBackToModelType) {
  nlohmann::json j = nlohmann::json::parse(kQwen2);
  j.erase("architectures");
  EXPECT_EQ(ParseOk(j.dump()).arch, Architecture::kQwen2);
}

TEST(ConfigTest, MissingFieldIsNamed) {
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "vocab_size"}) {
    Result<ModelConfig> c = ParseLlamaWith(key, "");
    ASSERT_FALSE(c.ok()) << key;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Mentions(c.status().message(), key));
  }
}

TEST(ConfigTest, BadTypesAreNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {"hidden_size", R"("2048")"},     {"num_hidden_layers", "16.5"},
      {"rope_theta", R"("big")"},       {"tie_word_embeddings", R"("yes")"},
      {"eos_token_id", R"("</s>")"},    {"eos_token_id", R"([1, "x"])"},
      {"rope_scaling", "[1, 2]"},       {"architectures", R"("LlamaForCausalLM")"},
      {"vocab_size", "99999999999999"}, {"rms_norm_eps", "true"},
  };
  for (const auto& [key, value] : cases) {
    Result<ModelConfig> c = ParseLlamaWith(key, value);
    ASSERT_FALSE(c.ok()) << key << "=" << value;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Mentions(c.status().message(), key)) << c.status().ToString();
  }
}

TEST(ConfigTest, InconsistentSizesAreRejected) {
  Result<ModelConfig> c = ParseLlamaWith("num_key_value_heads", "5");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Mentions(c.status().message(), "num_key_value_heads"));
  c = ParseLlamaWith("hidden_size", "0");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Mentions(c.status().message(), "hidden_size"));
  c = ParseLlamaWith("num_hidden_layers", "-3");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Mentions(c.status().message(), "num_hidden_layers"));
  c = ParseLlamaWith("hidden_size", "2050");  // not divisible by 32 heads, no head_dim
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Mentions(c.status().message(), "head_dim"));
  c = ParseLlamaWith("head_dim", "63");  // RoPE needs an even head_dim
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Mentions(c.status().message(), "head_dim"));
}

TEST(ConfigTest, UnsupportedFeaturesAreRejected) {
  EXPECT_FALSE(ParseLlamaWith("hidden_act", R"("gelu")").ok());
  EXPECT_FALSE(ParseLlamaWith("mlp_bias", "true").ok());
  Result<ModelConfig> c = ParseLlamaWith("rope_scaling", R"({"rope_type": "yarn", "factor": 4})");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Mentions(c.status().message(), "yarn"));
  c = ParseLlamaWith("rope_scaling", R"({"rope_type": "llama3", "factor": 8})");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Mentions(c.status().message(), "low_freq_factor"));
}

TEST(ConfigTest, BadJsonIsAnError) {
  for (const char* text : {"", "{", "[1, 2]", "{\"hidden_size\": }", "null"}) {
    Result<ModelConfig> c = ModelConfig::FromJson(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Mentions(c.status().message(), "config.json"));
  }
}

TEST(ConfigTest, ToJsonRoundTripsEveryArchitecture) {
  for (const char* text : {kLlama3, kQwen2, kQwen3, kMistral, kQwen3Moe, kDeepseekV3}) {
    ModelConfig a = ParseOk(text);
    ModelConfig b = ParseOk(a.ToJson());
    EXPECT_EQ(b.arch, a.arch);
    EXPECT_EQ(b.hidden_size, a.hidden_size);
    EXPECT_EQ(b.intermediate_size, a.intermediate_size);
    EXPECT_EQ(b.num_layers, a.num_layers);
    EXPECT_EQ(b.num_heads, a.num_heads);
    EXPECT_EQ(b.num_kv_heads, a.num_kv_heads);
    EXPECT_EQ(b.head_dim, a.head_dim);
    EXPECT_EQ(b.vocab_size, a.vocab_size);
    EXPECT_EQ(b.max_position_embeddings, a.max_position_embeddings);
    EXPECT_EQ(b.rms_norm_eps, a.rms_norm_eps);
    EXPECT_EQ(b.rope_theta, a.rope_theta);
    EXPECT_EQ(b.rope_scaling.type, a.rope_scaling.type);
    EXPECT_EQ(b.rope_scaling.factor, a.rope_scaling.factor);
    EXPECT_EQ(b.tie_word_embeddings, a.tie_word_embeddings);
    EXPECT_EQ(b.qkv_bias, a.qkv_bias);
    EXPECT_EQ(b.qk_norm, a.qk_norm);
    EXPECT_EQ(b.sliding_window, a.sliding_window);
    EXPECT_EQ(b.bos_token_id, a.bos_token_id);
    EXPECT_EQ(b.eos_token_ids, a.eos_token_ids);
    EXPECT_EQ(b.Fingerprint(), a.Fingerprint());
  }
}

TEST(ConfigTest, FingerprintIsStableAndSeesForwardFields) {
  ModelConfig a = ParseOk(kQwen2);
  // The handshake compares fingerprints across builds and machines: the value must not drift.
  EXPECT_EQ(a.Fingerprint(), ParseOk(kQwen2).Fingerprint());
  EXPECT_EQ(a.Fingerprint(), kQwen2Fingerprint);
  ModelConfig b = a;
  b.eos_token_ids = {7};  // not forward-relevant
  EXPECT_EQ(a.Fingerprint(), b.Fingerprint());
  for (auto mutate : std::vector<void (*)(ModelConfig&)>{
           [](ModelConfig& c) { c.num_layers += 1; },
           [](ModelConfig& c) { c.rope_theta = 10000; },
           [](ModelConfig& c) { c.rms_norm_eps = 1e-5; },
           [](ModelConfig& c) { c.tie_word_embeddings = false; },
           [](ModelConfig& c) { c.qkv_bias = false; },
           [](ModelConfig& c) { c.num_kv_heads = 1; },
       }) {
    ModelConfig m = a;
    mutate(m);
    EXPECT_NE(m.Fingerprint(), a.Fingerprint());
  }
}

TEST(ConfigTest, LoadMergesGenerationConfigEos) {
  ScopedTempDir tmp("pd_config_");
  const std::string& dir = tmp.path();
  std::ofstream(dir + "/config.json") << kQwen2;
  std::ofstream(dir + "/generation_config.json")
      << R"({"bos_token_id": 151643, "eos_token_id": [151645, 151643]})";
  Result<ModelConfig> c = ModelConfig::Load(dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{151643, 151645}));
}

TEST(ConfigTest, LoadErrorsNameTheFile) {
  ScopedTempDir tmp("pd_config_");
  const std::string& dir = tmp.path();
  Result<ModelConfig> c = ModelConfig::Load(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Mentions(c.status().message(), dir + "/config.json"));

  std::ofstream(dir + "/config.json") << R"({"architectures": ["BertModel"]})";
  c = ModelConfig::Load(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Mentions(c.status().message(), dir + "/config.json"));
  EXPECT_TRUE(Mentions(c.status().message(), "BertModel"));

  std::ofstream(dir + "/config.json", std::ios::trunc) << kQwen2;
  std::ofstream(dir + "/generation_config.json") << R"({"eos_token_id": "x"})";
  c = ModelConfig::Load(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Mentions(c.status().message(), "generation_config.json"));
}

TEST(ConfigTest, LoadsSharedStories260K) {
  PD_REQUIRE_SHARED("models/stories260K");
  Result<ModelConfig> c = ModelConfig::Load(pdserve::testing::SharedPath("models/stories260K"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->num_layers, 5);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->eos_token_ids, std::vector<int>{2});
}

}  // namespace
}  // namespace pdserve
