// Prefix caching in `pdserve serve` (on by default): a repeated prompt is answered with the same
// text and token ids, and /metrics counts the second request's hit in tokens as vLLM does
// (queries: each request's prompt tokens; hits: its full cached pages, capped at the prompt
// less its last token), with the cached pages evictable once no request holds them.
// `--no-prefix-caching` answers the same and counts nothing; with `--tp 2` every rank's cache
// serves the shared page ids and the answers stay the same.
#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "testing/node_process.h"
#include "testing/test_models.h"

namespace pdserve::testing {
namespace {

using json = nlohmann::json;

const char kPrompt[] =
    "A shared system prompt: answer briefly, cite nothing, and keep the tone friendly. The user "
    "asks about the weather in a town by the sea.";

json Complete(NodeProcess& node) {
  auto client = node.Client();
  const json body = {{"prompt", kPrompt},  {"max_tokens", 12},         {"temperature", 0},
                     {"ignore_eos", true}, {"return_token_ids", true}, {"logprobs", 2}};
  auto res = client.Post("/v1/completions", body.dump(), "application/json");
  EXPECT_TRUE(res);
  if (!res) return json();
  EXPECT_EQ(res->status, 200) << res->body;
  return json::parse(res->body, nullptr, false);
}

// /metrics once the step that finished the last request has published its figures.
std::string SettledMetrics(NodeProcess& node) {
  auto client = node.Client();
  std::string m;
  for (int i = 0; i < 200; ++i) {
    auto metrics = client.Get("/metrics");
    EXPECT_TRUE(metrics);
    if (!metrics) return m;
    m = metrics->body;
    if (MetricValue(m, "pdserve:num_requests_running") == 0 &&
        MetricValue(m, "pdserve:kv_pages_used") == 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return m;
}

TEST(PrefixServeTest, ARepeatedPromptHitsTheCacheAndAnswersTheSame) {
  NodeProcess node(TinyModelDir(), {"--page-size", "16"});
  ASSERT_TRUE(node.ok()) << node.error();
  const json first = Complete(node);
  const json second = Complete(node);
  ASSERT_TRUE(first.is_object() && second.is_object());
  const int prompt_tokens = first["usage"]["prompt_tokens"].get<int>();
  ASSERT_GT(prompt_tokens, 32);
  EXPECT_EQ(second["choices"][0]["text"], first["choices"][0]["text"]);
  EXPECT_EQ(second["choices"][0]["token_ids"], first["choices"][0]["token_ids"]);
  EXPECT_EQ(second["choices"][0]["logprobs"], first["choices"][0]["logprobs"]);

  const std::string m = SettledMetrics(node);
  EXPECT_EQ(MetricValue(m, "vllm:prefix_cache_queries_total"), 2 * prompt_tokens) << m;
  EXPECT_EQ(MetricValue(m, "vllm:prefix_cache_hits_total"), (prompt_tokens - 1) / 16 * 16) << m;
  // The first request computed its prompt and all answer tokens but the last.
  const int cached = (prompt_tokens + 11) / 16;
  EXPECT_EQ(MetricValue(m, "pdserve:kv_pages_cached"), cached) << m;
  EXPECT_EQ(MetricValue(m, "pdserve:kv_pages_evictable"), cached) << m;
  EXPECT_EQ(MetricValue(m, "pdserve:kv_pages_used"), 0) << m;

  NodeProcess plain(TinyModelDir(), {"--page-size", "16", "--no-prefix-caching"});
  ASSERT_TRUE(plain.ok()) << plain.error();
  const json uncached = Complete(plain);
  Complete(plain);
  ASSERT_TRUE(uncached.is_object());
  EXPECT_EQ(uncached["choices"][0]["text"], first["choices"][0]["text"]);
  EXPECT_EQ(uncached["choices"][0]["logprobs"], first["choices"][0]["logprobs"]);
  const std::string pm = SettledMetrics(plain);
  EXPECT_EQ(MetricValue(pm, "vllm:prefix_cache_queries_total"), 0) << pm;
  EXPECT_EQ(MetricValue(pm, "vllm:prefix_cache_hits_total"), 0) << pm;
  EXPECT_EQ(MetricValue(pm, "pdserve:kv_pages_cached"), 0) << pm;

  NodeProcess tp(TinyModelDir(), {"--page-size", "16", "--tp", "2", "--threads", "1"});
  ASSERT_TRUE(tp.ok()) << tp.error();
  for (int i = 0; i < 2; ++i) {
    const json answer = Complete(tp);
    ASSERT_TRUE(answer.is_object());
    EXPECT_EQ(answer["choices"][0]["token_ids"], first["choices"][0]["token_ids"]) << i;
    EXPECT_EQ(answer["choices"][0]["logprobs"], first["choices"][0]["logprobs"]) << i;
  }
  const std::string tm = SettledMetrics(tp);
  EXPECT_EQ(MetricValue(tm, "vllm:prefix_cache_hits_total"), (prompt_tokens - 1) / 16 * 16) << tm;
}

}  // namespace
}  // namespace pdserve::testing
