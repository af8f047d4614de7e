// `pdserve bench serve` against a scripted OpenAI-style server on 127.0.0.1 that streams
// chunks at known delays with known token counts, and fails some requests: every metric is
// checked against the script (latencies within timer tolerance, counts and throughput
// formulas exactly against the measured duration).
#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "bench/serve_bench.h"
#include "scripted_server.h"
#include "testing/test_paths.h"

namespace pdserve::bench {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

std::vector<SampleRequest> Requests(const std::map<std::string, Script>& scripts,
                                    const std::vector<std::string>& order) {
  std::vector<SampleRequest> requests;
  for (const std::string& p : order) requests.push_back({p, scripts.at(p).prompt_len, 8});
  return requests;
}

ServeBenchOptions Options(const std::string& url) {
  ServeBenchOptions o;
  o.base_url = url;
  o.model = "scripted";
  o.arrivals.request_rate = std::numeric_limits<double>::infinity();
  o.request_timeout = std::chrono::seconds(10);
  o.print_table = false;
  return o;
}

TEST(ServeBenchTest, MetricsMatchTheScriptAndFailuresCountAsFailed) {
  const std::map<std::string, Script> scripts = {
      // Five tokens in four chunks: TPOT (e2e - ttft) / 4 = 15 ms while every ITL is 20 ms.
      {"fast", {.prompt_len = 100, .ttft_ms = 30, .gaps_ms = {20, 20, 20}, .usage_tokens = 5}},
      {"slow", {.prompt_len = 200, .ttft_ms = 150, .gaps_ms = {10, 10}, .usage_tokens = 3}},
      // No usage report: the content chunks are the token count.
      {"nousage", {.prompt_len = 50, .ttft_ms = 40, .gaps_ms = {20, 20}}},
      {"http500", {.prompt_len = 70, .status = 500, .gaps_ms = {}}},
      {"midstream", {.prompt_len = 80, .ttft_ms = 20, .gaps_ms = {20}, .error_event = true}},
      {"nodone", {.prompt_len = 90, .ttft_ms = 20, .gaps_ms = {20}, .send_done = false}},
  };
  ScriptedServer server(scripts);
  server.SlowFirst(2, 400);  // the two warm-ups: if counted, a TTFT would pass 400 ms
  const std::vector<std::string> order = {"fast", "slow",      "nousage", "http500", "fast",
                                          "slow", "midstream", "nodone",  "fast"};
  ServeBenchOptions options = Options(server.url());
  options.num_warmups = 2;
  options.max_concurrency = 4;
  options.slo = *ParseGoodput({"ttft:100", "e2el:1000"});
  const std::string dir = testing::MakeTempDir("serve_bench");
  options.result_file = dir + "/result.json";
  auto result = RunServeBench(options, Requests(scripts, order));
  ASSERT_TRUE(result.ok()) << result.status().ToString();

  // Counts: exact, from the script.
  int completed = 0, good = 0;
  long long input = 0, output = 0;
  for (const std::string& p : order) {
    const Script& s = scripts.at(p);
    if (!s.succeeds()) continue;
    ++completed;
    input += s.prompt_len;
    output += s.usage_tokens > 0 ? s.usage_tokens : 1 + static_cast<int>(s.gaps_ms.size());
    good += s.ttft_ms <= 100 ? 1 : 0;
  }
  std::ifstream in(options.result_file);
  const json j = json::parse(in);
  EXPECT_EQ(j["completed"], completed);
  EXPECT_EQ(j["failed"], static_cast<int>(order.size()) - completed);
  EXPECT_EQ(j["total_input_tokens"], input);
  EXPECT_EQ(j["total_output_tokens"], output);
  EXPECT_EQ(server.requests_for("fast"), 3 + options.num_warmups);  // warm-ups were sent...
  const double duration = j["duration"];
  ASSERT_GT(duration, 0);
  EXPECT_DOUBLE_EQ(j["request_throughput"].get<double>(), completed / duration);
  EXPECT_DOUBLE_EQ(j["output_throughput"].get<double>(), output / duration);
  EXPECT_DOUBLE_EQ(j["total_token_throughput"].get<double>(), (input + output) / duration);
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), good / duration);

  // Per request: latencies within timer tolerance of the script.
  double tpot_sum = 0;
  int tpot_n = 0;
  ASSERT_EQ(result->outcomes.size(), order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const Script& s = scripts.at(order[i]);
    const RequestOutcome& o = result->outcomes[i];
    ASSERT_EQ(o.success, s.succeeds()) << order[i] << ": " << o.error;
    EXPECT_EQ(j["errors"][i].get<std::string>().empty(), s.succeeds()) << order[i];
    if (!s.succeeds()) {
      EXPECT_EQ(j["output_lens"][i], 0);
      // Why it failed: a JSON error status and an error event are well-formed errors.
      const FailureKind want = s.status != 200 ? FailureKind::kHttpError
                               : s.error_event ? FailureKind::kErrorEvent
                                               : FailureKind::kNoDone;
      EXPECT_EQ(FailureKindName(o.failure), std::string(FailureKindName(want))) << order[i];
      continue;
    }
    EXPECT_EQ(o.failure, FailureKind::kNone);
    // ...but not counted: a warm-up's 400 ms extra would show here.
    EXPECT_GE(o.ttft_s * 1000, s.ttft_ms) << order[i];
    EXPECT_LT(o.ttft_s * 1000, s.ttft_ms + kTolMs) << order[i];
    ASSERT_EQ(o.itls_s.size(), s.gaps_ms.size()) << order[i];
    int e2el_ms = s.ttft_ms;
    for (size_t k = 0; k < s.gaps_ms.size(); ++k) {
      EXPECT_NEAR(o.itls_s[k] * 1000, s.gaps_ms[k], kTolMs) << order[i] << " gap " << k;
      e2el_ms += s.gaps_ms[k];
    }
    EXPECT_GE(o.e2el_s * 1000, e2el_ms) << order[i];
    EXPECT_LT(o.e2el_s * 1000, e2el_ms + kTolMs) << order[i];
    EXPECT_EQ(j["output_lens"][i], o.output_tokens);
    EXPECT_DOUBLE_EQ(j["ttfts"][i].get<double>(), o.ttft_s);
    EXPECT_EQ(j["input_lens"][i], s.prompt_len);
    const double tpot = (o.e2el_s - o.ttft_s) / (o.output_tokens - 1);
    EXPECT_NEAR(tpot * 1000, (e2el_ms - s.ttft_ms) / (o.output_tokens - 1.0), kTolMs / 2);
    tpot_sum += tpot;
    ++tpot_n;
  }
  EXPECT_NEAR(j["mean_tpot_ms"].get<double>(), tpot_sum / tpot_n * 1000, 1e-9);
  EXPECT_TRUE(j.contains("p99_itl_ms") && j.contains("median_e2el_ms") &&
              j.contains("std_ttft_ms"));

  // What was sent: streamed, usage asked for, ignore_eos, max_tokens = the output length.
  const json body = server.last_body();
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["max_tokens"], 8);
  EXPECT_EQ(body["model"], "scripted");
}

