// Integration tests of `pdserve serve`'s API surface: response and chunk shapes against
// fixtures written from the OpenAI API reference, the error table, the API key, request ids,
// /v1/models, /health, /metrics and chat.
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "testing/node_process.h"

namespace pdserve::testing {
namespace {

using json = nlohmann::json;

json Fixture(const std::string& name) {
  std::ifstream in(std::string(PDSERVE_SERVER_FIXTURES) + "/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << name;
  return j;
}

// Every field of the fixture is present in `actual` with the same JSON type ("object" values
// equal). A null fixture value allows any value (fields that may be null); an empty fixture
// object allows any object; an array's elements are checked against the fixture's first.
void ExpectShape(const json& fixture, const json& actual, const std::string& path) {
  if (fixture.is_null()) return;
  if (fixture.is_object()) {
    ASSERT_TRUE(actual.is_object()) << path << ": " << actual.dump();
    for (const auto& [key, value] : fixture.items()) {
      ASSERT_TRUE(actual.contains(key)) << path << "." << key << " missing in " << actual.dump();
      if (key == "object") {
        EXPECT_EQ(actual[key], value) << path << "." << key;
      }
      ExpectShape(value, actual[key], path + "." + key);
    }
  } else if (fixture.is_array()) {
    ASSERT_TRUE(actual.is_array()) << path;
    if (!fixture.empty()) {
      for (size_t i = 0; i < actual.size(); ++i) {
        ExpectShape(fixture[0], actual[i], path + "[" + std::to_string(i) + "]");
      }
    } else {
      EXPECT_TRUE(actual.empty()) << path << ": " << actual.dump();
    }
  } else if (fixture.is_string()) {
    EXPECT_TRUE(actual.is_string()) << path << ": " << actual.dump();
  } else if (fixture.is_number_integer()) {
    EXPECT_TRUE(actual.is_number_integer()) << path << ": " << actual.dump();
  } else if (fixture.is_number()) {
    EXPECT_TRUE(actual.is_number()) << path << ": " << actual.dump();
  } else if (fixture.is_boolean()) {
    EXPECT_TRUE(actual.is_boolean()) << path;
  }
}

class NodeApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    node_ = std::make_unique<NodeProcess>(TinyModelDir(),
                                          std::vector<std::string>{"--served-model-name", "tiny"});
    ASSERT_TRUE(node_->ok()) << node_->error();
  }
  std::unique_ptr<NodeProcess> node_;
};

TEST_F(NodeApiTest, CompletionShapesMatchFixtures) {
  auto client = node_->Client();
  json body = {{"model", "tiny"}, {"prompt", "Hello"}, {"max_tokens", 5}, {"logprobs", 2}};
  auto res = client.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json r = json::parse(res->body);
  ExpectShape(Fixture("completion.json"), r, "completion");
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ExpectShape(Fixture("completion_logprobs.json"), r["choices"][0]["logprobs"], "logprobs");
  EXPECT_EQ(r["choices"][0]["logprobs"]["tokens"].size(),
            r["usage"]["completion_tokens"].get<size_t>());
  EXPECT_EQ(r["usage"]["total_tokens"],
            r["usage"]["prompt_tokens"].get<int>() + r["usage"]["completion_tokens"].get<int>());

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  SseStream s = PostStream(node_->port(), "/v1/completions", body);
  ASSERT_EQ(s.status, 200) << s.raw;
  EXPECT_EQ(s.content_type.rfind("text/event-stream", 0), 0u) << s.content_type;
  ASSERT_GE(s.events.size(), 2u);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.raw.substr(s.raw.size() - 14), "data: [DONE]\n\n");
  for (size_t i = 0; i + 1 < s.events.size(); ++i) {
    ExpectShape(Fixture("completion_chunk.json"), s.events[i], "chunk");
    EXPECT_TRUE(s.events[i]["usage"].is_null());
    EXPECT_EQ(s.events[i]["id"], s.events[0]["id"]);
  }
  EXPECT_FALSE(s.events[s.events.size() - 2]["choices"][0]["finish_reason"].is_null());
  const json& last = s.events.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], 5);
}

