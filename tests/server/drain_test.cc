// Draining shutdown with real processes: a node given SIGTERM refuses new requests (503,
// /health 503) while its running stream finishes; with no grace left, a running stream ends
// with an SSE error event and [DONE] rather than a cut; and `pdserve up` stops its nodes
// before its router, so a stream through it ends properly and the router logs how it ended.
#include <signal.h>

#include <functional>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "testing/cluster_processes.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

using nlohmann::json;

// A streamed completion read event by event; `on_first` runs (on the reading thread) once the
// first event is in, while the stream goes on.
struct Stream {
  int status = 0;
  std::vector<json> events;
  bool done = false;   // "data: [DONE]" arrived
  bool ended = false;  // the chunked body ended cleanly (not cut)
  std::string raw;
};

Stream ReadStream(int port, int max_tokens, const std::function<void()>& on_first) {
  Stream s;
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = json{
      {"prompt", "Once upon a time"},
      {"max_tokens", max_tokens},
      {"ignore_eos", true},
      {"stream",
       true}}.dump();
  std::string pending;
  bool fired = false;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    s.raw.append(data, len);
    pending.append(data, len);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (!event.starts_with("data: ")) continue;
      if (event == "data: [DONE]") {
        s.done = true;
      } else {
        s.events.push_back(json::parse(event.substr(6), nullptr, false));
      }
    }
    if (!fired && !s.events.empty()) {
      fired = true;
      on_first();
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  s.ended = client.send(req, res, error);
  s.status = res.status;
  return s;
}

// The stream finished normally: its last chunk has a finish_reason, no error event.
bool Completed(const Stream& s) {
  for (const json& e : s.events) {
    if (e.contains("error")) return false;
  }
  return !s.events.empty() && s.events.back().contains("choices") &&
         !s.events.back()["choices"].empty() &&
         s.events.back()["choices"][0].value("finish_reason", json()).is_string();
}

// The code of the stream's error event, or "".
std::string ErrorCode(const Stream& s) {
  for (const json& e : s.events) {
    if (e.contains("error")) return e["error"].value("code", "?");
  }
  return "";
}

std::vector<std::string> NodeArgv(int port, int grace_s) {
  return {BinaryPath("src/cli/pdserve"),
          "serve",
          "--model",
          TinyModelDir(),
          "--listen",
          "127.0.0.1:" + std::to_string(port),
          "--threads",
          "1",
          "--shutdown-grace-s",
          std::to_string(grace_s)};
}

TEST(DrainTest, NodeRefusesNewRequestsAndLetsTheRunningStreamFinish) {
  const int port = FreePort();
  Subprocess node(NodeArgv(port, 60));
  ASSERT_TRUE(WaitHealthy(port, Deadline::AfterMs(60000)));
  int new_status = 0, health_status = 0;
  std::string new_code;
  const Stream s = ReadStream(port, 1000, [&] {
    node.Signal(SIGTERM);
    // The signal is taken asynchronously: wait (bounded) until the node says it is draining.
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(10, 0);
    const Deadline deadline = Deadline::AfterMs(10000);
    while (!deadline.Passed()) {
      auto health = client.Get("/health");
      health_status = health ? health->status : -1;
      if (health_status == 503) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    auto r =
        client.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})", "application/json");
    new_status = r ? r->status : -1;
    if (r) new_code = json::parse(r->body, nullptr, false)["error"].value("code", "");
  });
  EXPECT_EQ(health_status, 503) << "/health did not report the drain";
  EXPECT_EQ(new_status, 503) << "a new request was taken while draining";
  EXPECT_EQ(new_code, "shutting_down");
  EXPECT_TRUE(s.ended && s.done) << "the running stream was cut: " << s.raw.substr(0, 300);
  EXPECT_TRUE(Completed(s)) << "the running stream did not finish within the grace period: "
                            << ErrorCode(s);
  auto status = node.Wait(Deadline::AfterMs(30000));
  ASSERT_TRUE(status.has_value()) << "the node did not exit after its stream finished";
  EXPECT_TRUE(status->success()) << status->ToString();
}

TEST(DrainTest, StreamPastTheGraceEndsWithAnErrorEventAndDone) {
  const int port = FreePort();
  Subprocess node(NodeArgv(port, 0));
  ASSERT_TRUE(WaitHealthy(port, Deadline::AfterMs(60000)));
  const Stream s = ReadStream(port, 3500, [&] { node.Signal(SIGTERM); });
  EXPECT_TRUE(s.ended && s.done) << "the stream was cut: ..."
                                 << s.raw.substr(s.raw.size() > 300 ? s.raw.size() - 300 : 0);
  if (!Completed(s)) {
    EXPECT_EQ(ErrorCode(s), "cancelled") << "neither finished nor ended properly";
  }
  auto status = node.Wait(Deadline::AfterMs(30000));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->success()) << status->ToString();
}

TEST(DrainTest, UpStopsNodesBeforeTheRouterAndLogsHonestly) {
  const std::string model = TinyModelDir();
  ASSERT_FALSE(model.empty());
  Subprocess up({BinaryPath("src/cli/pdserve"), "up", "--model", model, "--nodes", "1", "--port",
                 "0", "--threads-per-node", "1", "--kv-cache-mb", "64", "--shutdown-grace-s", "0"},
                /*with_stderr=*/true);
  auto line = up.ReadLineContaining("ready at", Deadline::AfterMs(120000));
  ASSERT_TRUE(line.has_value()) << "pdserve up did not print its ready line";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(*line, m, std::regex(R"(http://[^:]+:(\d+))"))) << *line;
  const int port = std::stoi(m[1]);
  const Stream s = ReadStream(port, 3500, [&] { up.Signal(SIGTERM); });
  EXPECT_TRUE(s.ended && s.done) << "the stream through `up` was cut: ..."
                                 << s.raw.substr(s.raw.size() > 300 ? s.raw.size() - 300 : 0);
  const bool completed = Completed(s);
  if (!completed) {
    EXPECT_EQ(ErrorCode(s), "cancelled") << "neither finished nor ended properly";
  }
  // The router's line for the stream says how it ended.
  auto logged = up.ReadLineContaining("outcome=", Deadline::AfterMs(30000));
  ASSERT_TRUE(logged.has_value()) << "no router log line for the stream";
  EXPECT_NE(logged->find(completed ? "outcome=ok" : "outcome=upstream_error"), std::string::npos)
      << *logged;
  auto status = up.Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(status.has_value()) << "pdserve up did not exit";
  EXPECT_TRUE(status->success()) << status->ToString();
}

}  // namespace
}  // namespace pdserve::testing