TEST(ServeBenchTest, ChatTtftWaitsForContentNotTheRoleChunk) {
  const std::map<std::string, Script> scripts = {
      {"hello",
       {.prompt_len = 12, .ttft_ms = 80, .gaps_ms = {15}, .usage_tokens = 2, .role_chunk_ms = 0}}};
  ScriptedServer server(scripts);
  ServeBenchOptions options = Options(server.url());
  options.endpoint = EndpointType::kChat;
  auto result = RunServeBench(options, Requests(scripts, {"hello", "hello"}));
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->metrics.completed, 2);
  for (const RequestOutcome& o : result->outcomes) {
    EXPECT_GE(o.ttft_s * 1000, 80);
    EXPECT_LT(o.ttft_s * 1000, 80 + kTolMs);
    ASSERT_EQ(o.itls_s.size(), 1u);
  }
  EXPECT_EQ(server.last_body()["messages"][0]["role"], "user");
}

TEST(ServeBenchTest, RequestsLeaveAtTheirArrivalTimes) {
  const std::map<std::string, Script> scripts = {
      {"p", {.prompt_len = 4, .ttft_ms = 1, .gaps_ms = {}, .usage_tokens = 1}}};
  ScriptedServer server(scripts);
  ServeBenchOptions options = Options(server.url());
  options.arrivals = {/*request_rate=*/20, /*burstiness=*/1, /*seed=*/3};
  const int n = 8;
  auto result = RunServeBench(options, Requests(scripts, std::vector<std::string>(n, "p")));
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  const std::vector<double> planned = ArrivalTimes(n, options.arrivals);
  const std::vector<TimePoint> seen = server.arrivals();
  ASSERT_EQ(seen.size(), static_cast<size_t>(n));
  for (int i = 1; i < n; ++i) {
    const double offset_ms = std::chrono::duration<double, std::milli>(seen[i] - seen[0]).count();
    EXPECT_NEAR(offset_ms, (planned[i] - planned[0]) * 1000, kTolMs) << "request " << i;
  }
}

