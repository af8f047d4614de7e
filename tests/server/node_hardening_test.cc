// `pdserve serve` under hostile clients (issue 11): pipelined requests in one write, ~200
// slowloris sockets.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "node_process.h"
#include "server/raw_http_client.h"

namespace pdserve::testing {
namespace {

using json = nlohmann::json;

int StatusOf(const std::string& answer) {
  return answer.starts_with("HTTP/1.1 ") && answer.size() >= 12 ? std::stoi(answer.substr(9, 3))
                                                                : 0;
}

std::string PostHead(const std::string& path, size_t length, bool close) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         (close ? "Connection: close\r\n" : "") + "Content-Length: " + std::to_string(length) +
         "\r\n\r\n";
}

// Three requests in one write all get answers, in order, and the connection closes at once
// after the last (it asked to): before, only the first was answered and the connection
// idled for the keep-alive timeout.
TEST(NodeHardeningTest, PipelinedRequestsAreAnsweredInOrder) {
  NodeProcess node(TinyModelDir(), {});
  ASSERT_TRUE(node.ok()) << node.error();
  const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", 3}}.dump();
  RawHttpClient raw(node.port());
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n" +
                       PostHead("/v1/completions", body.size(), false) + body +
                       "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const TimePoint start = Clock::now();
  bool closed = false;
  const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(30000), &closed);
  EXPECT_TRUE(closed);
  EXPECT_LT(SecondsSince(start), 4.0) << answer;
  const size_t completion = answer.find("\"text_completion\"");
  const size_t models = answer.find("\"object\":\"list\"");
  ASSERT_NE(completion, std::string::npos) << answer;
  ASSERT_NE(models, std::string::npos) << answer;
  EXPECT_LT(completion, models);
  EXPECT_EQ(StatusOf(answer), 200) << answer;
}

// 200 sockets sending their heads a byte every 100 ms, against a node with 8 HTTP threads:
// /health and a completion still answer at once, and each slow socket gets 408 and is closed
// once the header timeout (3 s) has passed in all.
TEST(NodeHardeningTest, SlowlorisDoesNotTakeTheNodeOffline) {
  NodeProcess node(TinyModelDir(), {"--http-threads", "8", "--header-timeout", "3"});
  ASSERT_TRUE(node.ok()) << node.error();
  constexpr int kSlow = 200;
  std::vector<std::unique_ptr<RawHttpClient>> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(std::make_unique<RawHttpClient>(node.port()));
    ASSERT_TRUE(slow.back()->ok()) << "socket " << i;
    ASSERT_TRUE(slow.back()->Send("GET /health HTTP/1.1\r\n"));
  }
  const TimePoint start = Clock::now();
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    while (!stop.load() && SecondsSince(start) < 20.0) {
      for (auto& client : slow) (void)client->Send("X");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  httplib::Client client = node.Client();
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(5, 0);
  const TimePoint asked = Clock::now();
  httplib::Result health = client.Get("/health");
  ASSERT_TRUE(health) << "GET /health: " << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  EXPECT_LT(SecondsSince(asked), 2.0);
  httplib::Result completion =
      client.Post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 4}}.dump(),
                  "application/json");
  ASSERT_TRUE(completion) << "completion: " << httplib::to_string(completion.error());
  EXPECT_EQ(completion->status, 200) << completion->body;

  int refused = 0;
  for (auto& c : slow) {
    bool closed = false;
    const std::string answer = c->ReadUntilClose(Deadline::AfterMs(10000), &closed);
    refused += closed && StatusOf(answer) == 408 ? 1 : 0;
  }
  const double took = SecondsSince(start);
  stop = true;
  trickle.join();
  EXPECT_EQ(refused, kSlow);
  EXPECT_LT(took, 8.0) << "slow sockets outlived the 3 s header deadline";
}

}  // namespace
}  // namespace pdserve::testing
