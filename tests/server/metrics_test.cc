// Unit tests of the Prometheus exposition (server/metrics.h).
#include "server/metrics.h"

#include <gtest/gtest.h>

#include "common/metrics_text.h"

namespace pdserve::server {
namespace {

TEST(MetricsTest, HistogramIsCumulative) {
  Histogram h({0.1, 1.0});
  h.Observe(0.05);
  h.Observe(0.5);
  h.Observe(5.0);
  const std::string out = MetricsText().Histogram("x", "help", h).text();
  EXPECT_NE(out.find("x_bucket{le=\"0.1\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{le=\"1\"} 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_count 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("# TYPE x histogram\n"), std::string::npos) << out;
}

TEST(MetricsTest, RenderHasGaugesCountersAndHistograms) {
  ServerMetrics m;
  m.ObserveTimeToFirstToken(0.2);
  m.AddPromptTokens(5);
  m.AddGenerationTokens(7);
  m.RequestSucceeded("stop");
  m.RequestFailed(400);
  EngineStats stats;
  stats.running = 2;
  stats.waiting = 1;
  stats.pages_used = 1;
  stats.pages_total = 4;
  stats.pages_cached = 3;
  stats.pages_evictable = 2;
  stats.prefix_cache = {.queries = 40, .hits = 32};
  const std::string out = m.Render(stats);
  EXPECT_NE(out.find("pdserve:num_requests_running 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("pdserve:num_requests_waiting 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("pdserve:kv_cache_usage_perc 0.25\n"), std::string::npos) << out;
  EXPECT_NE(out.find("pdserve:prompt_tokens_total 5\n"), std::string::npos) << out;
  EXPECT_NE(out.find("pdserve:kv_pages_cached 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("pdserve:kv_pages_evictable 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("# TYPE vllm:prefix_cache_queries_total counter\n"), std::string::npos);
  EXPECT_NE(out.find("vllm:prefix_cache_queries_total 40\n"), std::string::npos) << out;
  EXPECT_NE(out.find("vllm:prefix_cache_hits_total 32\n"), std::string::npos) << out;
  EXPECT_NE(out.find("pdserve:generation_tokens_total 7\n"), std::string::npos) << out;
  EXPECT_NE(out.find("pdserve:request_success_total{finished_reason=\"stop\"} 1\n"),
            std::string::npos);
  EXPECT_NE(out.find("pdserve:request_error_total{status=\"400\"} 1\n"), std::string::npos);
  EXPECT_NE(out.find("pdserve:time_to_first_token_seconds_count 1\n"), std::string::npos);
  EXPECT_NE(out.find("pdserve:e2e_request_latency_seconds_count 0\n"), std::string::npos);
}

TEST(MetricsTest, SpeculativeDecodingCountersInVllmNamesOnlyWithSpeculation) {
  ServerMetrics m;
  EngineStats stats;
  EXPECT_EQ(m.Render(stats).find("spec_decode"), std::string::npos);
  stats.num_speculative_tokens = 2;
  stats.spec = {.drafts = 5,
                .draft_tokens = 9,
                .accepted_tokens = 6,
                .accepted_per_position = {4, 2},
                .draft_pages_used = 1,
                .draft_pages_total = 8};
  const std::string out = m.Render(stats);
  EXPECT_NE(out.find("vllm:spec_decode_num_drafts_total 5\n"), std::string::npos) << out;
  EXPECT_NE(out.find("vllm:spec_decode_num_draft_tokens_total 9\n"), std::string::npos);
  EXPECT_NE(out.find("vllm:spec_decode_num_accepted_tokens_total 6\n"), std::string::npos);
  EXPECT_NE(out.find("vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 2\n"),
            std::string::npos);
  EXPECT_NE(out.find("pdserve:spec_decode_draft_pages_total 8\n"), std::string::npos);
}

// The names and types the Gateway API inference extension's endpoint picker reads (docs/api.md,
// "External schedulers"): a decode node's requests awaiting KV count as waiting there.
TEST(MetricsTest, EndpointPickerGaugesInVllmNames) {
  ServerMetrics m;
  EngineStats stats;
  stats.running = 3;
  stats.waiting = 2;
  stats.awaiting_kv = 4;
  stats.pages_used = 3;
  stats.pages_total = 8;
  stats.page_tokens = 16;
  const std::string out = m.Render(stats);
  for (const char* gauge :
       {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc", "vllm:cache_config_info"}) {
    EXPECT_NE(out.find(std::string("# TYPE ") + gauge + " gauge\n"), std::string::npos) << gauge;
  }
  EXPECT_NE(out.find("vllm:num_requests_running 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("vllm:num_requests_waiting 6\n"), std::string::npos) << out;
  EXPECT_NE(out.find("pdserve:num_requests_waiting 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("vllm:kv_cache_usage_perc 0.375\n"), std::string::npos) << out;
  EXPECT_NE(out.find("vllm:gpu_cache_usage_perc 0.375\n"), std::string::npos) << out;
  EXPECT_NE(out.find("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"8\"} 1\n"),
            std::string::npos)
      << out;
  // No LoRA adapters, so no LoRA info (as vLLM without --enable-lora).
  EXPECT_EQ(out.find("lora"), std::string::npos) << out;
}

}  // namespace
}  // namespace pdserve::server
