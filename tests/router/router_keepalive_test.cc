// The router's connections to its nodes (router/upstream_connections.h): the idle table alone;
// through a router, sequential requests,
// streamed or not, travel on one kept-alive connection (the node sees one client port, the
// router counts one connection opened); a stream whose client leaves closes its own node
// connection, which the node notices at once, and the next request opens a new one; a kept
// connection that the node closes before answering is replaced without the client noticing.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include "http/server_setup.h"
#include "http/sse.h"
#include "router/router.h"

namespace pdserve::router {
namespace {

// A node stand-in served as nodes serve (http::Server, ConfigureServer) that records the
// client port of each generation request it gets.
class PortRecordingNode {
 public:
  PortRecordingNode() {
    http::ServerConfig config;
    config.threads = 8;
    config.keep_alive_max_requests = 100;
    http::ConfigureServer(server_, config);
    http::AddPostRoutes(
        server_,
        {{"/v1/completions",
          [this](const httplib::Request& req, httplib::Response& res) {
            Record(req);
            res.set_content("{\"ok\": true}", "application/json");
          }},
         // Three events and [DONE], or (body "endless") events every 10 ms until the
         // connection breaks.
         {"/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
            Record(req);
            const bool endless = req.body == "{\"endless\": true}";
            auto sent = std::make_shared<int>(0);
            res.set_chunked_content_provider(
                http::kSseContentType, [this, sent, endless](size_t, httplib::DataSink& sink) {
                  if (endless) std::this_thread::sleep_for(std::chrono::milliseconds(10));
                  const std::string event =
                      http::SseEvent("{\"n\": " + std::to_string(*sent) + "}");
                  if (!sink.write(event.data(), event.size())) {
                    stream_broken = true;
                    return false;
                  }
                  if (!endless && ++*sent == 3) {
                    sink.write(http::kSseDone, sizeof(http::kSseDone) - 1);
                    sink.done();
                  }
                  return true;
                });
          }}});
    server_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    Result<int> port = http::BindServer(server_, "127.0.0.1", 0, config);
    EXPECT_TRUE(port.ok()) << port.status().ToString();
    port_ = port.ok() ? *port : 0;
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~PortRecordingNode() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<int> ports() {
    std::lock_guard lock(mu_);
    return ports_;
  }

  std::atomic<bool> stream_broken{false};

 private:
  void Record(const httplib::Request& req) {
    std::lock_guard lock(mu_);
    ports_.push_back(req.remote_port);
  }

