// `bench disagg` end to end on the tiny synthetic model (a real prefill and decode node in one
// process, over shm and tcp): every run finishes, its numbers hang together (compute > 0,
// tail >= 0, several forward passes), the bytes and writes P sent and D received are what
// the model's KV layout says for the prompt's pages, and streaming off really holds every
// write back until the last forward pass ended. An MLA model moves its latent, a fraction of
// what a plain K/V cache of it would.
#include <gtest/gtest.h>

#include "bench/disagg_bench.h"
#include "model/config.h"
#include "testing/test_models.h"

namespace pdserve::bench {
namespace {

constexpr int kPage = 4;
constexpr int kChunk = 16;
constexpr int kPrompt = 61;  // 60 prefilled tokens: 15 pages, 4 forward passes of <= 16

// A short run over `provider`: small pages and chunks, a BF16 cache, one thread.
DisaggBenchOptions SmallRun(const std::string& model_dir, const std::string& provider,
                            int repeats) {
  DisaggBenchOptions o;
  o.model_dir = model_dir;
  o.load.transformer.kv_dtype = DType::kBF16;
  o.load.transformer.threads = 1;
  o.engine.page_tokens = kPage;
  o.engine.kv_cache_bytes = size_t{8} << 20;
  o.engine.scheduler.max_batch_tokens = kChunk;
  o.prompt_len = kPrompt;
  o.repeats = repeats;
  o.provider = provider;
  o.timeout_s = 120;
  return o;
}

class DisaggBenchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DisaggBenchTest, NumbersAreConsistent) {
  DisaggBenchOptions o = SmallRun(testing::TinyModelDir(), GetParam(), /*repeats=*/2);
  o.load.weight_dtype = DType::kBF16;
  Result<DisaggBenchResult> result = RunDisaggBench(o);
  ASSERT_TRUE(result.ok()) << result.status().ToString();

  // What the KV layout says, independently of the transfer plan: each page of each layer is
  // one block of K and V, [kv_heads][page][head_dim] each, in BF16 (TP 1: one write a block).
  Result<ModelConfig> config = ModelConfig::Load(o.model_dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const int pages = (kPrompt - 1 + kPage - 1) / kPage;
  const int64_t writes = int64_t{pages} * config->num_layers;
  const int64_t bytes = writes * 2 * config->num_kv_heads * kPage * config->head_dim * 2;
  EXPECT_EQ(result->pages, pages);
  EXPECT_EQ(result->plan_writes, static_cast<uint64_t>(writes));
  EXPECT_EQ(result->plan_bytes, static_cast<uint64_t>(bytes));
  EXPECT_EQ(result->plain_kv_bytes, result->plan_bytes) << "a GQA cache is a plain one";

  ASSERT_EQ(result->runs.size(), 4u);
  for (size_t i = 0; i < result->runs.size(); ++i) {
    const DisaggRun& r = result->runs[i];
    SCOPED_TRACE("run " + std::to_string(i) + (r.streaming ? " (streaming on)" : " (off)"));
    EXPECT_EQ(r.streaming, i % 2 == 0) << "on and off alternate";
    EXPECT_EQ(r.steps, (kPrompt - 1 + kChunk - 1) / kChunk);
    EXPECT_GT(r.compute_s, 0);
    EXPECT_GE(r.tail_s, 0);
    // D stamps the send before the message leaves, so P's compute cannot start before it
    // (stamped after the send returned, the sum exceeded the latency by up to 0.5 ms under a
    // loaded TSan run); 2 ms allowed for the two processes' stamps.
    EXPECT_GE(r.latency_s, r.compute_s + r.tail_s - 0.002)
        << "sent before the compute, landed after";
    EXPECT_EQ(r.writes_sent, writes);
    EXPECT_EQ(r.writes_received, writes);
    EXPECT_EQ(r.bytes_sent, bytes);
    EXPECT_EQ(r.bytes_received, bytes);
    // Streaming off: nothing left before the last forward pass ended. (That streaming on
    // posts earlier is messenger_fault_test's streaming test; the tiny model's 1 ms forward
    // passes may end before a starved streamer thread runs.)
    if (!r.streaming) {
      EXPECT_LE(r.transfer_s, r.tail_s);
    }
  }
  const std::string table = FormatDisaggTable(*result);
  EXPECT_NE(table.find("| transfer tail (ms) |"), std::string::npos) << table;
  EXPECT_NE(table.find("streaming off"), std::string::npos) << table;
}

// An MLA model moves its latent cache: per token and layer kv_lora_rank + qk_rope_head_dim
// values (deepseek-v3-tiny: 64 + 16), in whole pages, and not a value more; a plain K/V cache of
// the same model would hold num_heads x (qk_nope_head_dim + qk_rope_head_dim + v_head_dim)
// values (4 x (32 + 16 + 32) = 320): 4x the bytes.
TEST(DisaggBenchMlaTest, MovesTheLatentNotAPlainCache) {
  const DisaggBenchOptions o =
      SmallRun(testing::SyntheticModelDir("deepseek-v3-tiny"), "tcp", /*repeats=*/1);
  Result<DisaggBenchResult> result = RunDisaggBench(o);
  ASSERT_TRUE(result.ok()) << result.status().ToString();

  Result<ModelConfig> c = ModelConfig::Load(o.model_dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->is_mla());
  const int pages = (kPrompt - 1 + kPage - 1) / kPage;
  const int64_t token_layers = int64_t{pages} * kPage * c->num_layers;  // whole pages
  const int64_t latent = c->mla.kv_lora_rank + c->mla.qk_rope_head_dim;
  const int64_t plain = int64_t{c->num_heads} *
                        (c->mla.qk_nope_head_dim + c->mla.qk_rope_head_dim + c->mla.v_head_dim);
  EXPECT_EQ(latent, 80);
  EXPECT_EQ(plain, 320);
  EXPECT_EQ(result->pages, pages);
  EXPECT_EQ(result->plan_bytes, static_cast<uint64_t>(token_layers * latent * 2));
  EXPECT_EQ(result->plain_kv_bytes, static_cast<uint64_t>(token_layers * plain * 2));
  EXPECT_EQ(result->plain_kv_bytes, 4 * result->plan_bytes);
  ASSERT_EQ(result->runs.size(), 2u);
  for (const DisaggRun& r : result->runs) {
    EXPECT_EQ(r.bytes_sent, token_layers * latent * 2);
    EXPECT_EQ(r.bytes_received, token_layers * latent * 2);
  }
  const std::string table = FormatDisaggTable(*result);
  EXPECT_NE(table.find("80 values (the MLA latent)"), std::string::npos) << table;
  EXPECT_NE(table.find("a plain K/V cache: 320 values"), std::string::npos) << table;
  EXPECT_NE(table.find("4.00x the plan's"), std::string::npos) << table;
}

TEST(DisaggBenchOptionsTest, BadOptionsAreRefused) {
  DisaggBenchOptions o;
  o.model_dir = testing::TinyModelDir();
  o.prompt_len = 1;
  EXPECT_EQ(RunDisaggBench(o).status().code(), StatusCode::kInvalidArgument);
  o.prompt_len = 8;
  o.repeats = 0;
  EXPECT_EQ(RunDisaggBench(o).status().code(), StatusCode::kInvalidArgument);
  o.repeats = 1;
  o.provider = "carrier-pigeon";
  EXPECT_EQ(RunDisaggBench(o).status().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Providers, DisaggBenchTest, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pdserve::bench
