// `pdserve serve --speculative draft`: the real binary with a draft model gives the tokens and
// text `pdserve generate` gives without one, reports vLLM's speculative-decoding counters on
// /metrics, and refuses a draft model of another vocabulary at start-up.
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "testing/node_process.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

using json = nlohmann::json;

std::string QuietTargetDir() {
  return SyntheticModelDir("tiny", {.quiet_from_layer = 2, .quiet_scale = 0.05f});
}
std::string TruncatedDraftDir() { return SyntheticModelDir("tiny", {.num_layers = 2}); }

std::vector<int32_t> GenerateIds(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {
      "generate",     "--model", QuietTargetDir(), "--json", "--prompt",    "Once upon a time",
      "--max-tokens", "48",      "--temperature",  "0",      "--ignore-eos"};
  args.insert(args.end(), extra.begin(), extra.end());
  int code = 0;
  const std::string out = RunPdserve(args, &code);
  EXPECT_EQ(code, 0) << out;
  json j = json::parse(out, nullptr, false);
  if (!j.is_object()) return {};
  return j["token_ids"].get<std::vector<int32_t>>();
}

TEST(SpecServeTest, DraftModelServesTheSameTokensAndCountsAcceptance) {
  const std::vector<int32_t> want = GenerateIds({});
  ASSERT_EQ(want.size(), 48u);
  // `generate` with the draft model, too.
  EXPECT_EQ(GenerateIds({"--speculative", "draft", "--draft-model", TruncatedDraftDir(),
                         "--num-speculative-tokens", "4"}),
            want);
  // With the target on two tensor-parallel ranks (the verified rows' logits gathered on both).
  EXPECT_EQ(GenerateIds({"--tp", "2", "--speculative", "draft", "--draft-model",
                         TruncatedDraftDir(), "--num-speculative-tokens", "5"}),
            want);

  NodeProcess node(QuietTargetDir(), {"--speculative", "draft", "--draft-model",
                                      TruncatedDraftDir(), "--num-speculative-tokens", "3"});
  ASSERT_TRUE(node.ok()) << node.error();
  const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 48}, {"temperature", 0},
                     {"ignore_eos", true},           {"stream", true},   {"logprobs", 1},
                     {"return_token_ids", true}};
  SseStream s = PostStream(node.port(), "/v1/completions", body);
  ASSERT_EQ(s.status, 200) << s.raw;
  EXPECT_TRUE(s.done);
  std::vector<int32_t> got;
  size_t multi_token_events = 0;
  for (const json& e : s.events) {
    if (!e.contains("choices") || e["choices"].empty()) continue;
    const json& c = e["choices"][0];
    if (!c.contains("token_ids")) continue;
    for (const json& t : c["token_ids"]) got.push_back(t.get<int32_t>());
    multi_token_events += c["token_ids"].size() > 1;
  }
  EXPECT_EQ(got, want);
  EXPECT_GT(multi_token_events, 0u);  // accepted drafts stream together

  // The node publishes its counters after the step that finished the request, which may be
  // after the stream's last event: poll until that step's figures are out.
  auto client = node.Client();
  std::string m;
  for (int i = 0; i < 200; ++i) {
    auto metrics = client.Get("/metrics");
    ASSERT_TRUE(metrics);
    m = metrics->body;
    if (MetricValue(m, "pdserve:num_requests_running") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double drafts = MetricValue(m, "vllm:spec_decode_num_drafts_total");
  const double drafted = MetricValue(m, "vllm:spec_decode_num_draft_tokens_total");
  const double accepted = MetricValue(m, "vllm:spec_decode_num_accepted_tokens_total");
  EXPECT_GT(drafts, 0) << m;
  EXPECT_GT(accepted, 0.5 * drafted) << m;
  EXPECT_LE(drafted, 3 * drafts) << m;
  EXPECT_GE(MetricValue(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"}"),
            MetricValue(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"2\"}"))
      << m;
  EXPECT_EQ(MetricValue(m, "pdserve:spec_decode_num_speculative_tokens"), 3) << m;
  EXPECT_EQ(MetricValue(m, "pdserve:spec_decode_draft_pages_used"), 0) << m;
  EXPECT_EQ(MetricValue(m, "pdserve:kv_pages_used"), 0) << m;
}

TEST(SpecServeTest, ADraftModelOfAnotherVocabularyIsRefusedAtStartUp) {
  const std::string log = BinaryPath("spec-serve-refused.log");
  NodeLaunch launch;
  launch.log_path = log;
  NodeProcess node(QuietTargetDir(),
                   {"--speculative", "draft", "--draft-model", SyntheticModelDir("tiny-qwen2")},
                   launch);
  EXPECT_FALSE(node.ok());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("vocabulary"), std::string::npos) << text.str();
  // Asking for speculation without a draft model is refused too.
  int code = 0;
  RunPdserve({"generate", "--model", QuietTargetDir(), "--prompt", "x", "--speculative", "draft"},
             &code);
  EXPECT_NE(code, 0);
}

}  // namespace
}  // namespace pdserve::testing