  http::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<int> ports_;
};

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }

// The idle table alone, on socket pairs: last given back is taken first; expired, closed at the
// other end, or beyond the per-node cap, a connection is closed rather than handed out.
TEST(UpstreamConnectionsTest, HandsOutOnlyLiveUnexpiredConnections) {
  UpstreamConnectionOptions options;
  options.max_idle_per_node = 2;
  options.idle_timeout = std::chrono::milliseconds(300);
  UpstreamConnections connections(options);
  int a[2], b[2], c[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, c), 0);
  EXPECT_EQ(connections.Take("http://n:1"), -1);
  connections.Put("http://n:1", a[0]);
  connections.Put("http://n:1", b[0]);
  connections.Put("http://n:1", c[0]);  // over the cap: closed
  EXPECT_FALSE(IsOpen(c[0]));
  EXPECT_EQ(connections.stats().idle, 2u);
  EXPECT_EQ(connections.Take("http://other:1"), -1);
  EXPECT_EQ(connections.Take("http://n:1"), b[0]);
  EXPECT_EQ(connections.stats().reused, 1);
  connections.Put("http://n:1", b[0]);
  // The node closed b: it is dropped and a, still open, handed out.
  close(b[1]);
  EXPECT_EQ(connections.Take("http://n:1"), a[0]);
  EXPECT_FALSE(IsOpen(b[0]));
  // Unasked bytes on an idle connection make it unusable too.
  connections.Put("http://n:1", a[0]);
  ASSERT_EQ(write(a[1], "x", 1), 1);
  EXPECT_EQ(connections.Take("http://n:1"), -1);
  EXPECT_FALSE(IsOpen(a[0]));
  // Expiry: at idle_timeout, or sooner under the node's announced keep-alive timeout (400 ms:
  // kept 200 ms, half of it).
  int d[2], e[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, d), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, e), 0);
  connections.Put("http://n:1", d[0], std::chrono::milliseconds(400));
  connections.Put("http://m:1", e[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(connections.Take("http://n:1"), -1);  // d (200 ms) expired
  EXPECT_FALSE(IsOpen(d[0]));
  EXPECT_EQ(connections.stats().idle, 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  connections.CloseStale();  // e (300 ms) expired
  EXPECT_FALSE(IsOpen(e[0]));
  EXPECT_EQ(connections.stats().idle, 0u);
  for (int fd : {a[1], c[1], d[1], e[1]}) close(fd);
}

std::unique_ptr<Router> StartRouterFor(const std::string& node_url) {
  RouterOptions options;
  options.port = 0;
  options.nodes = {node_url};
  auto router = Router::Create(options);
  EXPECT_TRUE(router.ok()) << router.status().ToString();
  if (!router.ok()) return nullptr;
  EXPECT_TRUE((*router)->Start().ok());
  const Deadline healthy = Deadline::AfterMs(10000);
  while ((*router)->nodes().HealthyCount() != 1 && !healthy.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ((*router)->nodes().HealthyCount(), 1);
  return std::move(*router);
}

httplib::Client RouterClient(const Router& router) {
  httplib::Client client("127.0.0.1", router.port());
  client.set_read_timeout(30, 0);
  return client;
}

// A streamed chat completion through the router, read whole; its body.
std::string StreamWhole(const Router& router) {
  auto client = RouterClient(router);
  auto res = client.Post("/v1/chat/completions", "{}", "application/json");
  if (!res) return "<no response>";
  return res->body;
}

TEST(RouterKeepAliveTest, SequentialRequestsReuseOneNodeConnection) {
  PortRecordingNode node;
  auto router = StartRouterFor(node.url());
  ASSERT_TRUE(router);
  for (int i = 0; i < 3; ++i) {
    auto client = RouterClient(*router);
    auto res = client.Post("/v1/completions", "{}", "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
    const std::string stream = StreamWhole(*router);
    EXPECT_NE(stream.find("data: {\"n\": 2}\n\n"), std::string::npos) << stream;
    EXPECT_TRUE(stream.ends_with(http::kSseDone)) << stream;
  }
  const std::vector<int> ports = node.ports();
  ASSERT_EQ(ports.size(), 6u);
  EXPECT_EQ(std::set<int>(ports.begin(), ports.end()).size(), 1u)
      << "the node saw requests from more than one router connection";
  const UpstreamConnectionStats stats = router->upstream_connections();
  EXPECT_EQ(stats.opened, 1);
  EXPECT_EQ(stats.reused, 5);
  EXPECT_EQ(stats.idle, 1u);
  // And /metrics says so.
  auto metrics = RouterClient(*router).Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("pdserve:router_node_connections_opened_total 1\n"),
            std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("pdserve:router_node_connections_reused_total 5\n"),
            std::string::npos);
}

// The client of a stream leaves mid-stream: the router closes that stream's node connection
// (the node's next write fails: it stops generating), and only that one.
TEST(RouterKeepAliveTest, ClientLeavingMidStreamClosesItsNodeConnectionOnly) {
  PortRecordingNode node;
  auto router = StartRouterFor(node.url());
  ASSERT_TRUE(router);
  ASSERT_NE(StreamWhole(*router), "<no response>");  // leaves one idle connection
  ASSERT_EQ(router->upstream_connections().idle, 1u);

  httplib::Client client("127.0.0.1", router->port());
  client.set_read_timeout(30, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.set_header("Content-Type", "application/json");
  req.body = "{\"endless\": true}";
  int events = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    return ++events < 3;  // leaves after a few events
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  client.send(req, res, error);
  client.stop();
  const Deadline noticed = Deadline::AfterMs(5000);
  while (!node.stream_broken.load() && !noticed.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(node.stream_broken.load()) << "the node kept streaming to no one";

  // The stream took the idle connection and closed it; the next request opens a new one,
  // which the one after reuses.
  ASSERT_NE(StreamWhole(*router), "<no response>");
  ASSERT_NE(StreamWhole(*router), "<no response>");
  const std::vector<int> ports = node.ports();
  ASSERT_EQ(ports.size(), 4u);
  EXPECT_EQ(ports[0], ports[1]) << "the stream did not reuse the idle connection";
  EXPECT_NE(ports[2], ports[1]) << "a connection whose stream was cut was reused";
  EXPECT_EQ(ports[3], ports[2]);
  EXPECT_EQ(router->upstream_connections().opened, 2);
}

// A node that answers the first request of each connection and keeps it open, but closes a
// connection without answering when a second request arrives on it (as a node does that
// closed an idle connection just as the request went out). Raw sockets: no HTTP library would.
class ClosingNode {
 public:
  ClosingNode() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listen_fd_, 16), 0);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accept_thread_ = std::thread([this] {
      for (;;) {
        const int fd = accept(listen_fd_, nullptr, nullptr);
        if (fd < 0) return;
        std::lock_guard lock(mu_);
        threads_.emplace_back([this, fd] { Serve(fd); });
      }
    });
  }
  ~ClosingNode() {
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    accept_thread_.join();
    std::lock_guard lock(mu_);
    for (std::thread& t : threads_) t.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::atomic<int> completions_received{0};
  std::atomic<int> completions_answered{0};

 private:
  void Serve(int fd) {
    std::string in;
    char buf[4096];
    for (int served = 0;; ++served) {
      size_t head_end;
      while ((head_end = in.find("\r\n\r\n")) == std::string::npos) {
        const ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) {
          close(fd);
          return;
        }
        in.append(buf, static_cast<size_t>(n));
      }
      const std::string head = in.substr(0, head_end + 4);
      size_t length = 0;
      if (const size_t at = head.find("Content-Length: "); at != std::string::npos) {
        length = std::stoul(head.substr(at + 16));
      }
      while (in.size() < head.size() + length) {
        const ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) {
          close(fd);
          return;
        }
        in.append(buf, static_cast<size_t>(n));
      }
      in.erase(0, head.size() + length);
      const bool completion = head.starts_with("POST /v1/completions");
      if (completion) ++completions_received;
      if (served > 0) {
        close(fd);  // a second request on this connection: gone without a word
        return;
      }
      if (completion) ++completions_answered;
      const std::string answer =
          "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
          "Keep-Alive: timeout=5, max=100\r\n\r\n{}";
      send(fd, answer.data(), answer.size(), MSG_NOSIGNAL);
    }
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::thread accept_thread_;
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

TEST(RouterKeepAliveTest, KeptConnectionClosedBeforeAnAnswerIsReplaced) {
  ClosingNode node;
  auto router = StartRouterFor(node.url());
  ASSERT_TRUE(router);
  for (int i = 0; i < 3; ++i) {
    auto res = RouterClient(*router).Post("/v1/completions", "{}", "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << i << ": " << res->body;
    EXPECT_EQ(res->body, "{}");
  }
  // The first went out on a new connection; the others on the kept one (closed unanswered)
  // and then on a new one.
  EXPECT_EQ(node.completions_answered.load(), 3);
  EXPECT_EQ(node.completions_received.load(), 5);
  EXPECT_EQ(router->upstream_connections().opened, 3);
}

}  // namespace
}  // namespace pdserve::router