TEST_F(NodeApiTest, ChatShapesMatchFixtures) {
  auto client = node_->Client();
  json body = {{"model", "tiny"},
               {"messages",
                {{{"role", "system"}, {"content", "Be brief."}},
                 {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi"}}}}}}},
               {"max_completion_tokens", 6},
               {"logprobs", true},
               {"top_logprobs", 3},
               {"seed", 7}};
  auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json r = json::parse(res->body);
  ExpectShape(Fixture("chat_completion.json"), r, "chat");
  EXPECT_EQ(r["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  ExpectShape(Fixture("chat_logprobs.json"), r["choices"][0]["logprobs"], "logprobs");
  for (const json& t : r["choices"][0]["logprobs"]["content"]) {
    EXPECT_EQ(t["top_logprobs"].size(), 3u);
  }

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  body.erase("logprobs");
  body.erase("top_logprobs");
  SseStream s = PostStream(node_->port(), "/v1/chat/completions", body);
  ASSERT_EQ(s.status, 200) << s.raw;
  ASSERT_GE(s.events.size(), 3u);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string streamed;
  for (size_t i = 0; i + 1 < s.events.size(); ++i) {
    json fixture = Fixture("chat_completion_chunk.json");
    // The closing chunk's delta is empty ({}), as OpenAI sends it.
    if (!s.events[i]["choices"][0]["finish_reason"].is_null()) {
      fixture["choices"][0]["delta"] = json::object();
    }
    ExpectShape(fixture, s.events[i], "chunk");
    const json& delta = s.events[i]["choices"][0]["delta"];
    if (delta.contains("content")) streamed += delta["content"].get<std::string>();
  }
  EXPECT_FALSE(s.events[s.events.size() - 2]["choices"][0]["finish_reason"].is_null());
  ExpectShape(Fixture("chat_completion_chunk_usage.json"), s.events.back(), "usage chunk");
  // Same seed, same output, streamed or not.
  EXPECT_EQ(streamed, r["choices"][0]["message"]["content"]);
}

struct BadInput {
  std::string name;
  std::string path;
  std::string body;
  int status;
  std::string code;
};

TEST_F(NodeApiTest, BadInputsGetDocumentedErrors) {
  std::string big_prompt = "[1";  // 5000 token ids: past the tiny model's 4096-token context
  for (int i = 1; i < 5000; ++i) big_prompt += ",1";
  big_prompt += "]";
  const std::vector<BadInput> table = {
      {"malformed json", "/v1/completions", "{\"prompt\": ", 400, "invalid_json"},
      {"not an object", "/v1/completions", "[1,2]", 400, "invalid_json"},
      {"empty body", "/v1/completions", "", 400, "invalid_json"},
      {"missing prompt", "/v1/completions", R"({"max_tokens": 3})", 400, "missing_required"},
      {"prompt wrong type", "/v1/completions", R"({"prompt": 5})", 400, "invalid_type"},
      {"prompt empty list", "/v1/completions", R"({"prompt": []})", 400, "invalid_type"},
      {"two prompts", "/v1/completions", R"({"prompt": ["a", "b"]})", 400, "unsupported_value"},
      {"token id out of range", "/v1/completions", R"({"prompt": [1, 99999999]})", 400,
       "invalid_value"},
      {"negative token id", "/v1/completions", R"({"prompt": [-1]})", 400, "invalid_value"},
      {"max_tokens string", "/v1/completions", R"({"prompt": "a", "max_tokens": "5"})", 400,
       "invalid_type"},
      {"max_tokens zero", "/v1/completions", R"({"prompt": "a", "max_tokens": 0})", 400,
       "invalid_value"},
      {"temperature too high", "/v1/completions", R"({"prompt": "a", "temperature": 3})", 400,
       "invalid_value"},
      {"top_p zero", "/v1/completions", R"({"prompt": "a", "top_p": 0})", 400, "invalid_value"},
      {"n two", "/v1/completions", R"({"prompt": "a", "n": 2})", 400, "unsupported_value"},
      {"n zero", "/v1/completions", R"({"prompt": "a", "n": 0})", 400, "invalid_value"},
      {"best_of two", "/v1/completions", R"({"prompt": "a", "best_of": 2})", 400,
       "unsupported_value"},
      {"stop wrong type", "/v1/completions", R"({"prompt": "a", "stop": 3})", 400, "invalid_type"},
      {"logprobs too many", "/v1/completions", R"({"prompt": "a", "logprobs": 21})", 400,
       "invalid_value"},
      {"echo", "/v1/completions", R"({"prompt": "a", "echo": true})", 400, "unsupported_value"},
      {"stream not bool", "/v1/completions", R"({"prompt": "a", "stream": "yes"})", 400,
       "invalid_type"},
      {"unknown model", "/v1/completions", R"({"prompt": "a", "model": "gpt-9"})", 404,
       "model_not_found"},
      {"prompt too long", "/v1/completions", R"({"prompt": )" + big_prompt + "}", 400,
       "context_length_exceeded"},
      {"deep nesting", "/v1/completions", std::string(1000, '[') + std::string(1000, ']'), 400,
       "invalid_json"},
      {"chat missing messages", "/v1/chat/completions", R"({"model": "tiny"})", 400,
       "missing_required"},
      {"chat empty messages", "/v1/chat/completions", R"({"messages": []})", 400, "invalid_value"},
      {"json schema", "/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type":
       "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}})",
       400, "unsupported_value"},
      {"tool_choice required", "/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required", "tools":
       [{"type": "function", "function": {"name": "f", "parameters": {}}}]})",
       400, "unsupported_value"},
      {"chat bad role", "/v1/chat/completions",
       R"({"messages": [{"role": "wizard", "content": "x"}]})", 400, "invalid_value"},
      {"chat image part", "/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", 400,
       "unsupported_value"},
      {"chat top_logprobs without logprobs", "/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", 400,
       "invalid_value"},
      {"tokenize nothing", "/tokenize", R"({})", 400, "missing_required"},
      {"detokenize strings", "/detokenize", R"({"tokens": ["a"]})", 400, "invalid_type"},
      {"unknown route", "/v1/embeddings", R"({})", 404, "not_found"},
  };
  ASSERT_GE(table.size(), 20u);
  auto client = node_->Client();
  for (const BadInput& t : table) {
    auto res = client.Post(t.path, t.body, "application/json");
    ASSERT_TRUE(res) << t.name;
    EXPECT_EQ(res->status, t.status) << t.name << ": " << res->body;
    const json e = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << t.name << ": " << res->body;
    ExpectShape(Fixture("error.json"), e, t.name);
    EXPECT_EQ(e["error"]["code"], t.code) << t.name << ": " << res->body;
  }
  // The server is still healthy after all of that.
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(NodeApiTest, BodyOverTheLimitGets413) {
  auto client = node_->Client();
  const std::string body = R"({"prompt": ")" + std::string(5 << 20, 'a') + R"("})";
  auto res = client.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
}

TEST_F(NodeApiTest, ModelsHealthMetricsAndRequestIds) {
  auto client = node_->Client();
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200);
  const json m = json::parse(models->body);
  ExpectShape(Fixture("models.json"), m, "models");
  EXPECT_EQ(m["data"][0]["id"], "tiny");
  // models.retrieve: the one model by id; any other id is model_not_found.
  auto one = client.Get("/v1/models/tiny");
  ASSERT_TRUE(one);
  ASSERT_EQ(one->status, 200) << one->body;
  const json entry = json::parse(one->body);
  for (const char* key : {"id", "object", "owned_by", "max_model_len"}) {
    EXPECT_EQ(entry[key], m["data"][0][key]) << key << ": " << one->body;
  }
  auto other = client.Get("/v1/models/Qwen/other-model");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  EXPECT_EQ(json::parse(other->body)["error"]["code"], "model_not_found") << other->body;
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  // A given request id is echoed; without one the server makes one.
  auto with_id = client.Get("/v1/models", {{"X-Request-Id", "abc-123"}});
  ASSERT_TRUE(with_id);
  EXPECT_EQ(with_id->get_header_value("X-Request-Id"), "abc-123");
  EXPECT_FALSE(models->get_header_value("X-Request-Id").empty());
  auto done =
      client.Post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 4})", "application/json");
  ASSERT_TRUE(done);
  ASSERT_EQ(done->status, 200);
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  const std::string& text = metrics->body;
  for (const char* name :
       {"pdserve:time_to_first_token_seconds_count", "pdserve:inter_token_latency_seconds_count",
        "pdserve:e2e_request_latency_seconds_count", "pdserve:num_requests_running",
        "pdserve:num_requests_waiting", "pdserve:kv_cache_usage_perc",
        "pdserve:prompt_tokens_total", "pdserve:generation_tokens_total"}) {
    EXPECT_GE(MetricValue(text, name), 0) << name << "\n" << text;
  }
  EXPECT_EQ(MetricValue(text, "pdserve:e2e_request_latency_seconds_count"), 1);
  EXPECT_EQ(MetricValue(text, "pdserve:generation_tokens_total"), 4);
  EXPECT_EQ(MetricValue(text, "pdserve:inter_token_latency_seconds_count"), 3);
}

// The node applies the router's request-id policy: a safe id (what a router forwards) is
// kept, anything else is replaced, so node and router agree on every id they both keep.
TEST_F(NodeApiTest, RequestIdPolicyMatchesTheRouters) {
  auto client = node_->Client();
  const std::string router_made = "req-0123456789abcdef";
  auto kept = client.Get("/v1/models", {{"X-Request-Id", router_made}});
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->get_header_value("X-Request-Id"), router_made);
  for (const std::string& bad : {std::string(100, 'x'), std::string("a<b>{c}"),
                                 std::string("id;rm"), std::string("caf\xc3\xa9")}) {
    auto r = client.Get("/v1/models", {{"X-Request-Id", bad}});
    ASSERT_TRUE(r) << bad;
    const std::string chosen = r->get_header_value("X-Request-Id");
    EXPECT_NE(chosen, bad);
    EXPECT_TRUE(chosen.starts_with("req-")) << chosen;
  }
}

