// The router's relay thread (router/relay_loop.h) carries every open stream: one client that
// stops reading must hold up no other stream, is cut after the stall limit, and a node that
// falls silent ends its stream with an error event; many streams at once arrive whole. Real
// sockets, a node made of httplib.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include "common/clock.h"
#include "router_in_process.h"

namespace pdserve::router {
namespace {

// The n-th event of a stream of `size`-byte events ("data: " + padding + n).
std::string NumberedEvent(int n, size_t size) {
  std::string tail = "#" + std::to_string(n) + "\n\n";
  return "data: " + std::string(size - 6 - tail.size(), 'x') + tail;
}

// A node whose /v1/completions streams `events` events of `event_bytes` each, the body's
// {"events":N,"bytes":B,"split":S,"silent_after":K} choosing them: each event written in
// `split` pieces (an event split across writes), and after K events nothing more, until the
// router closes the connection.
class StreamingNode {
 public:
  StreamingNode() {
    // A thread per open stream (httplib's default pool has 8).
    server_.new_task_queue = [] { return new httplib::ThreadPool(64); };
    server_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      const auto field = [&](const char* name, int fallback) {
        const size_t at = req.body.find(std::string("\"") + name + "\":");
        return at == std::string::npos ? fallback
                                       : std::atoi(req.body.c_str() + at + std::strlen(name) + 3);
      };
      const int events = field("events", 3);
      const size_t bytes = static_cast<size_t>(field("bytes", 64));
      const int split = std::max(1, field("split", 1));
      const int silent_after = field("silent_after", -1);
      auto sent = std::make_shared<int>(0);
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, events, bytes, split, silent_after, sent](size_t, httplib::DataSink& sink) {
            if (*sent == silent_after) {
              // Silent: wait for the router to give up (the write of a byte then fails).
              std::this_thread::sleep_for(std::chrono::milliseconds(20));
              if (stopping_.load()) return false;
              return true;
            }
            if (*sent == events) {
              const std::string done = "data: [DONE]\n\n";
              sink.write(done.data(), done.size());
              sink.done();
              return true;
            }
            const std::string event = NumberedEvent((*sent)++, bytes);
            const size_t piece = (event.size() + split - 1) / split;
            for (size_t at = 0; at < event.size(); at += piece) {
              if (!sink.write(event.data() + at, std::min(piece, event.size() - at))) {
                ++broken_writes;
                return false;
              }
            }
            return true;
          },
          [](bool) {});
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~StreamingNode() {
    stopping_ = true;
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::atomic<int> broken_writes{0};  // writes that failed: the router closed the stream

 private:
  httplib::Server server_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// A client on a raw socket: sends one streamed request and reads only when told.
class RawClient {
 public:
  RawClient(int port, const std::string& body) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    // A small receive buffer, so that an unread stream fills it soon.
    const int small = 16 * 1024;
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    const std::string request =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    connected_ = connected_ && send(fd_, request.data(), request.size(), MSG_NOSIGNAL) ==
                                   static_cast<ssize_t>(request.size());
  }
  ~RawClient() { ::close(fd_); }
  bool connected() const { return connected_; }

  // Reads until the response's last chunk, the connection's end, or `deadline`; true if
  // the last chunk came.
  bool ReadToEnd(Deadline deadline) {
    while (!deadline.Passed()) {
      if (received.find("\r\n0\r\n\r\n") != std::string::npos) return true;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char buf[65536];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        closed = true;
        return false;
      }
      received.append(buf, static_cast<size_t>(n));
    }
    return false;
  }

