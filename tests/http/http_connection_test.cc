// Tests of http::Server's connection handling (http/connection_pool.h) on a real server on
// 127.0.0.1: pipelined requests, slow request heads (slowloris) and the connection cap.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include "http/server_setup.h"
#include "testing/raw_http_client.h"

namespace pdserve::http {
namespace {

using testing::RawHttpClient;
using testing::StatusOf;

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class TestServer {
 public:
  explicit TestServer(const ServerConfig& config) {
    ConfigureServer(server_, config);
    AddPostRoutes(server_, {{"/echo", [](const httplib::Request& req, httplib::Response& res) {
                               res.set_content("echo:" + req.body, "text/plain");
                             }}});
    server_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok", "text/plain");
    });
    Result<int> port = BindServer(server_, "127.0.0.1", 0, config);
    EXPECT_TRUE(port.ok()) << port.status().ToString();
    port_ = port.ok() ? *port : 0;
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    const Deadline ready = Deadline::AfterMs(10000);
    while (!server_.is_running() && !ready.Passed()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ~TestServer() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  int port() const { return port_; }
  httplib::Client Client(int timeout_s) const {
    httplib::Client client("127.0.0.1", port_);
    client.set_connection_timeout(timeout_s, 0);
    client.set_read_timeout(timeout_s, 0);
    return client;
  }

 private:
  Server server_;
  int port_ = 0;
  std::thread thread_;
};

std::string EchoRequest(const std::string& body, bool close) {
  return "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
         (close ? "\r\nConnection: close" : "") + "\r\n\r\n" + body;
}

// Three requests in one write: httplib 0.11 answered the first, lost the rest with its
// per-request read buffer and idled until the keep-alive timeout (5 s) closed the connection.
TEST(HttpConnectionTest, PipelinedRequestsAreAnsweredInOrder) {
  ServerConfig config;
  config.threads = 2;
  TestServer server(config);
  RawHttpClient raw(server.port());
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(EchoRequest("first", false) + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" +
                       EchoRequest("third", true)));
  const TimePoint start = Clock::now();
  bool closed = false;
  const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(4000), &closed);
  EXPECT_TRUE(closed) << "the connection idled after the answers";
  EXPECT_LT(SecondsSince(start), 3.0);
  EXPECT_EQ(Count(answer, "HTTP/1.1 200 OK"), 3u) << answer;
  const size_t first = answer.find("echo:first");
  const size_t health = answer.find("\r\n\r\nok");
  const size_t third = answer.find("echo:third");
  ASSERT_NE(first, std::string::npos) << answer;
  ASSERT_NE(health, std::string::npos) << answer;
  ASSERT_NE(third, std::string::npos) << answer;
  EXPECT_LT(first, health);
  EXPECT_LT(health, third);
}

// A pipelined request whose head is cut off by the write boundary is completed by the next
// write and answered too.
TEST(HttpConnectionTest, PipelinedRequestSplitAcrossWritesIsAnswered) {
  ServerConfig config;
  config.threads = 2;
  TestServer server(config);
  RawHttpClient raw(server.port());
  ASSERT_TRUE(raw.ok());
  const std::string second = EchoRequest("second", true);
  ASSERT_TRUE(raw.Send(EchoRequest("first", false) + second.substr(0, 10)));
  std::string first_answer;
  const Deadline first_end = Deadline::AfterMs(4000);
  while (first_answer.find("echo:first") == std::string::npos && !first_end.Passed()) {
    first_answer += raw.ReadAtLeast(1, first_end);
  }
  EXPECT_NE(first_answer.find("HTTP/1.1 200"), std::string::npos) << first_answer;
  ASSERT_TRUE(raw.Send(second.substr(10)));
  bool closed = false;
  const std::string answer = first_answer + raw.ReadUntilClose(Deadline::AfterMs(4000), &closed);
  EXPECT_TRUE(closed);
  EXPECT_NE(answer.find("echo:first"), std::string::npos) << answer;
  EXPECT_NE(answer.find("echo:second"), std::string::npos) << answer;
}