TEST(ServeBenchTest, MultiTurnSendsEachTurnOnlyOnceItsPredecessorFinished) {
  // Three conversations of three turns; a first turn answers at 150 ms, a later one at 30 ms
  // (a cached history), each with a second chunk 40 ms later.
  std::map<std::string, Script> scripts;
  std::vector<SampleRequest> requests;
  auto name = [](int c, int t) { return "c" + std::to_string(c) + "t" + std::to_string(t); };
  const int conversations = 3, turns = 3;
  for (int c = 0; c < conversations; ++c) {
    for (int t = 1; t <= turns; ++t) {
      scripts[name(c, t)] = {
          .prompt_len = 10 * t, .ttft_ms = t == 1 ? 150 : 30, .gaps_ms = {40}, .usage_tokens = 2};
      requests.push_back(SampleRequest{.prompt = name(c, t),
                                       .prompt_len = 10 * t,
                                       .output_len = 2,
                                       .conversation = c,
                                       .turn = t});
    }
  }
  ScriptedServer server(scripts);
  ServeBenchOptions options = Options(server.url());
  options.max_concurrency = 2;  // two conversations at once
  const std::string dir = testing::MakeTempDir("serve_multi_turn");
  options.result_file = dir + "/result.json";
  auto result = RunServeBench(options, requests);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ASSERT_EQ(result->metrics.completed, conversations * turns);

  // A turn leaves only once the server has finished its predecessor's answer.
  for (int c = 0; c < conversations; ++c) {
    for (int t = 2; t <= turns; ++t) {
      const std::optional<TimePoint> sent = server.first_arrival(name(c, t));
      const std::optional<TimePoint> previous_done = server.first_finish(name(c, t - 1));
      ASSERT_TRUE(sent && previous_done) << name(c, t);
      EXPECT_GT(*sent, *previous_done) << name(c, t) << " was sent before its predecessor ended";
    }
  }
  // The third conversation waits for a slot: one of the first two has ended.
  const TimePoint first_end =
      std::min(*server.first_finish(name(0, turns)), *server.first_finish(name(1, turns)));
  EXPECT_GT(*server.first_arrival(name(2, 1)), first_end);

  // TTFT per turn, and of the later turns together, in the result file.
  std::ifstream in(options.result_file);
  const json j = json::parse(in);
  ASSERT_EQ(j["ttft_by_turn"].size(), static_cast<size_t>(turns)) << j.dump();
  for (int t = 1; t <= turns; ++t) {
    const json& turn = j["ttft_by_turn"][t - 1];
    const double want_ms = t == 1 ? 150 : 30;
    EXPECT_EQ(turn["turn"], t);
    EXPECT_EQ(turn["completed"], conversations);
    EXPECT_DOUBLE_EQ(turn["mean_input_len"].get<double>(), 10.0 * t);
    EXPECT_GE(turn["median_ttft_ms"].get<double>(), want_ms) << t;
    EXPECT_LT(turn["median_ttft_ms"].get<double>(), want_ms + kTolMs) << t;
  }
  EXPECT_EQ(j["later_turns"]["completed"], conversations * (turns - 1));
  EXPECT_DOUBLE_EQ(j["later_turns"]["mean_input_len"].get<double>(), 25.0);
  EXPECT_LT(j["later_turns"]["p99_ttft_ms"].get<double>(), 30 + kTolMs);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(j["turns"][i], requests[i].turn);
    EXPECT_EQ(j["conversations"][i], requests[i].conversation);
  }
  const std::string table = FormatMetricsTable(result->metrics, {"ttft"}, false);
  EXPECT_NE(table.find("Turn 1 mean / median TTFT (ms):"), std::string::npos) << table;
  EXPECT_NE(table.find("Turns 2-3 mean / median TTFT (ms):"), std::string::npos) << table;
}