  std::string received;
  bool closed = false;

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// The events of a chunked SSE body, in order (chunk framing removed).
std::vector<std::string> EventsOf(const std::string& response) {
  std::string body;
  size_t at = response.find("\r\n\r\n");
  if (at == std::string::npos) return {};
  at += 4;
  while (at < response.size()) {
    const size_t line = response.find("\r\n", at);
    if (line == std::string::npos) break;
    const size_t size = std::stoul(response.substr(at, line - at), nullptr, 16);
    if (size == 0) break;
    const std::string chunk = response.substr(line + 2, size);
    // The relay sends whole events only: a chunk that ends inside one is a failure.
    if (!chunk.ends_with("\n\n")) return {"a chunk ends inside an event: " + chunk};
    body += chunk;
    at = line + 2 + size + 2;
  }
  std::vector<std::string> events;
  for (size_t start = 0; start < body.size();) {
    const size_t end = body.find("\n\n", start);
    if (end == std::string::npos) {
      events.push_back(body.substr(start));
      break;
    }
    events.push_back(body.substr(start, end + 2 - start));
    start = end + 2;
  }
  return events;
}

RouterOptions OneNode(const std::string& url) {
  RouterOptions options;
  options.nodes = {url};
  return options;
}

bool WaitHealthy(Router& router) {
  const Deadline d = Deadline::AfterMs(5000);
  while (router.nodes().HealthyCount() < 1 && !d.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return router.nodes().HealthyCount() >= 1;
}

TEST(RouterRelayTest, AClientThatStopsReadingHoldsUpNoOtherStream) {
  StreamingNode node;
  auto router = StartRouter(OneNode(node.url()));
  ASSERT_TRUE(router && WaitHealthy(*router));
  // 8 MiB of events: far more than the sockets between node, router and client hold.
  RawClient stalled(router->port(), R"({"events":1024,"bytes":8192})");
  ASSERT_TRUE(stalled.connected());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // its buffers fill
  for (int i = 0; i < 5; ++i) {
    RawClient other(router->port(), R"({"events":20,"bytes":100,"split":3})");
    ASSERT_TRUE(other.connected());
    const TimePoint start = Clock::now();
    ASSERT_TRUE(other.ReadToEnd(Deadline::AfterMs(5000)))
        << "stream " << i << " did not end while another client was not reading";
    EXPECT_LT(SecondsSince(start), 2.0);
    const std::vector<std::string> events = EventsOf(other.received);
    ASSERT_EQ(events.size(), 21u);
    for (int n = 0; n < 20; ++n) EXPECT_EQ(events[n], NumberedEvent(n, 100));
    EXPECT_EQ(events[20], "data: [DONE]\n\n");
  }
  // The stalled client reads at last: every event, whole and in order, then the end.
  ASSERT_TRUE(stalled.ReadToEnd(Deadline::AfterMs(20000)));
  const std::vector<std::string> events = EventsOf(stalled.received);
  ASSERT_EQ(events.size(), 1025u);
  for (int n = 0; n < 1024; ++n) ASSERT_EQ(events[n], NumberedEvent(n, 8192)) << n;
  EXPECT_EQ(node.broken_writes.load(), 0);
}

TEST(RouterRelayTest, AClientThatReadsNothingIsCutAfterTheStallLimit) {
  StreamingNode node;
  RouterOptions options = OneNode(node.url());
  options.client_stall = std::chrono::seconds(1);
  auto router = StartRouter(options);
  ASSERT_TRUE(router && WaitHealthy(*router));
  RawClient stalled(router->port(), R"({"events":100000,"bytes":8192})");
  ASSERT_TRUE(stalled.connected());
  // Within the stall limit and the relay's once-a-second check, the node's stream is closed.
  const Deadline d = Deadline::AfterMs(6000);
  while (node.broken_writes.load() == 0 && !d.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(node.broken_writes.load(), 1) << "the node kept streaming to a client not reading";
  // The client's connection is closed: reading on finds its end, not the last chunk.
  EXPECT_FALSE(stalled.ReadToEnd(Deadline::AfterMs(10000)));
  EXPECT_TRUE(stalled.closed);
}

TEST(RouterRelayTest, ASilentNodeEndsItsStreamWithATimeoutEvent) {
  StreamingNode node;
  RouterOptions options = OneNode(node.url());
  options.upstream.read = std::chrono::seconds(1);
  auto router = StartRouter(options);
  ASSERT_TRUE(router && WaitHealthy(*router));
  RawClient client(router->port(), R"({"events":5,"bytes":64,"silent_after":2})");
  ASSERT_TRUE(client.connected());
  const TimePoint start = Clock::now();
  ASSERT_TRUE(client.ReadToEnd(Deadline::AfterMs(6000)));
  EXPECT_GE(SecondsSince(start), 0.9);
  const std::vector<std::string> events = EventsOf(client.received);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0], NumberedEvent(0, 64));
  EXPECT_EQ(events[1], NumberedEvent(1, 64));
  EXPECT_NE(events[2].find("\"upstream_timeout\""), std::string::npos) << events[2];
  EXPECT_EQ(events[3], "data: [DONE]\n\n");
  // The request is over at the router, and the silent connection is not kept for another.
  const Deadline d = Deadline::AfterMs(3000);
  while (router->nodes().Snapshot()[0].outstanding != 0 && !d.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(router->nodes().Snapshot()[0].outstanding, 0);
  EXPECT_EQ(router->upstream_connections().idle, 0u);
}

TEST(RouterRelayTest, ManyStreamsAtOnceArriveWholeAndInOrder) {
  StreamingNode node;
  auto router = StartRouter(OneNode(node.url()));
  ASSERT_TRUE(router && WaitHealthy(*router));
  constexpr int kClients = 24;
  std::vector<std::thread> threads;
  std::vector<std::string> problems(kClients);
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      const size_t bytes = 40 + 97 * static_cast<size_t>(c);  // some events span reads
      RawClient client(router->port(), "{\"events\":60,\"bytes\":" + std::to_string(bytes) +
                                           ",\"split\":" + std::to_string(1 + c % 4) + "}");
      if (!client.ReadToEnd(Deadline::AfterMs(20000))) {
        problems[c] = "no end";
        return;
      }
      const std::vector<std::string> events = EventsOf(client.received);
      if (events.size() != 61) {
        problems[c] = std::to_string(events.size()) + " events";
        return;
      }
      for (int n = 0; n < 60; ++n) {
        if (events[n] != NumberedEvent(n, bytes)) problems[c] = "event " + std::to_string(n);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int c = 0; c < kClients; ++c) EXPECT_EQ(problems[c], "") << "client " << c;
}

}  // namespace
}  // namespace pdserve::router
