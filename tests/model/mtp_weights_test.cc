// DeepSeek-V3's multi-token-prediction modules in the loader: num_nextn_predict_layers read and
// written back, each module's tensors (model.layers.{num_layers + k}.*, as V3 names them)
// loaded with the shapes and dtypes of a decoder layer's (FP8 kept FP8), a missing one refused
// by name, none asked for when the count is 0, the copies of the embedding and the lm_head that
// V3 stores taken as shared (not loaded) and a head of its own loaded.
#include <cstring>

#include <gtest/gtest.h>

#include "loader_test_util.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/weights.h"
#include "testing/test_models.h"

namespace pdserve {
namespace {

using pdserve::testing::CopyModelDir;
using pdserve::testing::Mentions;
using pdserve::testing::ScopedTempDir;
using pdserve::testing::SyntheticModelDir;

constexpr char kMtp[] = "model.layers.3.";  // deepseek-v3-tiny: 3 decoder layers, then MTP 0

bool IsMtpTensor(const std::string& name) { return name.starts_with(kMtp); }

Result<ModelWeights> LoadDir(const std::string& dir) {
  PD_ASSIGN_OR_RETURN(ModelConfig c, ModelConfig::Load(dir));
  return LoadWeights(c, dir);
}

TEST(MtpConfigTest, CountIsReadWrittenAndKeptOutOfTheFingerprint) {
  Result<ModelConfig> v3 = SyntheticPresetConfig("deepseek-v3-tiny");
  ASSERT_TRUE(v3.ok());
  EXPECT_EQ(v3->num_nextn_predict_layers, 1);
  Result<ModelConfig> back = ModelConfig::FromJson(v3->ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->num_nextn_predict_layers, 1);
  EXPECT_TRUE(Mentions(v3->ToJson(), "\"num_nextn_predict_layers\": 1"));
  // Absent: no module (the checkpoint need not hold any).
  ModelConfig none = *v3;
  none.num_nextn_predict_layers = 0;
  std::string text = none.ToJson();
  const size_t at = text.find("  \"num_nextn_predict_layers\": 0,\n");
  ASSERT_NE(at, std::string::npos) << text;
  text.erase(at, std::string("  \"num_nextn_predict_layers\": 0,\n").size());
  Result<ModelConfig> absent = ModelConfig::FromJson(text);
  ASSERT_TRUE(absent.ok()) << absent.status().ToString();
  EXPECT_EQ(absent->num_nextn_predict_layers, 0);
  // The plain forward pass does not run the modules: peers with and without them match.
  EXPECT_EQ(absent->Fingerprint(), v3->Fingerprint());

  ModelConfig bad = *v3;
  bad.num_nextn_predict_layers = -1;
  EXPECT_TRUE(Mentions(bad.Validate().message(), "num_nextn_predict_layers"));
  bad.num_nextn_predict_layers = 17;
  EXPECT_TRUE(Mentions(bad.Validate().message(), "num_nextn_predict_layers"));
  Result<ModelConfig> llama = SyntheticPresetConfig("tiny");
  ASSERT_TRUE(llama.ok());
  llama->num_nextn_predict_layers = 1;
  EXPECT_TRUE(Mentions(llama->Validate().message(), "num_nextn_predict_layers"));
}

TEST(MtpWeightsTest, ModulesLoadWithALayersShapes) {
  for (DType dtype : {DType::kBF16, DType::kF8E4M3}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::string dir = SyntheticModelDir("deepseek-v3-tiny", dtype);
    Result<ModelConfig> c = ModelConfig::Load(dir);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    Result<ModelWeights> w = LoadWeights(*c, dir);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_EQ(w->mtp.size(), 1u);
    const MtpModule& m = w->mtp[0];
    const int64_t h = c->hidden_size;
    EXPECT_EQ(m.enorm.shape(), (std::vector<int64_t>{h}));
    EXPECT_EQ(m.hnorm.shape(), (std::vector<int64_t>{h}));
    EXPECT_EQ(m.head_norm.shape(), (std::vector<int64_t>{h}));
    EXPECT_EQ(m.enorm.dtype(), DType::kF32);
    EXPECT_EQ(m.eh_proj.shape(), (std::vector<int64_t>{h, 2 * h}));
    EXPECT_EQ(m.eh_proj.dtype(), DType::kBF16);  // BF16 in V3's FP8 checkpoint too
    // V3 stores a copy of lm_head as shared_head.head: shared, not loaded.
    EXPECT_TRUE(m.head.empty());
    // The decoder layer: MLA with q_lora, and (layer index 3 >= first_k_dense_replace) experts,
    // in the types a decoder layer's tensors take (FP8 stays FP8).
    const LayerWeights& last = w->layers.back();
    const LayerWeights& l = m.layer;
    for (auto [mine, theirs] : {std::pair{&l.q_a_proj, &last.q_a_proj},
                                {&l.q_b_proj, &last.q_b_proj},
                                {&l.kv_a_proj, &last.kv_a_proj},
                                {&l.kv_b_proj, &last.kv_b_proj},
                                {&l.o_proj, &last.o_proj},
                                {&l.router, &last.router},
                                {&l.router_bias, &last.router_bias},
                                {&l.shared.down_proj, &last.shared.down_proj},
                                {&l.input_norm, &last.input_norm},
                                {&l.q_a_norm, &last.q_a_norm},
                                {&l.kv_a_norm, &last.kv_a_norm}}) {
      EXPECT_EQ(mine->shape(), theirs->shape());
      EXPECT_EQ(mine->dtype(), theirs->dtype());
      EXPECT_EQ(mine->row_scales().shape(), theirs->row_scales().shape());
    }
    EXPECT_EQ(l.q_b_proj.dtype(), dtype == DType::kF8E4M3 ? DType::kF8E4M3 : DType::kBF16);
    ASSERT_EQ(l.experts.size(), static_cast<size_t>(c->moe.num_experts));
    EXPECT_EQ(l.experts[15].up_proj.shape(), last.experts[15].up_proj.shape());
    EXPECT_EQ(l.experts[15].up_proj.dtype(), last.experts[15].up_proj.dtype());
    EXPECT_TRUE(l.gate_proj.empty());
    // The plain forward's bytes leave the modules out.
    ModelConfig without = *c;
    without.num_nextn_predict_layers = 0;
    Result<ModelWeights> plain = LoadWeights(without, dir);
    ASSERT_TRUE(plain.ok()) << plain.status().ToString();
    EXPECT_EQ(plain->MatrixBytes(), w->MatrixBytes());
  }
}

TEST(MtpWeightsTest, MissingModuleTensorIsNamed) {
  const std::string src = SyntheticModelDir("deepseek-v3-tiny");
  for (const char* missing :
       {"model.layers.3.eh_proj.weight", "model.layers.3.enorm.weight",
        "model.layers.3.shared_head.norm.weight", "model.layers.3.self_attn.kv_b_proj.weight",
        "model.layers.3.mlp.experts.7.down_proj.weight"}) {
    SCOPED_TRACE(missing);
    ScopedTempDir tmp("pd_mtp_");
    CopyModelDir(
        src, tmp.path(), [](ModelConfig&) {},
        [&](const std::string& name, std::vector<uint8_t>&) { return name != missing; });
    Result<ModelWeights> w = LoadDir(tmp.path());
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
    EXPECT_TRUE(Mentions(w.status().message(), missing));
    EXPECT_TRUE(Mentions(w.status().message(), "num_nextn_predict_layers 1"));
  }
}

TEST(MtpWeightsTest, NoModulesAskedNoneLoaded) {
  const std::string src = SyntheticModelDir("deepseek-v3-tiny");
  ScopedTempDir tmp("pd_mtp_");
  CopyModelDir(
      src, tmp.path(), [](ModelConfig& c) { c.num_nextn_predict_layers = 0; },
      [](const std::string& name, std::vector<uint8_t>&) { return !IsMtpTensor(name); });
  Result<ModelWeights> w = LoadDir(tmp.path());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(w->mtp.empty());
  EXPECT_EQ(w->layers.size(), 3u);
  // And with the tensors still there but not asked for: they are left unread.
  Result<ModelConfig> c = ModelConfig::Load(src);
  ASSERT_TRUE(c.ok());
  c->num_nextn_predict_layers = 0;
  Result<ModelWeights> unread = LoadWeights(*c, src);
  ASSERT_TRUE(unread.ok()) << unread.status().ToString();
  EXPECT_TRUE(unread->mtp.empty());
}

TEST(MtpWeightsTest, SharedCopiesAndAHeadOfItsOwn) {
  const std::string src = SyntheticModelDir("deepseek-v3-tiny");
  const std::string embed = std::string(kMtp) + "embed_tokens.weight";
  const std::string head = std::string(kMtp) + "shared_head.head.weight";
  auto set = SafetensorsSet::Open(src);
  ASSERT_TRUE(set.ok());
  ASSERT_TRUE((*set)->Has(embed) && (*set)->Has(head)) << "the preset writes V3's copies";
  auto flip_first = [](std::vector<uint8_t>& b) { b[0] ^= 0x01; };
  {
    // Both copies absent: the model's embedding and lm_head serve.
    ScopedTempDir tmp("pd_mtp_");
    CopyModelDir(
        src, tmp.path(), [](ModelConfig&) {},
        [&](const std::string& name, std::vector<uint8_t>&) {
          return name != embed && name != head;
        });
    Result<ModelWeights> w = LoadDir(tmp.path());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_EQ(w->mtp.size(), 1u);
    EXPECT_TRUE(w->mtp[0].head.empty());
  }
  {
    // A head that differs from lm_head is the module's own.
    ScopedTempDir tmp("pd_mtp_");
    CopyModelDir(
        src, tmp.path(), [](ModelConfig&) {},
        [&](const std::string& name, std::vector<uint8_t>& b) {
          if (name == head) flip_first(b);
          return true;
        });
    Result<ModelConfig> c = ModelConfig::Load(tmp.path());
    ASSERT_TRUE(c.ok());
    Result<ModelWeights> w = LoadWeights(*c, tmp.path());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const Tensor& own = w->mtp[0].head;
    ASSERT_EQ(own.shape(), (std::vector<int64_t>{c->vocab_size, c->hidden_size}));
    auto stored = SafetensorsSet::Open(tmp.path());
    ASSERT_TRUE(stored.ok());
    const TensorView view = *(*stored)->Find(head);
    EXPECT_EQ(std::memcmp(own.data(), view.data, view.nbytes), 0);
    EXPECT_NE(std::memcmp(own.data(), w->lm_head.data(), view.nbytes), 0);
  }
  {
    // An embedding copy that is not one is refused: the module shares the model's.
    ScopedTempDir tmp("pd_mtp_");
    CopyModelDir(
        src, tmp.path(), [](ModelConfig&) {},
        [&](const std::string& name, std::vector<uint8_t>& b) {
          if (name == embed) flip_first(b);
          return true;
        });
    Result<ModelWeights> w = LoadDir(tmp.path());
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Mentions(w.status().message(), embed));
  }
}

}  // namespace
}  // namespace pdserve
