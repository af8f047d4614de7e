// FP8 block-scaled checkpoints as DeepSeek ships them: quantization_config in config.json,
// F8_E4M3 matrices with `weight_scale_inv` per 128 x 128 block. Loaded FP8 (with row scales)
// by default or dequantised exactly with a forced dtype; bad checkpoints refused by name; row
// slices of FP8 matrices (tensor-parallel shares at 64-row boundaries) keep their rows' scales;
// `make-model --dtype fp8` writes such checkpoints from the BF16 writer's draws.
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/kernels.h"
#include "loader_test_util.h"
#include "model/config.h"
#include "model/matrix.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/weights.h"

namespace pdserve {
namespace {

using pdserve::testing::Mentions;
using pdserve::testing::ScopedTempDir;

// ---- Config ----

std::string LlamaJson(const std::string& quantization) {
  return R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 160,
             "intermediate_size": 200, "num_hidden_layers": 1, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 300, "quantization_config": )" +
         quantization + "}";
}

TEST(Fp8ConfigTest, ParsesDeepSeeksQuantizationConfig) {
  auto c = ModelConfig::FromJson(LlamaJson(
      R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
          "weight_block_size": [128, 64]})"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->quantization.fp8());
  EXPECT_EQ(c->quantization.block_rows, 128);
  EXPECT_EQ(c->quantization.block_cols, 64);
  // Written back and read again; the fingerprint tells it from the unquantised model, whose
  // own fingerprint is unchanged by the field's existence.
  auto again = ModelConfig::FromJson(c->ToJson());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->quantization.block_cols, 64);
  EXPECT_EQ(again->Fingerprint(), c->Fingerprint());
  auto plain = ModelConfig::FromJson(LlamaJson("null"));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->quantization.fp8());
  EXPECT_NE(plain->Fingerprint(), c->Fingerprint());
  EXPECT_EQ(ModelConfig::FromJson(plain->ToJson())->quantization.method,
            QuantizationConfig::Method::kNone);
}

TEST(Fp8ConfigTest, RefusesOtherMethodsAndFormatsNamingThem) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"quant_method": "awq", "bits": 4})", "\"awq\""},
      {R"({"quant_method": "gptq"})", "\"gptq\""},
      {R"({"bits": 4})", "quant_method"},
      {R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})", "\"e5m2\""},
      {R"({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]})",
       "\"static\""},
      {R"({"quant_method": "fp8"})", "weight_block_size"},
      {R"({"quant_method": "fp8", "weight_block_size": [128]})", "weight_block_size"},
      {R"({"quant_method": "fp8", "weight_block_size": [0, 128]})", "weight_block_size"},
      {R"("fp8")", "quantization_config"},
  };
  for (const auto& [quantization, named] : cases) {
    auto c = ModelConfig::FromJson(LlamaJson(quantization));
    ASSERT_FALSE(c.ok()) << quantization;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Mentions(c.status().message(), named)) << quantization;
  }
}

// ---- Loading ----

// One layer of Llama with every dimension off the 128 grid: 160 (hidden, q), 80 (k, v), 200
// (intermediate): ragged last blocks both ways.
ModelConfig Fp8Config(int block_rows = 128, int block_cols = 128) {
  auto c = ModelConfig::FromJson(LlamaJson("null"));
  EXPECT_TRUE(c.ok());
  c->head_dim = 40;
  c->tie_word_embeddings = true;
  c->quantization = {.method = QuantizationConfig::Method::kFp8,
                     .block_rows = block_rows,
                     .block_cols = block_cols};
  return *c;
}

const char* const kLinear[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                               "gate_proj", "up_proj", "down_proj"};

std::string LinearName(const char* proj) {
  const std::string p = "model.layers.0.";
  return p +
         (proj[0] == 'q' || proj[0] == 'k' || proj[0] == 'v' || proj[0] == 'o' ? "self_attn."
                                                                               : "mlp.") +
         proj + ".weight";
}