TEST_F(NodeApiTest, StopStringEndsTheCompletion) {
  auto client = node_->Client();
  json body = {
      {"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}};
  auto full = client.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(full);
  const std::string text = json::parse(full->body)["choices"][0]["text"];
  ASSERT_GT(text.size(), 6u);
  const std::string stop = text.substr(3, 2);
  body["stop"] = {stop};
  auto cut = client.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(cut);
  const json r = json::parse(cut->body);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][0]["text"], text.substr(0, text.find(stop)));
}

TEST_F(NodeApiTest, ChatUsesTheModelsTemplate) {
  // The synthetic tokenizer carries a ChatML template.
  auto client = node_->Client();
  const json msgs = {{{"role", "system"}, {"content", "Be brief."}},
                     {{"role", "user"}, {"content", "Hi"}}};
  auto tok = client.Post("/tokenize", json{{"messages", msgs}}.dump(), "application/json");
  ASSERT_TRUE(tok);
  ASSERT_EQ(tok->status, 200) << tok->body;
  const json ids = json::parse(tok->body)["tokens"];
  auto detok = client.Post("/detokenize", json{{"tokens", ids}}.dump(), "application/json");
  ASSERT_TRUE(detok);
  EXPECT_EQ(json::parse(detok->body)["prompt"],
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  // The chat endpoint generates from exactly that prompt.
  const json chat = {{"messages", msgs},
                     {"max_tokens", 6},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"return_token_ids", true}};
  auto r = client.Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["prompt_token_ids"], ids);
  const json comp = {{"prompt", ids},
                     {"max_tokens", 6},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"return_token_ids", true}};
  auto c = client.Post("/v1/completions", comp.dump(), "application/json");
  ASSERT_TRUE(c);
  EXPECT_EQ(json::parse(c->body)["choices"][0]["token_ids"], j["choices"][0]["token_ids"]);
}

