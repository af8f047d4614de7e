#include "model/weights.h"

#include <cstring>
#include <fstream>
#include <map>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "loader_test_util.h"
#include "model/safetensors.h"
#include "testing/test_paths.h"

namespace pdserve {
namespace {

using pdserve::testing::Mentions;
using pdserve::testing::ScopedTempDir;

ModelConfig SmallConfig(Architecture arch, bool tied) {
  ModelConfig c;
  c.arch = arch;
  c.architecture_name = arch == Architecture::kQwen2   ? "Qwen2ForCausalLM"
                        : arch == Architecture::kQwen3 ? "Qwen3ForCausalLM"
                                                       : "LlamaForCausalLM";
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 6;  // deliberately not hidden / heads
  c.vocab_size = 40;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  c.qkv_bias = arch == Architecture::kQwen2;
  c.qk_norm = arch == Architecture::kQwen3;
  return c;
}

// Every tensor name and shape a checkpoint of `c` holds, in Hugging Face naming.
std::map<std::string, std::vector<int64_t>> CheckpointShapes(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = int64_t{c.num_heads} * c.head_dim,
                kv = int64_t{c.num_kv_heads} * c.head_dim, f = c.intermediate_size;
  std::map<std::string, std::vector<int64_t>> s;
  s["model.embed_tokens.weight"] = {c.vocab_size, h};
  s["model.norm.weight"] = {h};
  if (!c.tie_word_embeddings) s["lm_head.weight"] = {c.vocab_size, h};
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    s[p + "input_layernorm.weight"] = {h};
    s[p + "post_attention_layernorm.weight"] = {h};
    s[p + "self_attn.q_proj.weight"] = {q, h};
    s[p + "self_attn.k_proj.weight"] = {kv, h};
    s[p + "self_attn.v_proj.weight"] = {kv, h};
    s[p + "self_attn.o_proj.weight"] = {h, q};
    if (c.IsMoeLayer(i)) {
      const int64_t fe = c.moe.expert_intermediate;
      s[p + "mlp.gate.weight"] = {c.moe.num_experts, h};
      for (int e = 0; e < c.moe.num_experts; ++e) {
        const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
        s[ep + "gate_proj.weight"] = {fe, h};
        s[ep + "up_proj.weight"] = {fe, h};
        s[ep + "down_proj.weight"] = {h, fe};
      }
    } else {
      s[p + "mlp.gate_proj.weight"] = {f, h};
      s[p + "mlp.up_proj.weight"] = {f, h};
      s[p + "mlp.down_proj.weight"] = {h, f};
    }
    if (c.qkv_bias) {
      s[p + "self_attn.q_proj.bias"] = {q};
      s[p + "self_attn.k_proj.bias"] = {kv};
      s[p + "self_attn.v_proj.bias"] = {kv};
    }
    if (c.qk_norm) {
      s[p + "self_attn.q_norm.weight"] = {c.head_dim};
      s[p + "self_attn.k_norm.weight"] = {c.head_dim};
    }
  }
  return s;
}

// A checkpoint on disk: random values per tensor, stored in `dtype`.
struct Checkpoint {
  ScopedTempDir tmp{"pd_weights_"};
  std::string dir = tmp.path();
  std::map<std::string, std::vector<uint8_t>> bytes;  // as stored
  DType dtype = DType::kF32;
};

Checkpoint WriteCheckpoint(DType dtype, std::map<std::string, std::vector<int64_t>> shapes) {
  Checkpoint ck;
  ck.dtype = dtype;
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> values(n);
    for (float& v : values) v = normal(rng);
    std::vector<uint8_t>& b = ck.bytes[name];
    b.resize(n * DTypeSize(dtype));
    ConvertFromF32(dtype, values.data(), b.data(), n);
    tensors.push_back({name, dtype, shape, b.data()});
  }
  EXPECT_TRUE(WriteSafetensors(ck.dir + "/model.safetensors", tensors).ok());
  return ck;
}