TEST(ServeBenchTest, TimeoutsAndUnreachableServersFail) {
  const std::map<std::string, Script> scripts = {
      {"stall", {.prompt_len = 4, .ttft_ms = 1500, .gaps_ms = {}, .usage_tokens = 1}}};
  ScriptedServer server(scripts);
  ServeBenchOptions options = Options(server.url());
  options.request_timeout = milliseconds(300);
  auto result = RunServeBench(options, Requests(scripts, {"stall"}));
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->metrics.failed, 1);
  EXPECT_EQ(result->metrics.completed, 0);
  EXPECT_FALSE(result->outcomes[0].error.empty());
  EXPECT_EQ(result->outcomes[0].failure, FailureKind::kTimeout);

  options.base_url = "http://127.0.0.1:1";  // nothing listens on port 1
  result = RunServeBench(options, Requests(scripts, {"stall"}));
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->metrics.failed, 1);
  EXPECT_NE(result->outcomes[0].error.find("HTTP request failed"), std::string::npos)
      << result->outcomes[0].error;
  EXPECT_EQ(result->outcomes[0].failure, FailureKind::kConnect);

  options.base_url = "ftp://127.0.0.1:1";
  EXPECT_FALSE(RunServeBench(options, Requests(scripts, {"stall"})).ok());
}

TEST(ServeDatasetTest, JsonlLinesGiveThePromptsCycledAndBadLinesAreNamed) {
  const std::string dir = testing::MakeTempDir("serve_jsonl");
  {
    std::ofstream out(dir + "/ok.jsonl");
    out << R"({"prompt": "a b c", "output_len": 7, "prompt_len": 3})"
        << "\n\n"
        << R"({"prompt": "d", "output_len": 2})"
        << "\n";
  }
  auto requests = JsonlDataset(dir + "/ok.jsonl", 3, nullptr);
  ASSERT_TRUE(requests.ok()) << requests.status().ToString();
  ASSERT_EQ(requests->size(), 3u);
  EXPECT_EQ((*requests)[0].prompt, "a b c");
  EXPECT_EQ((*requests)[0].prompt_len, 3);
  EXPECT_EQ((*requests)[0].output_len, 7);
  EXPECT_EQ((*requests)[1].prompt_len, 0);    // unknown: the server's usage fills it in
  EXPECT_EQ((*requests)[2].prompt, "a b c");  // cycled
  {
    std::ofstream out(dir + "/bad.jsonl");
    out << R"({"prompt": "x", "output_len": 1})"
        << "\n"
        << R"({"prompt": "y"})"
        << "\n";
  }
  auto bad = JsonlDataset(dir + "/bad.jsonl", 2, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.jsonl:2"), std::string::npos)
      << bad.status().ToString();
  EXPECT_FALSE(JsonlDataset(dir + "/missing.jsonl", 1, nullptr).ok());
}

}  // namespace
}  // namespace pdserve::bench
