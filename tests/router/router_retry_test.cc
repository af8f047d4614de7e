// A retried request must reach the client as the node that answered sent it: the Router (in
// this process) sits in front of a misbehaving node (a small httplib server that answers 503 or
// 429, or is gone) and a real `pdserve serve` node on the tiny model. Whatever the first node
// said, the client gets the real node's headers and stream, nothing of the failed attempt.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "router/router.h"
#include "testing/cluster_processes.h"
#include "testing/test_paths.h"

namespace pdserve::router {
namespace {

using nlohmann::json;

// A node that is healthy but refuses every generation with `status`, as an overloaded or
// failing node does (error JSON, Retry-After).
class ErrorNode {
 public:
  ErrorNode() {
    server_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    auto refuse = [this](const httplib::Request&, httplib::Response& res) {
      ++hits;
      res.status = status.load();
      res.set_header("Retry-After", "7");
      res.set_content(R"({"error":{"message":"busy","type":"x","code":"busy","param":null}})",
                      "application/json");
    };
    server_.Post("/v1/completions", refuse);
    server_.Post("/v1/chat/completions", refuse);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~ErrorNode() { Stop(); }
  void Stop() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::atomic<int> status{503};
  std::atomic<int> hits{0};

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

class RouterRetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string model = testing::TinyModelDir();
    ASSERT_FALSE(model.empty());
    node_port_ = testing::FreePort();
    node_ = std::make_unique<testing::Subprocess>(std::vector<std::string>{
        testing::BinaryPath("src/cli/pdserve"), "serve", "--model", model, "--listen",
        "127.0.0.1:" + std::to_string(node_port_), "--threads", "1"});
    ASSERT_TRUE(testing::WaitHealthy(node_port_, Deadline::AfterMs(60000)));
    RouterOptions options;
    options.port = 0;
    options.nodes = {bad_.url(), "http://127.0.0.1:" + std::to_string(node_port_)};
    // Only the start-up check: the bad node stays in the pool, so requests keep meeting it.
    options.health_interval = std::chrono::hours(1);
    auto router = Router::Create(options);
    ASSERT_TRUE(router.ok()) << router.status().ToString();
    router_ = std::move(*router);
    ASSERT_TRUE(router_->Start().ok());
    const Deadline d = Deadline::AfterMs(10000);
    while (router_->nodes().HealthyCount() != 2 && !d.Passed()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(router_->nodes().HealthyCount(), 2);
  }

  httplib::Result Post(bool stream) {
    httplib::Client client("127.0.0.1", router_->port());
    client.set_read_timeout(60, 0);
    const json body = {
        {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}, {"stream", stream}};
    return client.Post("/v1/completions", body.dump(), "application/json");
  }

  // The streamed answer is the real node's: one Content-Type (SSE), chunked, no length, no
  // Retry-After, valid events ending in [DONE].
  static void ExpectCleanStream(const httplib::Result& r) {
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value_count("Content-Type"), 1u);
    EXPECT_TRUE(r->get_header_value("Content-Type").starts_with("text/event-stream"));
    EXPECT_FALSE(r->has_header("Content-Length"));
    EXPECT_EQ(r->get_header_value("Transfer-Encoding"), "chunked");
    EXPECT_FALSE(r->has_header("Retry-After"));
    int events = 0;
    bool done = false;
    for (size_t at = 0; (at = r->body.find("data: ", at)) != std::string::npos; ++at) {
      const size_t end = r->body.find("\n\n", at);
      ASSERT_NE(end, std::string::npos) << r->body;
      const std::string payload = r->body.substr(at + 6, end - at - 6);
      EXPECT_FALSE(done) << "an event after [DONE]";
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      ++events;
      const json chunk = json::parse(payload, nullptr, false);
      EXPECT_TRUE(chunk.contains("choices")) << payload;
    }
    EXPECT_GT(events, 0) << r->body;
    EXPECT_TRUE(done) << r->body;
  }

  ErrorNode bad_;
  int node_port_ = 0;
  std::unique_ptr<testing::Subprocess> node_;
  std::unique_ptr<Router> router_;
};

TEST_F(RouterRetryTest, RetriedStreamCarriesOnlyTheAnsweringNodesHeadersAndStream) {
  for (int status : {503, 429, 500}) {
    bad_.status = status;
    const int hits_before = bad_.hits.load();
    // Ties alternate, so of several requests some meet the bad node first.
    for (int i = 0; i < 4; ++i) {
      SCOPED_TRACE("status " + std::to_string(status) + " request " + std::to_string(i));
      ExpectCleanStream(Post(/*stream=*/true));
    }
    EXPECT_GT(bad_.hits.load(), hits_before) << "no request was retried";
  }
}

TEST_F(RouterRetryTest, RetriedWholeAnswerCarriesNoStaleRetryAfter) {
  bad_.status = 503;
  for (int i = 0; i < 4; ++i) {
    auto r = Post(/*stream=*/false);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_FALSE(r->has_header("Retry-After"));
    EXPECT_EQ(r->get_header_value_count("Content-Type"), 1u);
    EXPECT_TRUE(json::parse(r->body, nullptr, false).contains("choices")) << r->body;
  }
  EXPECT_GT(bad_.hits.load(), 0);
}

TEST_F(RouterRetryTest, StreamRetriedAfterARefusedConnectionIsClean) {
  bad_.Stop();  // still counted healthy: the router learns of it from the refused connection
  ExpectCleanStream(Post(/*stream=*/true));
  ExpectCleanStream(Post(/*stream=*/true));
  EXPECT_EQ(router_->nodes().HealthyCount(), 1);
}

}  // namespace
}  // namespace pdserve::router
