// A scripted OpenAI-style streaming server on 127.0.0.1 for the load generator's tests: each
// prompt maps to a Script (status, chunk delays, token counts, failures), so every metric the
// client computes can be checked against known values. Test-only; handlers run on the
// server's own thread pool, accessors are safe from the test thread.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "common/clock.h"

namespace pdserve::bench {

// How the server answers one prompt. Content chunks come at ttft, ttft + gaps[0], ...
struct Script {
  int prompt_len = 0;
  int status = 200;
  int ttft_ms = 0;
  std::vector<int> gaps_ms;
  int usage_tokens = 0;      // 0: no usage chunk
  bool error_event = false;  // an error event after the first chunk, then [DONE]
  bool send_done = true;
  int role_chunk_ms = -1;  // chat: a role-only chunk (no content) this early
  bool succeeds() const { return status == 200 && !error_event && send_done; }
};

// Times in this scripts' scenarios are far apart enough for a loaded 2-core machine. Under
// ThreadSanitizer every access of the client and the server is instrumented, and the first
// race report of the process, even one tests/tsan.supp then silences (libcpp-httplib's), stops
// every thread while the runtime reads the binaries' debug information to symbolize it: a
// stream's chunk came 170-240 ms late there. So under TSan the times are checked only to
// within that stall; the Release and ASan builds check them to 25 ms.
#if defined(__SANITIZE_THREAD__)
constexpr double kTolMs = 300;
#else
constexpr double kTolMs = 25;
#endif

class ScriptedServer {
  using json = nlohmann::json;
  using milliseconds = std::chrono::milliseconds;

 public:
  explicit ScriptedServer(std::map<std::string, Script> scripts) : scripts_(std::move(scripts)) {
    server_.set_tcp_nodelay(true);
    server_.new_task_queue = [] { return new httplib::ThreadPool(16); };
    auto handler = [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, req.path == "/v1/chat/completions");
    };
    server_.Post("/v1/completions", handler);
    server_.Post("/v1/chat/completions", handler);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // bind_to_any_port already listens; wait for the accept loop before the first request.
    const Deadline ready = Deadline::AfterMs(5000);
    while (!server_.is_running() && !ready.Passed()) std::this_thread::sleep_for(milliseconds(1));
  }
  ~ScriptedServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests_for(const std::string& prompt) {
    std::lock_guard lock(mu_);
    return counts_[prompt];
  }
  std::vector<TimePoint> arrivals() {
    std::lock_guard lock(mu_);
    return arrivals_;
  }
  // When `prompt` was first received, and when the server wrote the end of its first answer
  // (its [DONE]); nullopt before.
  std::optional<TimePoint> first_arrival(const std::string& prompt) {
    std::lock_guard lock(mu_);
    const auto it = first_arrival_.find(prompt);
    return it == first_arrival_.end() ? std::nullopt : std::optional<TimePoint>(it->second);
  }
  std::optional<TimePoint> first_finish(const std::string& prompt) {
    std::lock_guard lock(mu_);
    const auto it = first_finish_.find(prompt);
    return it == first_finish_.end() ? std::nullopt : std::optional<TimePoint>(it->second);
  }
  json last_body() {
    std::lock_guard lock(mu_);
    return last_body_;
  }
  // The first `n` requests ever received take this much longer to start (the warm-ups).
  void SlowFirst(int n, int extra_ms) {
    slow_first_ = n;
    slow_extra_ms_ = extra_ms;
  }

 private:
  void Handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    const json body = json::parse(req.body);
    const std::string prompt = chat ? body["messages"][0]["content"].get<std::string>()
                                    : body["prompt"].get<std::string>();
    int order;
    {
      std::lock_guard lock(mu_);
      order = received_++;
      ++counts_[prompt];
      arrivals_.push_back(Clock::now());
      first_arrival_.emplace(prompt, arrivals_.back());
      last_body_ = body;
    }
    // "*" scripts every prompt without a script of its own.
    auto it = scripts_.find(prompt);
    if (it == scripts_.end()) it = scripts_.find("*");
    if (it == scripts_.end()) {
      res.status = 400;
      res.set_content(R"({"error":{"message":"no script for this prompt"}})", "application/json");
      return;
    }
    Script s = it->second;
    if (order < slow_first_) s.ttft_ms += slow_extra_ms_;
    if (s.status != 200) {
      res.status = s.status;
      res.set_content(R"({"error":{"message":"scripted failure"}})", "application/json");
      return;
    }
    const TimePoint start = Clock::now();
    res.set_chunked_content_provider(
        "text/event-stream", [this, prompt, s, chat, start](size_t, httplib::DataSink& sink) {
          auto event = [&](const json& j) {
            const std::string e = "data: " + j.dump() + "\n\n";
            return sink.write(e.data(), e.size());
          };
          auto chunk = [&](const std::string& text) {
            return chat ? json{{"choices", {{{"index", 0}, {"delta", {{"content", text}}}}}}}
                        : json{{"choices", {{{"index", 0}, {"text", text}}}}};
          };
          if (s.role_chunk_ms >= 0) {
            std::this_thread::sleep_until(start + milliseconds(s.role_chunk_ms));
            event({{"choices", {{{"index", 0}, {"delta", {{"role", "assistant"}}}}}}});
          }
          int at = s.ttft_ms;
          std::this_thread::sleep_until(start + milliseconds(at));
          event(chunk("tok"));
          if (s.error_event) {
            event({{"error", {{"message", "scripted stream error"}}}});
          }
          for (int gap : s.gaps_ms) {
            at += gap;
            std::this_thread::sleep_until(start + milliseconds(at));
            event(chunk(" tok"));
          }
          if (s.usage_tokens > 0) {
            event({{"choices", json::array()}, {"usage", {{"completion_tokens", s.usage_tokens}}}});
          }
          {
            // Before the last bytes leave: the client cannot have seen the end yet.
            std::lock_guard lock(mu_);
            first_finish_.emplace(prompt, Clock::now());
          }
          if (s.send_done) sink.write("data: [DONE]\n\n", 14);
          sink.done();
          return true;
        });
  }

  const std::map<std::string, Script> scripts_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  int received_ = 0;
  std::map<std::string, int> counts_;
  std::vector<TimePoint> arrivals_;
  std::map<std::string, TimePoint> first_arrival_;
  std::map<std::string, TimePoint> first_finish_;
  json last_body_;
  std::atomic<int> slow_first_{0};
  std::atomic<int> slow_extra_ms_{0};
};

}  // namespace pdserve::bench