// Element i of a stored tensor, as float.
float StoredValue(const Checkpoint& ck, const std::string& name, size_t i) {
  float v;
  ConvertToF32(ck.dtype, ck.bytes.at(name).data() + i * DTypeSize(ck.dtype), &v, 1);
  return v;
}

float HeldValue(const Tensor& t, size_t i) {
  float v;
  ConvertToF32(t.dtype(), static_cast<const uint8_t*>(t.data()) + i * DTypeSize(t.dtype()), &v, 1);
  return v;
}

TEST(TensorTest, AlignedZeroFilledMoveOnly) {
  Tensor t(DType::kBF16, {3, 5});
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.nbytes(), 30u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t.as<uint16_t>()[i], 0);
  Tensor moved = std::move(t);
  EXPECT_EQ(moved.dim(1), 5);
  EXPECT_TRUE(Tensor().empty());
  EXPECT_EQ(Tensor().numel(), 0);
}

TEST(WeightsTest, F32CheckpointStaysF32) {
  ModelConfig c = SmallConfig(Architecture::kLlama, /*tied=*/true);
  Checkpoint ck = WriteCheckpoint(DType::kF32, CheckpointShapes(c));
  Result<ModelWeights> w = LoadWeights(c, ck.dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->matrix_dtype, DType::kF32);
  ASSERT_EQ(w->layers.size(), 2u);
  const Tensor& down = w->layers[1].down_proj;
  EXPECT_EQ(down.dtype(), DType::kF32);
  EXPECT_EQ(down.shape(), (std::vector<int64_t>{16, 24}));
  EXPECT_EQ(std::memcmp(down.data(), ck.bytes["model.layers.1.mlp.down_proj.weight"].data(),
                        down.nbytes()),
            0);
  EXPECT_EQ(std::memcmp(w->final_norm.data(), ck.bytes["model.norm.weight"].data(), 64), 0);
}

TEST(WeightsTest, Bf16CheckpointKeepsBitsAndWidensNorms) {
  ModelConfig c = SmallConfig(Architecture::kLlama, true);
  Checkpoint ck = WriteCheckpoint(DType::kBF16, CheckpointShapes(c));
  Result<ModelWeights> w = LoadWeights(c, ck.dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->matrix_dtype, DType::kBF16);
  const Tensor& q = w->layers[0].q_proj;
  EXPECT_EQ(q.dtype(), DType::kBF16);
  EXPECT_EQ(q.shape(), (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(
      std::memcmp(q.data(), ck.bytes["model.layers.0.self_attn.q_proj.weight"].data(), q.nbytes()),
      0);
  const Tensor& norm = w->layers[0].input_norm;
  EXPECT_EQ(norm.dtype(), DType::kF32);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(norm.as<float>()[i], StoredValue(ck, "model.layers.0.input_layernorm.weight", i));
  }
}

TEST(WeightsTest, F16BecomesBf16WithCorrectValues) {
  ModelConfig c = SmallConfig(Architecture::kLlama, true);
  Checkpoint ck = WriteCheckpoint(DType::kF16, CheckpointShapes(c));
  Result<ModelWeights> w = LoadWeights(c, ck.dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->matrix_dtype, DType::kBF16);
  const std::string name = "model.layers.1.mlp.gate_proj.weight";
  const Tensor& gate = w->layers[1].gate_proj;
  ASSERT_EQ(gate.dtype(), DType::kBF16);
  for (size_t i = 0; i < 24 * 16; ++i) {
    const uint16_t f16 = reinterpret_cast<const uint16_t*>(ck.bytes[name].data())[i];
    ASSERT_EQ(gate.as<uint16_t>()[i], F32ToBF16(F16ToF32(f16))) << i;
  }
  // Spot values: F16 1.0 (0x3c00) is BF16 0x3f80; F16 -2.0 (0xc000) is BF16 0xc000.
  EXPECT_EQ(F32ToBF16(F16ToF32(0x3c00)), 0x3f80);
  EXPECT_EQ(F32ToBF16(F16ToF32(0xc000)), 0xc000);
  EXPECT_EQ(w->final_norm.dtype(), DType::kF32);
  EXPECT_EQ(w->final_norm.as<float>()[3], StoredValue(ck, "model.norm.weight", 3));
}

TEST(WeightsTest, ForcedDtypes) {
  ModelConfig c = SmallConfig(Architecture::kLlama, true);
  Checkpoint bf16 = WriteCheckpoint(DType::kBF16, CheckpointShapes(c));
  Result<ModelWeights> w = LoadWeights(c, bf16.dir, DType::kF32);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->embed.dtype(), DType::kF32);
  EXPECT_EQ(w->embed.as<float>()[7], StoredValue(bf16, "model.embed_tokens.weight", 7));

  Checkpoint f32 = WriteCheckpoint(DType::kF32, CheckpointShapes(c));
  w = LoadWeights(c, f32.dir, DType::kBF16);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->embed.dtype(), DType::kBF16);
  EXPECT_EQ(w->embed.as<uint16_t>()[7],
            F32ToBF16(StoredValue(f32, "model.embed_tokens.weight", 7)));

  // F16 is a checkpoint type, but no kernel multiplies F16 matrices: a clear error, not a crash.
  w = LoadWeights(c, f32.dir, DType::kF16);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().ToString().find("f16"), std::string::npos) << w.status().ToString();
}