// An FP8 checkpoint of Fp8Config: random bytes (no NaN) and random block scales for the linear
// layers, BF16 embedding, F32 norms. Tests edit `tensors` before Write.
struct Fp8Checkpoint {
  struct Stored {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  ScopedTempDir tmp{"pd_fp8_"};
  std::map<std::string, Stored> tensors;

  explicit Fp8Checkpoint(const ModelConfig& c) {
    std::mt19937 rng(9);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> unit(0.5f, 2.0f);
    auto add = [&](const std::string& name, DType dtype, std::vector<int64_t> shape) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      Stored s{dtype, shape, std::vector<uint8_t>(n * DTypeSize(dtype))};
      if (dtype == DType::kF8E4M3) {
        for (uint8_t& b : s.bytes) {
          do {
            b = static_cast<uint8_t>(byte(rng));
          } while ((b & 0x7f) == 0x7f);
        }
      } else {
        std::vector<float> v(n);
        for (float& e : v) e = unit(rng) * 0.01f;
        ConvertFromF32(dtype, v.data(), s.bytes.data(), n);
      }
      tensors[name] = std::move(s);
    };
    const int64_t h = c.hidden_size, q = int64_t{c.num_heads} * c.head_dim,
                  kv = int64_t{c.num_kv_heads} * c.head_dim, f = c.intermediate_size;
    const std::map<std::string, std::vector<int64_t>> linear = {
        {"q_proj", {q, h}},    {"k_proj", {kv, h}}, {"v_proj", {kv, h}},  {"o_proj", {h, q}},
        {"gate_proj", {f, h}}, {"up_proj", {f, h}}, {"down_proj", {h, f}}};
    for (const auto& [proj, shape] : linear) {
      const std::string name = LinearName(proj.c_str());
      add(name, DType::kF8E4M3, shape);
      const int bo = c.quantization.block_rows, bi = c.quantization.block_cols;
      add(name + "_scale_inv", DType::kF32, {(shape[0] + bo - 1) / bo, (shape[1] + bi - 1) / bi});
    }
    add("model.embed_tokens.weight", DType::kBF16, {c.vocab_size, h});
    add("model.norm.weight", DType::kF32, {h});
    add("model.layers.0.input_layernorm.weight", DType::kF32, {h});
    add("model.layers.0.post_attention_layernorm.weight", DType::kF32, {h});
  }
  std::string Write() {
    std::vector<TensorToWrite> out;
    for (const auto& [name, s] : tensors) out.push_back({name, s.dtype, s.shape, s.bytes.data()});
    EXPECT_TRUE(WriteSafetensors(tmp.path() + "/model.safetensors", out).ok());
    return tmp.path();
  }
  uint8_t Byte(const std::string& name, int64_t r, int64_t c) const {
    const Stored& s = tensors.at(name);
    return s.bytes[r * s.shape[1] + c];
  }
  float Scale(const std::string& name, int64_t br, int64_t bc) const {
    const Stored& s = tensors.at(name + "_scale_inv");
    float v;
    std::memcpy(&v, s.bytes.data() + (br * s.shape[1] + bc) * sizeof(float), sizeof(v));
    return v;
  }
};