// Many clients sending their heads a byte at a time (slowloris) hold no thread: with two
// workers, /health and a POST still answer at once; each slow client gets 408 and is closed
// once its head has taken the header timeout in all, though no single byte was late.
TEST(HttpConnectionTest, SlowHeadsDoNotStarveOthersAndMeetTheHeaderDeadline) {
  ServerConfig config;
  config.threads = 2;
  config.header_timeout = std::chrono::seconds(2);
  TestServer server(config);
  constexpr int kSlow = 60;
  std::vector<std::unique_ptr<RawHttpClient>> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(std::make_unique<RawHttpClient>(server.port()));
    ASSERT_TRUE(slow.back()->ok());
    ASSERT_TRUE(slow.back()->Send("GET /health HTTP/1.1\r\nHost: x\r\n"));
  }
  const TimePoint start = Clock::now();
  // Sends one more byte to every slow socket each 100 ms, until destroyed (also when an
  // assertion returns early).
  struct Trickle {
    std::atomic<bool> stop{false};
    std::thread thread;
    ~Trickle() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } trickle;
  trickle.thread = std::thread([&] {
    while (!trickle.stop.load() && SecondsSince(start) < 10.0) {
      for (auto& client : slow) (void)client->Send("X");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  httplib::Client client = server.Client(5);
  const TimePoint asked = Clock::now();
  httplib::Result health = client.Get("/health");
  ASSERT_TRUE(health) << "GET /health failed: " << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  httplib::Result echo = client.Post("/echo", "hello", "text/plain");
  ASSERT_TRUE(echo) << "POST /echo failed: " << httplib::to_string(echo.error());
  EXPECT_EQ(echo->body, "echo:hello");
  EXPECT_LT(SecondsSince(asked), 1.5);

  int refused = 0;
  for (auto& c : slow) {
    bool closed = false;
    const std::string answer = c->ReadUntilClose(Deadline::AfterMs(6000), &closed);
    refused += closed && StatusOf(answer) == 408 ? 1 : 0;
  }
  const double took = SecondsSince(start);
  EXPECT_EQ(refused, kSlow) << "slow clients not answered 408 and closed";
  EXPECT_LT(took, 5.0) << "the header deadline (2 s) was not kept";
}

// Past max_connections, a new connection is answered 503 (Retry-After, OpenAI shape) at once
// and closed; once a connection closes, new ones are served again.
TEST(HttpConnectionTest, ConnectionsOverTheCapGet503) {
  ServerConfig config;
  config.threads = 8;
  config.max_connections = 4;
  TestServer server(config);
  std::vector<std::unique_ptr<RawHttpClient>> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(std::make_unique<RawHttpClient>(server.port()));
    ASSERT_TRUE(idle.back()->ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // all four accepted
  RawHttpClient over(server.port());
  ASSERT_TRUE(over.ok());
  (void)over.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  bool closed = false;
  const std::string answer = over.ReadUntilClose(Deadline::AfterMs(5000), &closed);
  EXPECT_EQ(StatusOf(answer), 503) << answer;
  EXPECT_NE(answer.find("Retry-After: 1"), std::string::npos) << answer;
  EXPECT_NE(answer.find("server_overloaded"), std::string::npos) << answer;
  EXPECT_TRUE(closed);

  idle.pop_back();
  const Deadline end = Deadline::AfterMs(5000);
  int status = 0;
  while (status != 200 && !end.Passed()) {
    httplib::Result r = server.Client(2).Get("/health");
    status = r ? r->status : 0;
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(status, 200) << "a freed connection slot was not reused";
}

// Heads a recipient must not guess at (RFC 9112: bare CR or LF line ends, whitespace before a
// colon, folded lines, control bytes) and framing a proxy could read otherwise (Content-Length
// and Transfer-Encoding together, two lengths, a coding other than chunked) get 400 and a
// close at once. Before, httplib skipped or half-read such lines: a bare-LF head waited for
// the header deadline; "Content-Length : 5" was no length at all, so its body became a request.
TEST(HttpConnectionTest, MalformedHeadsGet400AndACloseAtOnce) {
  ServerConfig config;
  config.threads = 2;
  TestServer server(config);
  const std::string echo = "POST /echo HTTP/1.1\r\nHost: x\r\n";
  const std::vector<std::string> heads = {
      "GET /health HTTP/1.1\nHost: x\n\n",
      "GET /health HTTP/1.1\r\nHost: x\n\r\n",
      "GET /health HTTP/1.1\rHost: x\r\n\r\n",
      "GET /health HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
      "GET /health HTTP/1.1\r\nHost x\r\n\r\n",
      "GET /health HTTP/1.1\r\nHost : x\r\n\r\n",
      std::string("GET /health HTTP/1.1\r\nHost: x\0y\r\n\r\n", 35),
      "GET /health HTTP/1.1\r\n: x\r\n\r\n",
      "GET  /health HTTP/1.1\r\n\r\n",
      "GET /health HTTP/2.0\r\n\r\n",
      "G\xc3\xa9T /health HTTP/1.1\r\n\r\n",
      echo + "Content-Length : 5\r\n\r\nhello",
      echo + "Content-Length: +5\r\n\r\nhello",
      echo + "Content-Length: 5, 5\r\n\r\nhello",
      echo + "Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
      echo + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
      echo + "Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
      echo + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
      "POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
      echo + "Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX\r\n0\r\n\r\n",
      echo + "Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
      echo + "Transfer-Encoding: chunked\r\n\r\n0\r\nX-Trailer: 1\r\n\r\n",
  };
  for (const std::string& head : heads) {
    RawHttpClient raw(server.port());
    ASSERT_TRUE(raw.ok());
    ASSERT_TRUE(raw.Send(head));
    const TimePoint sent = Clock::now();
    bool closed = false;
    const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(8000), &closed);
    EXPECT_EQ(StatusOf(answer), 400) << testing::PrintableText(head) << "\n" << answer;
    EXPECT_NE(answer.find("Connection: close"), std::string::npos) << answer;
    EXPECT_TRUE(closed) << testing::PrintableText(head);
    EXPECT_LT(SecondsSince(sent), 1.0) << testing::PrintableText(head);
  }
}

// Garbage after a request that was answered is refused at once too, not at the deadline.
TEST(HttpConnectionTest, GarbageAfterAPipelinedRequestGets400AtOnce) {
  ServerConfig config;
  config.threads = 2;
  TestServer server(config);
  RawHttpClient raw(server.port());
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(EchoRequest("first", false) + "\x16\x03\x01\x02\x00garbage"));
  const TimePoint sent = Clock::now();
  bool closed = false;
  const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(8000), &closed);
  const std::vector<testing::RawResponse> r = testing::ParseResponses(answer);
  ASSERT_EQ(r.size(), 2u) << answer;
  EXPECT_EQ(r[0].body, "echo:first");
  EXPECT_EQ(r[1].status, 400);
  EXPECT_TRUE(closed);
  EXPECT_LT(SecondsSince(sent), 1.0);
}

// RFC 9112 2.2: empty lines before a request line are ignored (some clients end a body with
// an extra CRLF).
TEST(HttpConnectionTest, EmptyLinesBeforeARequestAreSkipped) {
  ServerConfig config;
  config.threads = 2;
  TestServer server(config);
  RawHttpClient raw(server.port());
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(EchoRequest("first", false) + "\r\n\r\n" + EchoRequest("second", true)));
  bool closed = false;
  const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(8000), &closed);
  const std::vector<testing::RawResponse> r = testing::ParseResponses(answer);
  ASSERT_EQ(r.size(), 2u) << answer;
  EXPECT_EQ(r[0].body, "echo:first");
  EXPECT_EQ(r[1].body, "echo:second");
}

