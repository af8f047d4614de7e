// Integration tests of `pdserve serve`: the real binary on a free port, spoken to over HTTP.
// Outputs are checked against `pdserve generate --json` for the same prompt and seed.
#include <thread>

#include <gtest/gtest.h>

#include "testing/node_process.h"

namespace pdserve::testing {
namespace {

using json = nlohmann::json;

struct Reference {
  std::vector<int32_t> token_ids;
  std::string text;
};

Reference Generate(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"generate", "--model", TinyModelDir(), "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  int code = 0;
  const std::string out = RunPdserve(args, &code);
  EXPECT_EQ(code, 0) << out;
  json j = json::parse(out, nullptr, false);
  Reference r;
  if (j.is_object()) {
    r.token_ids = j["token_ids"].get<std::vector<int32_t>>();
    r.text = j["text"].get<std::string>();
  }
  return r;
}

json PostJson(NodeProcess& node, const std::string& path, const json& body, int* status) {
  auto client = node.Client();
  auto res = client.Post(path, body.dump(), "application/json");
  *status = res ? res->status : -1;
  return res ? json::parse(res->body, nullptr, false) : json();
}

class NodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    node_ = std::make_unique<NodeProcess>(TinyModelDir(), std::vector<std::string>{});
    ASSERT_TRUE(node_->ok()) << node_->error();
  }
  std::unique_ptr<NodeProcess> node_;
};

// Streamed text and token ids joined over every chunk.
Reference Collect(const SseStream& s) {
  Reference r;
  for (const json& e : s.events) {
    if (!e.contains("choices") || e["choices"].empty()) continue;
    const json& c = e["choices"][0];
    if (c.contains("text")) r.text += c["text"].get<std::string>();
    if (c.contains("delta") && c["delta"].contains("content")) {
      r.text += c["delta"]["content"].get<std::string>();
    }
    if (c.contains("token_ids")) {
      for (const json& t : c["token_ids"]) r.token_ids.push_back(t.get<int32_t>());
    }
  }
  return r;
}

TEST_F(NodeTest, GreedyCompletionEqualsGenerate) {
  const Reference ref = Generate(
      {"--prompt", "Once upon a time", "--max-tokens", "24", "--temperature", "0", "--ignore-eos"});
  ASSERT_EQ(ref.token_ids.size(), 24u);
  const json body = {{"prompt", "Once upon a time"},
                     {"max_tokens", 24},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"return_token_ids", true}};
  int status = 0;
  json r = PostJson(*node_, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["token_ids"].get<std::vector<int32_t>>(), ref.token_ids);
  EXPECT_EQ(r["choices"][0]["text"], ref.text);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 24);

  json stream_body = body;
  stream_body["stream"] = true;
  SseStream s = PostStream(node_->port(), "/v1/completions", stream_body);
  ASSERT_EQ(s.status, 200) << s.raw;
  EXPECT_TRUE(s.done);
  const Reference streamed = Collect(s);
  EXPECT_EQ(streamed.token_ids, ref.token_ids);
  EXPECT_EQ(streamed.text, ref.text);
}

TEST_F(NodeTest, SeededSamplingEqualsGenerate) {
  const Reference ref =
      Generate({"--prompt", "The little dog", "--max-tokens", "20", "--temperature", "0.9",
                "--top-p", "0.95", "--top-k", "50", "--seed", "1234", "--ignore-eos"});
  ASSERT_EQ(ref.token_ids.size(), 20u);
  json body = {{"prompt", "The little dog"},
               {"max_tokens", 20},
               {"temperature", 0.9},
               {"top_p", 0.95},
               {"top_k", 50},
               {"seed", 1234},
               {"ignore_eos", true},
               {"return_token_ids", true}};
  int status = 0;
  json r = PostJson(*node_, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["token_ids"].get<std::vector<int32_t>>(), ref.token_ids);
  EXPECT_EQ(r["choices"][0]["text"], ref.text);
  body["stream"] = true;
  const Reference streamed = Collect(PostStream(node_->port(), "/v1/completions", body));
  EXPECT_EQ(streamed.token_ids, ref.token_ids);
  EXPECT_EQ(streamed.text, ref.text);
}