TEST(WeightsTest, TiedAndUntiedOutput) {
  ModelConfig tied = SmallConfig(Architecture::kLlama, true);
  Checkpoint ck = WriteCheckpoint(DType::kBF16, CheckpointShapes(tied));
  Result<ModelWeights> w = LoadWeights(tied, ck.dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(w->lm_head.empty());
  EXPECT_EQ(&w->output_matrix(), &w->embed);

  ModelConfig untied = SmallConfig(Architecture::kLlama, false);
  // The tied checkpoint lacks lm_head: an untied config cannot use it.
  Result<ModelWeights> missing = LoadWeights(untied, ck.dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Mentions(missing.status().message(), "lm_head.weight"));
  EXPECT_TRUE(Mentions(missing.status().message(), "tie_word_embeddings"));

  Checkpoint ck2 = WriteCheckpoint(DType::kBF16, CheckpointShapes(untied));
  w = LoadWeights(untied, ck2.dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_FALSE(w->lm_head.empty());
  EXPECT_EQ(&w->output_matrix(), &w->lm_head);
  EXPECT_EQ(std::memcmp(w->lm_head.data(), ck2.bytes["lm_head.weight"].data(), w->lm_head.nbytes()),
            0);
  // Layer matrices plus the output matrix: 2 * (24*16 + 2*12*16 + 16*24 + 3*24*16) + 40*16.
  EXPECT_EQ(w->MatrixBytes(), 2u * (2 * (384 + 384 + 384 + 1152) + 640));
}

TEST(WeightsTest, Qwen2BiasesAndQwen3Norms) {
  ModelConfig q2 = SmallConfig(Architecture::kQwen2, true);
  Checkpoint ck = WriteCheckpoint(DType::kBF16, CheckpointShapes(q2));
  Result<ModelWeights> w = LoadWeights(q2, ck.dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->layers[1].k_bias.dtype(), DType::kF32);
  EXPECT_EQ(w->layers[1].k_bias.shape(), std::vector<int64_t>{12});
  EXPECT_EQ(w->layers[1].k_bias.as<float>()[5],
            StoredValue(ck, "model.layers.1.self_attn.k_proj.bias", 5));
  EXPECT_TRUE(w->layers[1].q_norm.empty());

  ModelConfig q3 = SmallConfig(Architecture::kQwen3, true);
  ck = WriteCheckpoint(DType::kBF16, CheckpointShapes(q3));
  w = LoadWeights(q3, ck.dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->layers[0].q_norm.shape(), std::vector<int64_t>{6});
  EXPECT_EQ(w->layers[0].k_norm.as<float>()[2],
            StoredValue(ck, "model.layers.0.self_attn.k_norm.weight", 2));
  EXPECT_TRUE(w->layers[0].q_bias.empty());

  // A Qwen2 config over a checkpoint without biases names the first missing bias.
  Result<ModelWeights> bad = LoadWeights(q2, ck.dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Mentions(bad.status().message(), "model.layers.0.self_attn.q_proj.bias"));
}

TEST(WeightsTest, MissingTensorIsNamed) {
  ModelConfig c = SmallConfig(Architecture::kLlama, true);
  auto shapes = CheckpointShapes(c);
  shapes.erase("model.layers.1.mlp.up_proj.weight");
  Checkpoint ck = WriteCheckpoint(DType::kBF16, shapes);
  Result<ModelWeights> w = LoadWeights(c, ck.dir);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Mentions(w.status().message(), "model.layers.1.mlp.up_proj.weight"));
}

// Qwen3-MoE: layer 0 dense (mlp_only_layers), layer 1 experts. The router is held in F32 (the
// choices must not hang on rounding) while the experts take the matrix dtype; a missing expert
// is named.
TEST(WeightsTest, MoeLayersLoadRouterAndExperts) {
  ModelConfig c = SmallConfig(Architecture::kQwen3, false);
  c.arch = Architecture::kQwen3Moe;
  c.architecture_name = "Qwen3MoeForCausalLM";
  c.moe.num_experts = 4;
  c.moe.experts_per_token = 2;
  c.moe.expert_intermediate = 8;
  c.moe.norm_topk_prob = true;
  c.moe.dense_layers = {0};
  ASSERT_TRUE(c.Validate().ok());
  auto shapes = CheckpointShapes(c);
  {
    Checkpoint ck = WriteCheckpoint(DType::kBF16, shapes);
    Result<ModelWeights> w = LoadWeights(c, ck.dir);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_FALSE(w->layers[0].gate_proj.empty());
    EXPECT_TRUE(w->layers[0].experts.empty());
    const LayerWeights& moe = w->layers[1];
    EXPECT_TRUE(moe.gate_proj.empty());
    EXPECT_EQ(moe.router.dtype(), DType::kF32);
    EXPECT_EQ(moe.router.shape(), (std::vector<int64_t>{4, 16}));
    ASSERT_EQ(moe.experts.size(), 4u);
    EXPECT_EQ(moe.experts[3].down_proj.dtype(), DType::kBF16);
    EXPECT_EQ(moe.experts[3].down_proj.shape(), (std::vector<int64_t>{16, 8}));
    EXPECT_EQ(HeldValue(moe.router, 5), StoredValue(ck, "model.layers.1.mlp.gate.weight", 5));
  }
  shapes.erase("model.layers.1.mlp.experts.3.up_proj.weight");
  Checkpoint ck = WriteCheckpoint(DType::kBF16, shapes);
  Result<ModelWeights> w = LoadWeights(c, ck.dir);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Mentions(w.status().message(), "model.layers.1.mlp.experts.3.up_proj.weight"));
}

