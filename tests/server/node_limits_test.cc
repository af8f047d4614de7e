// `pdserve serve` under requests no HTTP library sends: chunked bodies over the limit, a
// declared length with no body, oversized headers, HTTP/1.0 (raw sockets), and the memory a
// refused request may cost the node.
#include <atomic>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "testing/node_process.h"
#include "testing/processes.h"
#include "testing/raw_http_client.h"

namespace pdserve::testing {
namespace {

using json = nlohmann::json;

class NodeLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    node_ = std::make_unique<NodeProcess>(TinyModelDir(), std::vector<std::string>{});
    ASSERT_TRUE(node_->ok()) << node_->error();
  }
  std::unique_ptr<NodeProcess> node_;
};

// 64 MiB sent chunked to a node whose limit is 4 MiB: 413 once past the limit, the connection
// closed before the client sent it all, and the node's peak memory bounded by the limit
// (httplib 0.11 buffered the whole body, growing the node by more than the body).
TEST_F(NodeLimitsTest, ChunkedBodyOverTheLimitGets413WithBoundedMemory) {
  // The peak (VmHWM): a buffered body is freed once refused, so the RSS after says little.
  const long peak_before = SettledStatusKib(node_->pid(), "VmHWM:");
  ASSERT_GT(peak_before, 0);
  RawHttpClient raw(node_->port());
  ASSERT_TRUE(raw.ok());
  constexpr size_t kTotal = size_t{64} << 20;
  std::atomic<size_t> sent{0};
  std::thread sender([&] {
    if (!raw.Send(ChunkedPostHead("/v1/completions"))) return;
    const std::string chunk = Chunk(64 << 10);
    while (sent < kTotal && raw.Send(chunk)) sent += 64 << 10;
  });
  // The answer comes while the client is still sending; the server then drains the rest for
  // a bounded time (lingering close) so that the client can read it, and closes.
  std::string answer = raw.ReadAtLeast(12, Deadline::AfterMs(20000));
  const size_t sent_at_answer = sent.load();
  bool closed = false;
  answer += raw.ReadUntilClose(Deadline::AfterMs(60000), &closed);
  sender.join();
  const long peak_after = ProcStatusKib(node_->pid(), "VmHWM:");
  EXPECT_EQ(StatusOf(answer), 413) << answer.substr(0, 300);
  EXPECT_NE(answer.find("payload_too_large"), std::string::npos);
  EXPECT_TRUE(closed);
  EXPECT_LT(sent_at_answer, kTotal) << "the node read the whole body";
  // Sanitizer builds keep more resident (TSan's shadow, ASan's quarantine); the body it guards
  // against buffering is 64 MiB.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr long kPeakGrowthKib = 64 * 1024;
#else
  constexpr long kPeakGrowthKib = 24 * 1024;
#endif
  EXPECT_LT(peak_after - peak_before, kPeakGrowthKib)
      << "peak RSS " << peak_before << " -> " << peak_after << " KiB";
  EXPECT_EQ(node_->Client().Get("/health")->status, 200);
}

// Refused from the header: the node's read timeout is 30 s, the answer must come at once.
TEST_F(NodeLimitsTest, DeclaredLengthOverTheLimitIsRefusedAtOnce) {
  RawHttpClient raw(node_->port());
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(
      raw.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
               "application/json\r\nContent-Length: 100000000\r\n\r\n"));
  const TimePoint start = Clock::now();
  bool closed = false;
  const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(20000), &closed);
  EXPECT_EQ(StatusOf(answer), 413) << answer;
  EXPECT_LT(SecondsSince(start), 3.0);
  EXPECT_TRUE(closed);
}

TEST_F(NodeLimitsTest, OversizedHeaderGets431) {
  RawHttpClient raw(node_->port());
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send("GET /v1/models HTTP/1.1\r\nHost: x\r\nCookie: " + std::string(10000, 'c') +
                       "\r\n\r\n"));
  bool closed = false;
  const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(20000), &closed);
  EXPECT_EQ(StatusOf(answer), 431) << answer;
  EXPECT_NE(answer.find("request_header_fields_too_large"), std::string::npos) << answer;
}

// An HTTP/1.0 client cannot read chunked framing: the stream comes plain, the close ends it.
TEST_F(NodeLimitsTest, Http10ClientGetsAPlainStream) {
  RawHttpClient raw(node_->port());
  ASSERT_TRUE(raw.ok());
  const std::string body =
      json{{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"stream", true}}.dump();
  ASSERT_TRUE(
      raw.Send("POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
               "Content-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body));
  bool closed = false;
  const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(60000), &closed);
  EXPECT_TRUE(closed) << "the stream's end was not marked by a close";
  const size_t end_of_head = answer.find("\r\n\r\n");
  ASSERT_NE(end_of_head, std::string::npos) << answer;
  const std::string head = answer.substr(0, end_of_head);
  EXPECT_EQ(StatusOf(head), 200) << head;
  EXPECT_EQ(head.find("Transfer-Encoding"), std::string::npos) << head;
  EXPECT_NE(head.find("Connection: close"), std::string::npos) << head;
  const std::string stream = answer.substr(end_of_head + 4);
  EXPECT_TRUE(stream.starts_with("data: {")) << stream.substr(0, 100);
  EXPECT_TRUE(stream.ends_with("data: [DONE]\n\n")) << stream;
}

}  // namespace
}  // namespace pdserve::testing