TEST(Fp8WeightsTest, AutoKeepsFp8MatricesWithTheirRowsScales) {
  const ModelConfig c = Fp8Config();
  Fp8Checkpoint ck(c);
  auto w = LoadWeights(c, ck.Write());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->matrix_dtype, DType::kBF16);  // of the others: the embedding's
  EXPECT_EQ(w->embed.dtype(), DType::kBF16);
  EXPECT_EQ(w->final_norm.dtype(), DType::kF32);
  const LayerWeights& l = w->layers[0];
  const Tensor* held[] = {&l.q_proj,    &l.k_proj,  &l.v_proj,   &l.o_proj,
                          &l.gate_proj, &l.up_proj, &l.down_proj};  // kLinear's order
  size_t fp8_bytes = 0;
  for (int i = 0; i < 7; ++i) {
    const std::string name = LinearName(kLinear[i]);
    const Tensor& t = *held[i];
    ASSERT_EQ(t.dtype(), DType::kF8E4M3) << name;
    ASSERT_EQ(std::memcmp(t.data(), ck.tensors.at(name).bytes.data(), t.nbytes()), 0) << name;
    const int64_t rows = t.dim(0), cols = t.dim(1), k_blocks = (cols + 127) / 128;
    ASSERT_EQ(t.row_scales().shape(), (std::vector<int64_t>{rows, k_blocks})) << name;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < k_blocks; ++j) {
        ASSERT_EQ(t.row_scales().as<float>()[r * k_blocks + j], ck.Scale(name, r / 128, j))
            << name << " row " << r << " block " << j;
      }
    }
    fp8_bytes += t.nbytes() + t.row_scales().nbytes();
  }
  // One byte per weight, plus the scales, plus the output matrix: with 8-bit layers (auto) an
  // INT8 copy of the tied embedding, a scale per row and 128 columns; the embedding stays BF16.
  EXPECT_EQ(w->head_dtype, DType::kI8);
  ASSERT_EQ(w->lm_head.dtype(), DType::kI8);
  EXPECT_EQ(w->lm_head.shape(), w->embed.shape());
  EXPECT_EQ(w->MatrixBytes(), fp8_bytes + w->lm_head.nbytes() + w->lm_head.row_scales().nbytes());
}

TEST(Fp8WeightsTest, ForcedDtypesDequantiseExactly) {
  const ModelConfig c = Fp8Config();
  Fp8Checkpoint ck(c);
  const std::string dir = ck.Write();
  const std::string name = LinearName("gate_proj");  // [200, 160]: ragged blocks both ways
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    auto w = LoadWeights(c, dir, dtype);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const Tensor& t = w->layers[0].gate_proj;
    ASSERT_EQ(t.dtype(), dtype);
    EXPECT_TRUE(t.row_scales().empty());
    for (int64_t r = 0; r < 200; ++r) {
      for (int64_t col = 0; col < 160; ++col) {
        const float want = F8E4M3ToF32(ck.Byte(name, r, col)) * ck.Scale(name, r / 128, col / 128);
        float got;
        ConvertToF32(dtype,
                     static_cast<const uint8_t*>(t.data()) + (r * 160 + col) * DTypeSize(dtype),
                     &got, 1);
        const float expected = dtype == DType::kF32 ? want : BF16ToF32(F32ToBF16(want));
        ASSERT_EQ(got, expected) << DTypeName(dtype) << " row " << r << " column " << col;
      }
    }
  }
}

TEST(Fp8WeightsTest, MissingScaleIsNamed) {
  const ModelConfig c = Fp8Config();
  Fp8Checkpoint ck(c);
  ck.tensors.erase(LinearName("v_proj") + "_scale_inv");
  for (std::optional<DType> dtype : {std::optional<DType>(), std::optional<DType>(DType::kBF16)}) {
    auto w = LoadWeights(c, ck.Write(), dtype);
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
    EXPECT_TRUE(Mentions(w.status().message(), "model.layers.0.self_attn.v_proj.weight_scale_inv"));
    EXPECT_TRUE(Mentions(w.status().message(), "'model.layers.0.self_attn.v_proj.weight'"));
  }
}

TEST(Fp8WeightsTest, ScaleShapeOfAnotherBlockSizeSaysBoth) {
  // Scales written for 64 x 64 blocks, config of 128 x 128.
  Fp8Checkpoint ck(Fp8Config(64, 64));
  auto w = LoadWeights(Fp8Config(128, 128), ck.Write());
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = w.status().message();
  EXPECT_TRUE(Mentions(m, "_scale_inv")) << m;
  EXPECT_TRUE(Mentions(m, "has shape [3, 3]")) << m;  // the file's: q_proj [160, 160] in 64s
  EXPECT_TRUE(Mentions(m, "needs [2, 2]")) << m;      // the config's: in 128s
  EXPECT_TRUE(Mentions(m, "128 x 128")) << m;
  EXPECT_TRUE(Mentions(m, "weight_block_size")) << m;
}