TEST(NodeApiKeyTest, KeyRequiredWhenSet) {
  NodeProcess node(TinyModelDir(), {"--api-key", "sekret"});
  ASSERT_TRUE(node.ok()) << node.error();
  auto client = node.Client();
  const std::string body = R"({"prompt": "Hi", "max_tokens": 2})";
  auto none = client.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(json::parse(none->body)["error"]["code"], "invalid_api_key");
  auto wrong =
      client.Post("/v1/completions", {{"Authorization", "Bearer nope"}}, body, "application/json");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  auto right = client.Post("/v1/completions", {{"Authorization", "Bearer sekret"}}, body,
                           "application/json");
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200) << right->body;
  // Probes and scrapers need no key (Kubernetes probes send none: deploy/k8s).
  for (const char* path : {"/health", "/ready", "/metrics"}) {
    auto probe = client.Get(path);
    ASSERT_TRUE(probe) << path;
    EXPECT_EQ(probe->status, 200) << path;
  }
}

TEST(NodeOverloadTest, TooManyWaitingGets503WithRetryAfter) {
  // One request may wait for its first token; a long prompt prefilled 4 tokens per step keeps
  // the first one waiting while the second arrives.
  NodeProcess node(TinyModelDir(), {"--max-waiting", "1", "--max-batch-tokens", "4"});
  ASSERT_TRUE(node.ok()) << node.error();
  json slow = {{"prompt", std::vector<int>(4000, 65)}, {"max_tokens", 1}};
  // The first client gives up after a second; the server is killed at the end of the test.
  std::thread first([&] {
    auto c = node.Client();
    c.set_read_timeout(1, 0);
    c.Post("/v1/completions", slow.dump(), "application/json");
  });
  auto client = node.Client();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  bool running = false;
  while (!running && std::chrono::steady_clock::now() < deadline) {
    auto m = client.Get("/metrics");
    running = m && MetricValue(m->body, "pdserve:num_requests_running") >= 1;
  }
  ASSERT_TRUE(running);
  auto second =
      client.Post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 1})", "application/json");
  ASSERT_TRUE(second);
  first.join();
  EXPECT_EQ(second->status, 503) << second->body;
  EXPECT_EQ(second->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(second->body)["error"]["code"], "server_overloaded");
}

TEST(NodeRoleTest, DisaggregatedRolesFailClearly) {
  int code = 0;
  RunPdserve({"serve", "--role", "prefill", "--model", TinyModelDir(), "--listen", "127.0.0.1:0"},
             &code);
  EXPECT_EQ(code, 1);
}

}  // namespace
}  // namespace pdserve::testing
