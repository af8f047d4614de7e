// Tensor parallelism never changes a bit (DESIGN.md §6): N ranks of a Transformer, each with
// its share of the weights and its own cache of its KV heads, gathering their column slices,
// produce the one-rank logits bit for bit and fill their caches with exactly the one-rank
// cache's heads. The ranks run on threads of this process with a std::barrier group written
// here (independent of engine/shm_tp_group.h, which has its own tests), over prefill chunks
// and decode steps of two sequences, on every synthetic architecture.
#include <barrier>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "model/model_dir.h"
#include "testing/test_models.h"

namespace pdserve::testing {
namespace {

// Ranks on threads: each writes its columns into one shared matrix, all wait, all copy out,
// all wait again (so the next call cannot overwrite what a slow rank still reads).
struct SharedGather {
  explicit SharedGather(int ranks) : barrier(ranks), buffer(size_t{1} << 22) {}
  std::barrier<> barrier;
  std::vector<float> buffer;
};

class ThreadGroup : public TpGroup {
 public:
  ThreadGroup(SharedGather* shared, int rank, int size)
      : shared_(shared), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status AllGatherColumns(float* data, int rows, int width, int col_begin, int col_end) override {
    const size_t n = static_cast<size_t>(rows) * width;
    if (n > shared_->buffer.size()) return Status::InvalidArgument("test gather too large");
    for (int r = 0; r < rows; ++r) {
      const size_t at = static_cast<size_t>(r) * width + col_begin;
      std::memcpy(&shared_->buffer[at], data + at, (col_end - col_begin) * sizeof(float));
    }
    shared_->barrier.arrive_and_wait();
    std::memcpy(data, shared_->buffer.data(), n * sizeof(float));
    shared_->barrier.arrive_and_wait();
    return Status::Ok();
  }