TEST(Fp8WeightsTest, Fp8TensorInAnUnquantisedConfigIsRefused) {
  ModelConfig c = Fp8Config();
  Fp8Checkpoint ck(c);
  c.quantization = {};
  auto w = LoadWeights(c, ck.Write());
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(w.status().message(), "is F8_E4M3"));
  EXPECT_TRUE(Mentions(w.status().message(), "quantization_config"));
  EXPECT_TRUE(Mentions(w.status().message(), "model.layers.0."));
}

TEST(Fp8WeightsTest, NanByteIsRefusedWhenKeptFp8) {
  const ModelConfig c = Fp8Config();
  Fp8Checkpoint ck(c);
  const std::string name = LinearName("o_proj");
  ck.tensors.at(name).bytes[1234] = 0xff;
  const std::string dir = ck.Write();
  auto w = LoadWeights(c, dir);
  ASSERT_FALSE(w.ok());
  EXPECT_TRUE(Mentions(w.status().message(), name));
  EXPECT_TRUE(Mentions(w.status().message(), "NaN (0xff) at element 1234"));
  // Dequantised, a NaN is a NaN like any other checkpoint's.
  auto f32 = LoadWeights(c, dir, DType::kF32);
  ASSERT_TRUE(f32.ok()) << f32.status().ToString();
  EXPECT_TRUE(std::isnan(f32->layers[0].o_proj.as<float>()[1234]));
}

TEST(Fp8WeightsTest, ColumnBlocksTheKernelsCannotKeepAreRefusedButDequantise) {
  const ModelConfig c = Fp8Config(128, 64);
  Fp8Checkpoint ck(c);
  const std::string dir = ck.Write();
  auto kept = LoadWeights(c, dir);
  ASSERT_FALSE(kept.ok());
  EXPECT_TRUE(Mentions(kept.status().message(), "[128, 64]"));
  EXPECT_TRUE(Mentions(kept.status().message(), "--dtype bf16"));
  auto bf16 = LoadWeights(c, dir, DType::kBF16);
  ASSERT_TRUE(bf16.ok()) << bf16.status().ToString();
  const std::string name = LinearName("up_proj");
  const float want = F8E4M3ToF32(ck.Byte(name, 130, 70)) * ck.Scale(name, 1, 1);
  EXPECT_EQ(BF16ToF32(bf16->layers[0].up_proj.as<uint16_t>()[130 * 160 + 70]),
            BF16ToF32(F32ToBF16(want)));
}

// ---- Matrices: row slices ----

// An FP8 tensor [rows][cols] with random bytes and row scales by 128-row blocks.
Tensor RandomFp8(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> unit(0.5f, 2.0f);
  Tensor t = Tensor::Uninitialized(DType::kF8E4M3, {rows, cols});
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint8_t b;
    do {
      b = static_cast<uint8_t>(byte(rng));
    } while ((b & 0x7f) == 0x7f);
    t.as<uint8_t>()[i] = b;
  }
  const int64_t k_blocks = (cols + 127) / 128;
  std::vector<float> block_scales(((rows + 127) / 128) * k_blocks);
  for (float& s : block_scales) s = unit(rng) / 64;
  Tensor scales(DType::kF32, {rows, k_blocks});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < k_blocks; ++j) {
      scales.as<float>()[r * k_blocks + j] = block_scales[(r / 128) * k_blocks + j];
    }
  }
  t.set_row_scales(std::move(scales));
  return t;
}