TEST(WeightsTest, WrongShapeIsNamed) {
  ModelConfig c = SmallConfig(Architecture::kLlama, true);
  auto shapes = CheckpointShapes(c);
  shapes["model.layers.0.self_attn.k_proj.weight"] = {16, 12};  // transposed
  Checkpoint ck = WriteCheckpoint(DType::kBF16, shapes);
  Result<ModelWeights> w = LoadWeights(c, ck.dir);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(w.status().message(), "model.layers.0.self_attn.k_proj.weight"));
  EXPECT_TRUE(Mentions(w.status().message(), "[16, 12]"));
  EXPECT_TRUE(Mentions(w.status().message(), "[12, 16]"));
  EXPECT_TRUE(Mentions(w.status().message(), "model.safetensors"));
}

TEST(WeightsTest, ShardedCheckpointWithIndex) {
  ModelConfig c = SmallConfig(Architecture::kLlama, false);
  auto shapes = CheckpointShapes(c);
  ScopedTempDir tmp("pd_weights_");
  const std::string& dir = tmp.path();
  std::mt19937 rng(7);
  std::vector<std::vector<uint16_t>> storage;
  std::vector<TensorToWrite> shard[2];
  nlohmann::json weight_map;
  int k = 0;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    storage.emplace_back(n);
    for (uint16_t& v : storage.back()) v = F32ToBF16(static_cast<float>(rng() % 100) / 50.0f);
    int s = k++ % 2;
    shard[s].push_back({name, DType::kBF16, shape, storage.back().data()});
    weight_map[name] = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
  }
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(WriteSafetensors(
                    dir + "/model-0000" + std::to_string(s + 1) + "-of-00002.safetensors", shard[s])
                    .ok());
  }
  std::ofstream(dir + "/model.safetensors.index.json")
      << nlohmann::json{{"weight_map", weight_map}}.dump();
  Result<ModelWeights> w = LoadWeights(c, dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  // Spot-check one tensor from each shard.
  size_t i = 0;
  for (const TensorToWrite& t : {shard[0][0], shard[1][0]}) {
    const Tensor* held = t.name == "lm_head.weight"              ? &w->lm_head
                         : t.name == "model.embed_tokens.weight" ? &w->embed
                                                                 : nullptr;
    if (held == nullptr) continue;
    ++i;
    EXPECT_EQ(std::memcmp(held->data(), t.data, held->nbytes()), 0) << t.name;
  }
  EXPECT_EQ(i, 2u);  // map order puts lm_head and embed_tokens first, one in each shard
}