// A client that waits for "100 Continue" before its body gets exactly one, and then its answer.
TEST(HttpConnectionTest, ExpectContinueGetsOneInterimAnswer) {
  ServerConfig config;
  config.threads = 2;
  TestServer server(config);
  RawHttpClient raw(server.port());
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(
      "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"));
  const std::string interim = raw.ReadAtLeast(25, Deadline::AfterMs(5000));
  EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(raw.Send("hello"));
  bool closed = false;
  const std::vector<testing::RawResponse> r =
      raw.ReadResponses(1, Deadline::AfterMs(5000), &closed);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].body, "echo:hello");
  // Nothing more: no second interim answer, no second response.
  EXPECT_TRUE(raw.ReadResponses(1, Deadline::AfterMs(300), &closed).empty());
}

// Chunked bodies in their full grammar are read: extensions, upper-case sizes, many chunks.
TEST(HttpConnectionTest, ChunkedBodiesAreRead) {
  ServerConfig config;
  config.threads = 2;
  TestServer server(config);
  RawHttpClient raw(server.port());
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\nConnection: close\r\n\r\n"
      "3;ext=1\r\nabc\r\nA\r\n0123456789\r\n000\r\n\r\n"));
  bool closed = false;
  const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(5000), &closed);
  const std::vector<testing::RawResponse> r = testing::ParseResponses(answer);
  ASSERT_EQ(r.size(), 1u) << answer;
  EXPECT_EQ(r[0].body, "echo:abc0123456789");
}

// Connections idle between requests hold no thread either: more keep-alive clients than
// workers, each after one answer, leave /health answering.
TEST(HttpConnectionTest, IdleKeepAliveConnectionsHoldNoThread) {
  ServerConfig config;
  config.threads = 2;
  TestServer server(config);
  std::vector<std::unique_ptr<httplib::Client>> clients;
  for (int i = 0; i < 6; ++i) {
    clients.push_back(std::make_unique<httplib::Client>("127.0.0.1", server.port()));
    clients.back()->set_keep_alive(true);
    clients.back()->set_read_timeout(3, 0);
    httplib::Result r = clients.back()->Get("/health");
    ASSERT_TRUE(r) << "client " << i << ": " << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
  }
}

}  // namespace
}  // namespace pdserve::http