// Tensor-parallel shares are 64-row multiples (tp_slices.cc), so a share may start inside a
// 128-row scale block: rows [64, 192) and [256, 300) of one FP8 matrix, packed together,
// compute exactly those rows of the whole matrix's product.
TEST(Fp8MatrixTest, RowSlicesKeepTheirRowsScales) {
  std::mt19937 rng(4);
  const int rows = 300, cols = 200, m = 3;
  Tensor whole = RandomFp8(rows, cols, rng);
  std::vector<float> x(m * cols);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);

  MatrixPacker packer;
  Matrix full, share;
  Tensor copy = Tensor::Uninitialized(DType::kF8E4M3, whole.shape());
  std::memcpy(copy.data(), whole.data(), whole.nbytes());
  Tensor copy_scales(DType::kF32, whole.row_scales().shape());
  std::memcpy(copy_scales.data(), whole.row_scales().data(), copy_scales.nbytes());
  copy.set_row_scales(std::move(copy_scales));
  packer.Add({{&copy, {0, rows}}}, &full);
  packer.Add({{&whole, {64, 192}}, {&whole, {256, 300}}}, &share);
  const Tensor arena = packer.Pack();
  ASSERT_NE(full.fp8, nullptr);
  ASSERT_NE(share.fp8, nullptr);
  EXPECT_EQ(share.n, 128 + 44);
  EXPECT_EQ(share.bytes(), kernels::PackedFP8Bytes(172, cols));
  EXPECT_TRUE(whole.empty());  // taken

  std::vector<float> y_full(m * rows), y_share(m * share.n);
  kernels::MatMulFP8(x.data(), full.fp8, y_full.data(), m, rows, cols);
  kernels::MatMulFP8(x.data(), share.fp8, y_share.data(), m, share.n, cols);
  for (int t = 0; t < m; ++t) {
    for (int j = 0; j < share.n; ++j) {
      const int row = j < 128 ? 64 + j : 256 + (j - 128);
      ASSERT_EQ(y_share[t * share.n + j], y_full[t * rows + row]) << "row " << row;
    }
  }
}

// FP8 rows joined with BF16 ones (a checkpoint that quantised only some of q, k, v) become one
// BF16 matrix, the FP8 part dequantised.
TEST(Fp8MatrixTest, MixedWithBf16IsDequantised) {
  std::mt19937 rng(5);
  Tensor fp8 = RandomFp8(70, 130, rng);
  const Tensor want = DequantiseFp8(fp8, DType::kBF16);
  Tensor bf16(DType::kBF16, {10, 130});
  for (int64_t i = 0; i < bf16.numel(); ++i) bf16.as<uint16_t>()[i] = F32ToBF16(0.25f * i);
  const Tensor joined = TakeRows({{&fp8, {0, 70}}, {&bf16, {0, 10}}});
  ASSERT_EQ(joined.dtype(), DType::kBF16);
  ASSERT_EQ(joined.shape(), (std::vector<int64_t>{80, 130}));
  EXPECT_EQ(std::memcmp(joined.data(), want.data(), want.nbytes()), 0);
  EXPECT_EQ(joined.as<uint16_t>()[70 * 130 + 3], F32ToBF16(0.75f));
}

// MLA folds kv_b_proj's key rows of each head, transposed, into the query (mla_attention.cc):
// a head of 128 rows at a multiple of 128 stays FP8 (its scales follow it), one that straddles
// a 128-row scale block is dequantised to F32. Either way, the same values.
TEST(Fp8MatrixTest, TransposedRowsKeepFp8WhereTheScalesAllow) {
  std::mt19937 rng(6);
  const Tensor w = RandomFp8(512, 300, rng);
  const Tensor values = DequantiseFp8(w, DType::kF32);
  for (const auto& [row, n, stays_fp8] :
       {std::tuple{256, 128, true}, std::tuple{128, 200, true}, std::tuple{64, 128, false}}) {
    const Tensor t = TransposeRows(w, row, n);
    ASSERT_EQ(t.shape(), (std::vector<int64_t>{300, n}));
    ASSERT_EQ(t.dtype(), stays_fp8 ? DType::kF8E4M3 : DType::kF32) << row << " " << n;
    const Tensor got = stays_fp8 ? DequantiseFp8(t, DType::kF32) : Tensor();
    const float* g = stays_fp8 ? got.as<float>() : t.as<float>();
    for (int j = 0; j < 300; ++j) {
      for (int i = 0; i < n; ++i) {
        ASSERT_EQ(g[j * n + i], values.as<float>()[(row + i) * 300 + j]) << row << " " << i;
      }
    }
  }
}