TEST_F(NodeTest, TokenIdPromptEqualsTextPrompt) {
  int status = 0;
  json tok = PostJson(*node_, "/tokenize", {{"prompt", "Once upon a time"}}, &status);
  ASSERT_EQ(status, 200) << tok.dump();
  ASSERT_GT(tok["count"].get<int>(), 0);
  EXPECT_EQ(tok["tokens"].size(), tok["count"].get<size_t>());
  json detok = PostJson(*node_, "/detokenize", {{"tokens", tok["tokens"]}}, &status);
  ASSERT_EQ(status, 200);
  EXPECT_NE(detok["prompt"].get<std::string>().find("Once upon a time"), std::string::npos);
  const json base = {{"max_tokens", 8}, {"temperature", 0}, {"return_token_ids", true}};
  json by_text = base, by_ids = base;
  by_text["prompt"] = "Once upon a time";
  by_ids["prompt"] = tok["tokens"];
  json a = PostJson(*node_, "/v1/completions", by_text, &status);
  ASSERT_EQ(status, 200);
  json b = PostJson(*node_, "/v1/completions", by_ids, &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(a["choices"][0]["token_ids"], b["choices"][0]["token_ids"]);
  EXPECT_EQ(a["choices"][0]["prompt_token_ids"], tok["tokens"]);
}

TEST_F(NodeTest, ConcurrentStreamingClientsAllMatchTheSingleRun) {
  const json body = {
      {"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0},
      {"ignore_eos", true},           {"stream", true},   {"return_token_ids", true}};
  const Reference single = Collect(PostStream(node_->port(), "/v1/completions", body));
  ASSERT_EQ(single.token_ids.size(), 12u);
  constexpr int kClients = 64;
  std::vector<Reference> results(kClients);
  std::vector<int> statuses(kClients, 0);
  std::vector<char> done(kClients,
                         0);  // not vector<bool>: clients write their own slot concurrently
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      SseStream s = PostStream(node_->port(), "/v1/completions", body);
      statuses[i] = s.status;
      if (!s.error.empty()) ADD_FAILURE() << "client " << i << ": " << s.error;
      done[i] = s.done;
      results[i] = Collect(s);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(statuses[i], 200) << "client " << i;
    EXPECT_TRUE(done[i]) << "client " << i;
    EXPECT_EQ(results[i].token_ids, single.token_ids) << "client " << i;
    EXPECT_EQ(results[i].text, single.text) << "client " << i;
  }
}

TEST_F(NodeTest, DisconnectMidStreamCancelsAndFreesPages) {
  const json body = {{"prompt", "Once upon a time"},
                     {"max_tokens", 3000},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"stream", true}};
  SseStream s = PostStream(node_->port(), "/v1/completions", body, /*stop_after_events=*/3);
  // At least 3: one read may carry several events (the node writes a poll's events at once).
  EXPECT_GE(s.events.size(), 3u);
  EXPECT_FALSE(s.done);
  // The server notices on its next write, cancels, and the engine frees the pages.
  auto client = node_->Client();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::string metrics;
  bool drained = false;
  while (!drained && std::chrono::steady_clock::now() < deadline) {
    auto res = client.Get("/metrics");
    ASSERT_TRUE(res);
    metrics = res->body;
    drained = MetricValue(metrics, "pdserve:num_requests_running") == 0 &&
              MetricValue(metrics, "pdserve:kv_cache_usage_perc") == 0;
    if (!drained) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(drained) << metrics;
  // It ended by cancellation, not by reaching max_tokens.
  EXPECT_EQ(MetricValue(metrics, "pdserve:request_success_total{finished_reason=\"length\"}"), 0);
  EXPECT_LT(MetricValue(metrics, "pdserve:generation_tokens_total"), 3000);
}

// With no grace period (--shutdown-grace-s 0) SIGTERM ends a running stream at once, and
// properly: an error event ("cancelled") and [DONE], then exit 0. (With a grace period the
// stream may finish first: tests/server/drain_test.cc.)
TEST(NodeShutdownTest, SigtermDuringStreamExitsZeroPromptly) {
  NodeProcess node(TinyModelDir(), {"--shutdown-grace-s", "0"});
  ASSERT_TRUE(node.ok()) << node.error();
  const json body = {{"prompt", "Once upon a time"},
                     {"max_tokens", 3000},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"stream", true}};
  SseStream s;
  std::thread client([&] { s = PostStream(node.port(), "/v1/completions", body); });
  // Wait until the stream is running, then stop the server.
  auto c = node.Client();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    auto res = c.Get("/metrics");
    if (res && MetricValue(res->body, "pdserve:generation_tokens_total") > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(node.Terminate(/*timeout_ms=*/10000), 0);
  client.join();
  EXPECT_LT(Collect(s).text.size() + s.events.size(), 3000u + 3000u);
  EXPECT_TRUE(s.done) << "the stream was cut instead of ending with [DONE]";
  ASSERT_FALSE(s.events.empty());
  EXPECT_EQ(s.events.back().value("error", json::object()).value("code", ""), "cancelled")
      << s.events.back().dump();
}

}  // namespace
}  // namespace pdserve::testing
