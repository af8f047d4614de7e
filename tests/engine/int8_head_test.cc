// The output matrix held in INT8 (`--lm-head`, LoadWeights' head_format; auto: INT8 whenever
// the linear layers are 8-bit): the head really is one byte a weight (plus a scale per 128),
// its logits are the INT8 product of the very hidden states the BF16 head
// sees (the head changes no KV and no hidden state) within the rounding bound of the two
// quantisations, and `--lm-head bf16` gives the BF16 head's product bit for bit, tied and untied.
// Batch, chunk and page-size invariance of 8-bit models (INT8 head included, by auto) is in
// eight_bit_weights_test.cc, TP in tp_forward_test.cc.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "kernels/kernels.h"
#include "model/fingerprint.h"
#include "model/matrix.h"
#include "model/model_dir.h"
#include "model/quantise.h"
#include "model/tp_linear.h"
#include "model/weights.h"

namespace pdserve {
namespace {

using testing::SyntheticModelDir;

// `path` with the linear layers as `format` says and the output matrix as `head` says.
ModelDir LoadWithHead(const std::string& path, std::optional<DType> format,
                      std::optional<DType> head) {
  return testing::LoadForLogits(path, std::nullopt, format, head);
}

// A prompt's last logits and the final-normed hidden states of its last `rows` positions (the
// head's input), prefilled in chunks of 5 over 4-token pages; the cache's bytes in *kv.
struct HeadRun {
  std::vector<float> logits;
  std::vector<float> hidden;
  std::vector<uint8_t> kv;
};
HeadRun RunHead(ModelDir& dir, const std::vector<int32_t>& prompt, int rows) {
  Transformer& model = *dir.transformer;
  constexpr int kPage = 4, kChunk = 5;
  const int pages = static_cast<int>((prompt.size() + kPage - 1) / kPage);
  auto cache = KvCache::Create(model.MakeKvLayout(pages, kPage));
  EXPECT_TRUE(cache.ok());
  std::vector<PageId> table(pages);
  for (int i = 0; i < pages; ++i) table[i] = i;
  HeadRun run;
  for (size_t start = 0; start < prompt.size(); start += kChunk) {
    const size_t count = std::min<size_t>(kChunk, prompt.size() - start);
    const bool last = start + count == prompt.size();
    SequenceChunk c{.tokens = std::span<const int32_t>(prompt).subspan(start, count),
                    .start = static_cast<int64_t>(start),
                    .pages = table,
                    .want_logits = last,
                    .logit_rows = last ? rows : 1,
                    .hidden_rows = last ? rows : 0};
    std::vector<float> logits, hidden;
    Status s =
        model.Forward(std::span<const SequenceChunk>(&c, 1), **cache, &logits, nullptr, &hidden);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (last) {
      run.logits = std::move(logits);
      run.hidden = std::move(hidden);
    }
  }
  const uint8_t* bytes = (*cache)->base();
  run.kv.assign(bytes, bytes + (*cache)->size_bytes());
  return run;
}

// The checkpoint's output matrix as the loader holds it with --weights bf16: [vocab][hidden].
Tensor Bf16OutputMatrix(const std::string& path, const ModelConfig& config) {
  auto w = LoadWeights(config, path, std::nullopt, DType::kBF16, DType::kBF16);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return std::exchange(config.tie_word_embeddings ? w->embed : w->lm_head, Tensor());
}

// x [m][k] times the packed matrix `t` through the product the model's head runs (TpLinear on
// one rank): [m][n].
std::vector<float> HeadProduct(Tensor t, const std::vector<float>& x) {
  const int n = static_cast<int>(t.dim(0)), k = static_cast<int>(t.dim(1));
  MatrixPacker packer;
  Matrix matrix;
  packer.Add({{&t, DimRange{0, n}}}, &matrix);
  const Tensor arena = packer.Pack();
  const int m = static_cast<int>(x.size() / k);
  std::vector<float> y(static_cast<size_t>(m) * n);
  TpLinear linear(1);
  EXPECT_TRUE(linear.ColumnParallelLinear(x.data(), m, matrix, DimRange{0, n}, n, y.data()).ok());
  return y;
}

struct HeadCase {
  const char* preset;
  std::optional<DType> format;  // --weights
  friend void PrintTo(const HeadCase& c, std::ostream* os) {
    *os << c.preset << " --weights " << (c.format ? DTypeFlagName(*c.format) : "auto");
  }
};

class Int8HeadTest : public ::testing::TestWithParam<HeadCase> {};

// --lm-head int8 against bf16 on the same layers: the head holds one byte a weight; the
// hidden states and KV are the same bits; the INT8 logits are the product of those hidden states
// with the loader's INT8 copy (quantise.h) and within the bound of its rounding; the BF16 ones
// are the BF16 head's product bit for bit; auto follows the layers.
TEST_P(Int8HeadTest, HeadIsInt8AndItsLogitsAreBoundedByItsRounding) {
  const HeadCase c = GetParam();
  const std::string path = SyntheticModelDir(c.preset, DType::kBF16);
  ModelDir bf16 = LoadWithHead(path, c.format, DType::kBF16);
  ModelDir int8 = LoadWithHead(path, c.format, DType::kI8);
  ModelDir autod = LoadWithHead(path, c.format, std::nullopt);
  const ModelConfig& config = bf16.config;
  const int vocab = config.vocab_size, hidden = config.hidden_size;
  ASSERT_EQ(config.tie_word_embeddings, std::string(c.preset) == "tiny-qwen2");

  // Bytes: the head one byte a weight plus 4 per 128 (a scale per block).
  EXPECT_EQ(int8.transformer->head_dtype(), DType::kI8);
  EXPECT_EQ(bf16.transformer->head_dtype(), DType::kBF16);
  EXPECT_EQ(int8.transformer->HeadWeightBytes(), kernels::PackedInt8Bytes(vocab, hidden));
  EXPECT_EQ(bf16.transformer->HeadWeightBytes(),
            kernels::PackedBF16Elements(vocab, hidden) * sizeof(uint16_t));
  EXPECT_LT(int8.transformer->HeadWeightBytes(), 0.55 * bf16.transformer->HeadWeightBytes());
  EXPECT_EQ(bf16.transformer->WeightBytes() - int8.transformer->WeightBytes(),
            bf16.transformer->HeadWeightBytes() - int8.transformer->HeadWeightBytes());
  const bool eight_bit_layers = c.format.has_value() && *c.format != DType::kBF16;
  EXPECT_EQ(autod.transformer->head_dtype(), eight_bit_layers ? DType::kI8 : DType::kBF16);
  // TP ranks and prefix caches tell the heads apart; the handshake (KV) does not.
  EXPECT_NE(int8.transformer->Fingerprint(), bf16.transformer->Fingerprint());
  EXPECT_EQ(WeightsIdentity(int8.transformer->matrix_dtype(), int8.transformer->linear_dtype()),
            WeightsIdentity(bf16.transformer->matrix_dtype(), bf16.transformer->linear_dtype()));

  constexpr int kRows = 3;
  const std::vector<int32_t> prompt = testing::SeededTokens(23, vocab, 5);
  const HeadRun b = RunHead(bf16, prompt, kRows);
  const HeadRun q = RunHead(int8, prompt, kRows);
  ASSERT_EQ(b.hidden.size(), static_cast<size_t>(kRows) * hidden);
  ASSERT_EQ(b.logits.size(), static_cast<size_t>(kRows) * vocab);
  EXPECT_EQ(b.hidden, q.hidden);
  EXPECT_TRUE(b.kv == q.kv) << "the head changed the KV";

  // The BF16 head's logits: its product with the hidden states, bit for bit.
  Tensor w = Bf16OutputMatrix(path, config);
  ASSERT_EQ(w.dtype(), DType::kBF16);
  std::vector<float> wf(static_cast<size_t>(vocab) * hidden);
  ConvertToF32(DType::kBF16, w.data(), wf.data(), wf.size());
  EXPECT_EQ(HeadProduct(std::move(w), b.hidden), b.logits);

  // The INT8 head's: the same product with the BF16 values quantised by QuantiseInt8Rows.
  constexpr int kBlock = kQuantBlock;
  const int blocks = (hidden + kBlock - 1) / kBlock;
  Tensor w8(DType::kI8, {vocab, hidden});
  Tensor scales(DType::kF32, {vocab, blocks});
  QuantiseInt8Rows(wf.data(), vocab, hidden, w8.as<int8_t>(), scales.as<float>());
  const std::vector<float> s(scales.as<float>(), scales.as<float>() + scales.numel());
  w8.set_row_scales(std::move(scales));
  EXPECT_EQ(HeadProduct(std::move(w8), q.hidden), q.logits);

  // The bound: a weight moves by at most half its block's scale s (max|w| / 127), an activation
  // by half its row block's t (max|x| / 127, the INT8 product's own quantisation), so a logit by
  // at most sum(|x| s/2 + |w| t/2 + s t/4); the BF16 head rounds x to BF16 (2^-9 relative) and
  // both accumulate in F32 (2^-20 of sum|x w| is generous). Typical errors are ~sqrt(k) below
  // this worst case; a head quantised with wrong scales or from the wrong rows exceeds it.
  double worst_ratio = 0;
  for (int r = 0; r < kRows; ++r) {
    const float* x = &b.hidden[static_cast<size_t>(r) * hidden];
    for (int j = 0; j < vocab; ++j) {
      double bound = 0;
      for (int blk = 0; blk < blocks; ++blk) {
        const int c0 = blk * kBlock, c1 = std::min(hidden, c0 + kBlock);
        double xmax = 0;
        for (int i = c0; i < c1; ++i) xmax = std::max(xmax, std::fabs(double{x[i]}));
        const double t = xmax / 127, sc = s[static_cast<size_t>(j) * blocks + blk];
        for (int i = c0; i < c1; ++i) {
          const double wv = wf[static_cast<size_t>(j) * hidden + i];
          bound += std::fabs(double{x[i]}) * sc / 2 + std::fabs(wv) * t / 2 + sc * t / 4 +
                   std::fabs(x[i] * wv) * (0x1p-9 + 0x1p-20);
        }
      }
      const size_t at = static_cast<size_t>(r) * vocab + j;
      const double diff = std::fabs(double{q.logits[at]} - b.logits[at]);
      ASSERT_LE(diff, bound) << "row " << r << " token " << j;
      worst_ratio = std::max(worst_ratio, diff / bound);
    }
  }
  EXPECT_GT(worst_ratio, 0.0) << "the INT8 head must differ from the BF16 one";
  std::printf("%s: largest |int8 - bf16| logit error %.2f of its bound\n", c.preset, worst_ratio);
}

INSTANTIATE_TEST_SUITE_P(Presets, Int8HeadTest,
                         ::testing::Values(HeadCase{"tiny-qwen2", DType::kI8},
                                           HeadCase{"tiny-llama3", DType::kI8},
                                           HeadCase{"tiny-qwen2", DType::kF8E4M3},
                                           HeadCase{"tiny-llama3", std::nullopt}),
                         [](const auto& info) {
                           std::string name = info.param.preset;
                           name += info.param.format.has_value()
                                       ? "_" + std::string(DTypeFlagName(*info.param.format))
                                       : "_auto";
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

// An 8-bit checkpoint loaded as it is (auto) gets the INT8 head; --lm-head bf16 keeps today's.
TEST(Int8HeadTest, EightBitCheckpointFollowsItsLayersUnlessAsked) {
  const std::string path = SyntheticModelDir("tiny", DType::kF8E4M3);
  EXPECT_EQ(LoadWithHead(path, std::nullopt, std::nullopt).transformer->head_dtype(), DType::kI8);
  EXPECT_EQ(LoadWithHead(path, std::nullopt, DType::kBF16).transformer->head_dtype(), DType::kBF16);
  ModelDirOptions options;
  options.load_tokenizer = false;
  options.head_format = DType::kF8E4M3;
  auto refused = LoadModelDir(path, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("lm_head"), std::string::npos)
      << refused.status().ToString();
}

}  // namespace
}  // namespace pdserve