// ---- The synthetic writer ----

TEST(Fp8SyntheticTest, WritesDeepSeeksLayoutFromTheBf16WritersDraws) {
  ScopedTempDir fp8_dir("pd_fp8_synth_"), bf16_dir("pd_bf16_synth_");
  ASSERT_TRUE(WriteSyntheticModel("tiny-qwen3", fp8_dir.path(), 3, DType::kF8E4M3).ok());
  ASSERT_TRUE(WriteSyntheticModel("tiny-qwen3", bf16_dir.path(), 3, DType::kBF16).ok());
  auto config = ModelConfig::Load(fp8_dir.path());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_TRUE(config->quantization.fp8());
  EXPECT_EQ(config->quantization.block_rows, 128);
  EXPECT_EQ(config->quantization.block_cols, 128);
  auto fp8 = SafetensorsSet::Open(fp8_dir.path());
  auto bf16 = SafetensorsSet::Open(bf16_dir.path());
  ASSERT_TRUE(fp8.ok() && bf16.ok());
  int quantised = 0;
  for (const std::string& name : (*bf16)->Names()) {
    auto b = (*bf16)->Find(name);
    auto f = (*fp8)->Find(name);
    ASSERT_TRUE(f.ok()) << name;
    const bool linear = name.find("_proj.weight") != std::string::npos;
    if (!linear) {  // embeddings, norms, (here tied) lm_head: BF16, the same bits
      EXPECT_EQ(f->dtype, DType::kBF16) << name;
      EXPECT_EQ(std::memcmp(f->data, b->data, b->nbytes), 0) << name;
      continue;
    }
    ++quantised;
    ASSERT_EQ(f->dtype, DType::kF8E4M3) << name;
    auto s = (*fp8)->Find(name + "_scale_inv");
    ASSERT_TRUE(s.ok()) << name;
    const int64_t rows = f->shape[0], cols = f->shape[1];
    const int64_t block_cols = (cols + 127) / 128;
    ASSERT_EQ(s->dtype, DType::kF32);
    ASSERT_EQ(s->shape, (std::vector<int64_t>{(rows + 127) / 128, block_cols}));
    const auto* bytes = static_cast<const uint8_t*>(f->data);
    const auto* scales = static_cast<const float*>(s->data);
    const auto* drawn = static_cast<const uint16_t*>(b->data);
    std::vector<bool> reaches_max(s->numel(), false);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t block = (r / 128) * block_cols + c / 128;
        const uint8_t v = bytes[r * cols + c];
        ASSERT_NE(v & 0x7f, 0x7f) << name;
        if ((v & 0x7f) == 0x7e) reaches_max[block] = true;
        // The same draw: within FP8's half step (1/16 relative, or half the smallest subnormal
        // step of the block) plus BF16's rounding of the draw.
        const float got = F8E4M3ToF32(v) * scales[block];
        const float want = BF16ToF32(drawn[r * cols + c]);
        ASSERT_NEAR(got, want, std::fabs(want) * (1.0f / 16 + 1.0f / 128) + scales[block] / 512)
            << name << " [" << r << ", " << c << "]";
      }
    }
    for (int64_t block = 0; block < s->numel(); ++block) {
      EXPECT_TRUE(reaches_max[block]) << name << " block " << block << ": max|w| is not 448";
    }
  }
  EXPECT_EQ(quantised, 3 * 7);  // 3 layers of q, k, v, o, gate, up, down
  EXPECT_EQ((*fp8)->Names().size(), (*bf16)->Names().size() + 3 * 7);
}

}  // namespace
}  // namespace pdserve