TEST(WeightsTest, LargeTensorConvertsAcrossChunks) {
  ModelConfig c = SmallConfig(Architecture::kLlama, true);
  c.vocab_size = 70001;  // embed = 1,120,016 elements: more than one conversion chunk
  Checkpoint ck = WriteCheckpoint(DType::kF16, CheckpointShapes(c));
  Result<ModelWeights> w = LoadWeights(c, ck.dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const auto* f16 = reinterpret_cast<const uint16_t*>(ck.bytes["model.embed_tokens.weight"].data());
  const size_t n = static_cast<size_t>(w->embed.numel());
  size_t mismatches = 0;
  for (size_t i = 0; i < n; ++i)
    mismatches += w->embed.as<uint16_t>()[i] != F32ToBF16(F16ToF32(f16[i]));
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w->embed.data()) % 64, 0u);
}

TEST(WeightsTest, LoadsSharedStories260K) {
  PD_REQUIRE_SHARED("models/stories260K");
  const std::string dir = pdserve::testing::SharedPath("models/stories260K");
  Result<ModelConfig> c = ModelConfig::Load(dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Result<ModelWeights> w = LoadWeights(*c, dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->matrix_dtype, DType::kF32);
  EXPECT_EQ(w->embed.shape(), (std::vector<int64_t>{512, 64}));
  EXPECT_TRUE(w->lm_head.empty());
  ASSERT_EQ(w->layers.size(), 5u);
  EXPECT_EQ(w->layers[4].k_proj.shape(), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(w->layers[4].down_proj.shape(), (std::vector<int64_t>{64, 172}));
  auto set = SafetensorsSet::Open(dir);
  ASSERT_TRUE(set.ok());
  auto view = (*set)->Find("model.layers.3.mlp.up_proj.weight");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(std::memcmp(w->layers[3].up_proj.data(), view->data, view->nbytes), 0);
  EXPECT_NE(HeldValue(w->final_norm, 0), 0.0f);
}

}  // namespace
}  // namespace pdserve