 private:
  SharedGather* shared_;
  int rank_, size_;
};

struct Rank {
  ModelDir dir;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<ThreadGroup> group;
  std::vector<float> logits;
};

constexpr int kPageTokens = 8;
constexpr int kPages = 16;

Rank LoadRank(const std::string& path, int rank, int size, std::optional<DType> format) {
  ModelDirOptions options;
  options.weight_format = format;
  options.load_tokenizer = false;
  options.transformer.threads = 1;
  options.transformer.tp_rank = rank;
  options.transformer.tp_size = size;
  auto dir = LoadModelDir(path, options);
  EXPECT_TRUE(dir.ok()) << dir.status().ToString();
  Rank r;
  r.dir = std::move(*dir);
  auto cache = KvCache::Create(r.dir.transformer->MakeKvLayout(kPages, kPageTokens));
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  r.cache = std::move(*cache);
  return r;
}

// The steps both runs go through: two sequences prefilled in chunks (one chunk each step,
// page boundaries crossed mid-chunk), then decoded together.
std::vector<std::vector<SequenceChunk>> Steps(const std::vector<int32_t>& a,
                                              const std::vector<int32_t>& b,
                                              const std::vector<PageId>& pages_a,
                                              const std::vector<PageId>& pages_b) {
  std::span<const int32_t> sa(a), sb(b);
  return {
      {{sa.subspan(0, 13), 0, pages_a, false}, {sb.subspan(0, 5), 0, pages_b, true}},
      {{sa.subspan(13, 20), 13, pages_a, true}, {sb.subspan(5, 1), 5, pages_b, true}},
      {{sa.subspan(33, 1), 33, pages_a, true}, {sb.subspan(6, 1), 6, pages_b, true}},
      {{sa.subspan(34, 1), 34, pages_a, true}, {sb.subspan(7, 3), 7, pages_b, true}},
  };
}

void ExpectCacheIsSliceOf(const KvCache& whole, const KvCache& rank_cache, const TpSlices& tp) {
  const KvLayout& l = whole.layout();
  const size_t head_bytes = l.head_bytes();
  for (int layer = 0; layer < l.num_layers; ++layer) {
    for (PageId page = 0; page < l.num_pages; ++page) {
      for (KvComponent c : l.components()) {
        const uint8_t* want = whole.Block(layer, page, c) + head_bytes * tp.kv_heads.begin;
        const uint8_t* got = rank_cache.Block(layer, page, c);
        ASSERT_EQ(std::memcmp(want, got, head_bytes * tp.kv_heads.size()), 0)
            << "rank " << tp.rank << " layer " << layer << " page " << page << " component "
            << static_cast<int>(c);
      }
    }
  }
}

struct Case {
  const char* preset;
  int tp;
  DType dtype = DType::kBF16;  // of the checkpoint (kF8E4M3, kI8: its matrices stay 8-bit)
  std::optional<DType> format = std::nullopt;  // `--weights`: quantised at load
  friend void PrintTo(const Case& c, std::ostream* os) {
    *os << c.preset << " TP " << c.tp << " " << DTypeFlagName(c.dtype);
    if (c.format) *os << " as " << DTypeFlagName(*c.format);
  }
};

class TpForwardTest : public ::testing::TestWithParam<Case> {};

TEST_P(TpForwardTest, RanksReproduceOneRankBitForBit) {
  const Case c = GetParam();
  const std::string path = SyntheticModelDir(c.preset, c.dtype);
  Rank whole = LoadRank(path, 0, 1, c.format);
  std::vector<Rank> ranks;
  SharedGather shared(c.tp);
  for (int r = 0; r < c.tp; ++r) {
    ranks.push_back(LoadRank(path, r, c.tp, c.format));
    ranks.back().group = std::make_unique<ThreadGroup>(&shared, r, c.tp);
    ranks.back().dir.transformer->SetTpGroup(ranks.back().group.get());
  }
  // 8-bit layers bring an INT8 lm_head (--lm-head auto): each rank holds its vocabulary slice.
  const bool eight_bit = IsBlockScaled(c.dtype) || (c.format && IsBlockScaled(*c.format));
  EXPECT_EQ(whole.dir.transformer->head_dtype(), eight_bit ? DType::kI8 : DType::kBF16);
  for (const Rank& r : ranks) {
    EXPECT_EQ(r.dir.transformer->head_dtype(), whole.dir.transformer->head_dtype());
    EXPECT_LT(r.dir.transformer->HeadWeightBytes(), whole.dir.transformer->HeadWeightBytes());
  }
  const int vocab = whole.dir.config.vocab_size;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<int32_t> a(35), b(10);
  for (int32_t& t : a) t = token(rng);
  for (int32_t& t : b) t = token(rng);
  const std::vector<PageId> pages_a = {3, 9, 0, 14, 7}, pages_b = {12, 1};

  for (const auto& step : Steps(a, b, pages_a, pages_b)) {
    ASSERT_TRUE(whole.dir.transformer->Forward(step, *whole.cache, &whole.logits).ok());
    std::vector<std::thread> threads;
    std::vector<Status> status(c.tp);
    for (int r = 0; r < c.tp; ++r) {
      threads.emplace_back([&, r] {
        status[r] = ranks[r].dir.transformer->Forward(step, *ranks[r].cache, &ranks[r].logits);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < c.tp; ++r) {
      ASSERT_TRUE(status[r].ok()) << status[r].ToString();
      ASSERT_EQ(ranks[r].logits.size(), whole.logits.size());
      ASSERT_EQ(std::memcmp(ranks[r].logits.data(), whole.logits.data(),
                            whole.logits.size() * sizeof(float)),
                0)
          << "rank " << r << " logits differ from one rank's";
    }
  }
  for (int r = 0; r < c.tp; ++r) {
    ExpectCacheIsSliceOf(*whole.cache, *ranks[r].cache, ranks[r].dir.transformer->tp());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Presets, TpForwardTest,
    ::testing::Values(
        Case{"tiny", 2}, Case{"tiny", 3}, Case{"tiny", 4}, Case{"tiny-qwen2", 2},
        Case{"tiny-qwen3", 2}, Case{"tiny-mistral", 2}, Case{"tiny-llama3", 2},
        Case{"tiny-llama3", 4}, Case{"qwen3-moe-tiny", 2}, Case{"qwen3-moe-tiny", 4},
        Case{"deepseek-v3-tiny", 2}, Case{"deepseek-v3-tiny", 4}, Case{"deepseek-v2-lite-tiny", 2},
        // FP8: shares of 64 rows cut the 128-row scale blocks (tiny's hidden and
        // intermediate at TP 4, the experts' at TP 2), and tiny-qwen3's q|k|v
        // joins q's 192 rows to k's.
        Case{"tiny", 2, DType::kF8E4M3}, Case{"tiny", 4, DType::kF8E4M3},
        Case{"tiny-qwen3", 2, DType::kF8E4M3}, Case{"qwen3-moe-tiny", 2, DType::kF8E4M3},
        Case{"deepseek-v3-tiny", 2, DType::kF8E4M3}, Case{"deepseek-v3-tiny", 4, DType::kF8E4M3},
        Case{"deepseek-v2-lite-tiny", 2, DType::kF8E4M3},
        // INT8 (a scale per row: any share keeps its rows' scales) and both 8-bit formats
        // quantised at load from the BF16 checkpoint.
        Case{"tiny", 2, DType::kI8}, Case{"tiny", 4, DType::kI8}, Case{"tiny-qwen3", 2, DType::kI8},
        Case{"qwen3-moe-tiny", 2, DType::kI8}, Case{"deepseek-v3-tiny", 2, DType::kI8},
        Case{"deepseek-v3-tiny", 4, DType::kI8}, Case{"tiny", 2, DType::kBF16, DType::kI8},
        Case{"tiny", 4, DType::kBF16, DType::kI8}, Case{"tiny", 2, DType::kBF16, DType::kF8E4M3},
        Case{"tiny", 4, DType::kBF16, DType::kF8E4M3},
        Case{"tiny-llama3", 4, DType::kBF16, DType::kI8}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = std::string(info.param.preset) + "_tp" + std::to_string(info.param.tp);
      if (info.param.dtype != DType::kBF16)
        name += "_" + std::string(DTypeFlagName(info.param.dtype));
      if (info.param.format) name += "_as_" + std::string(DTypeFlagName(*info.param.format));
      for (char& ch : name) {
        if (ch == '-' || ch == '.') ch = '_';
      }
      return name;
    });

TEST(TpSlicesTest, SharesCoverTheModelAndReplicasSplitTheirQueryHeads) {
  ModelConfig config;
  config.num_heads = 8;
  config.num_kv_heads = 2;
  config.hidden_size = 200;
  config.intermediate_size = 130;
  config.vocab_size = 1000;
  // TP 4 over 2 KV heads: replica pairs, each replica half of its head's 4 query heads.
  int q_next = 0, hidden_next = 0;
  for (int r = 0; r < 4; ++r) {
    auto t = TpSlices::Create(config, r, 4);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->kv_heads.begin, r / 2);
    EXPECT_EQ(t->q_heads.begin, q_next);
    EXPECT_EQ(t->q_heads.size(), 2);
    q_next = t->q_heads.end;
    EXPECT_EQ(t->hidden.begin, hidden_next);
    EXPECT_EQ(t->hidden.begin % 64, 0);
    hidden_next = t->hidden.end;
  }
  EXPECT_EQ(q_next, 8);
  EXPECT_EQ(hidden_next, 200);
  // 3 replicas of one KV head cannot split its 4 query heads.
  config.num_kv_heads = 1;
  auto bad = TpSlices::Create(config, 0, 3);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cannot be split"), std::string::npos)
      << bad.status().ToString();
  EXPECT_FALSE(TpSlices::Create(config, 2, 2).ok());
}

}  // namespace
}  // namespace pdserve::testing
