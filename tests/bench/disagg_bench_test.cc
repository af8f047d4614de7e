// `bench disagg` end to end on the tiny synthetic model (a real prefill and decode node in one
// process, over shm and tcp): every run finishes, its numbers hang together (compute > 0,
// tail >= 0, several forward passes), the bytes and writes P sent and D received are what
// the model's KV layout says for the prompt's pages, and streaming off really holds every
// write back until the last forward pass ended.
#include <gtest/gtest.h>

#include "bench/disagg_bench.h"
#include "model/config.h"
#include "testing/test_models.h"

namespace pdserve::bench {
namespace {

constexpr int kPage = 4;
constexpr int kChunk = 16;
constexpr int kPrompt = 61;  // 60 prefilled tokens: 15 pages, 4 forward passes of <= 16

class DisaggBenchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DisaggBenchTest, NumbersAreConsistent) {
  DisaggBenchOptions o;
  o.model_dir = testing::TinyModelDir();
  o.load.weight_dtype = DType::kBF16;
  o.load.transformer.kv_dtype = DType::kBF16;
  o.load.transformer.threads = 1;
  o.engine.page_tokens = kPage;
  o.engine.kv_cache_bytes = size_t{8} << 20;
  o.engine.scheduler.max_batch_tokens = kChunk;
  o.prompt_len = kPrompt;
  o.repeats = 2;
  o.provider = GetParam();
  o.timeout_s = 120;
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
