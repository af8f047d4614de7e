// The router's node connections: TCP_NODELAY on every socket it opens to a node (read back
// with getsockopt while a request is held at a fake node); a client that leaves a silent
// stream gets its node connection closed within a poll; and streams a client drops through
// the router stop generating at the node about as soon as streams dropped at the node itself
// (a real `pdserve serve` on the tiny model, its /metrics read before and after).
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
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

int PortOf(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  }
  if (addr.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  }
  return -1;
}

// The connected TCP socket of this process whose local and peer ports are the given ones, or
// -1 (httplib 0.11 hands handlers no socket, only the request's ports).
int FindConnectedSocket(int local_port, int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t llen = sizeof(local), plen = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
        PortOf(local) != local_port) {
      continue;
    }
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) == 0 &&
        PortOf(peer) == remote_port) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

// The TCP sockets of this process connected to 127.0.0.1:`peer_port`, as fds.
std::vector<int> SocketsConnectedTo(int peer_port) {
  std::vector<int> fds;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::atoi(entry.path().filename().c_str());
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) continue;
    if (addr.ss_family != AF_INET) continue;
    if (ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port) == peer_port) fds.push_back(fd);
  }
  return fds;
}

bool NoDelay(int fd) {
  int on = 0;
  socklen_t len = sizeof(on);
  return getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, &len) == 0 && on != 0;
}

// A node that holds each completion until released, so its connection stays open.
class HoldingNode {
 public:
  HoldingNode() {
    server_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    server_.Post("/v1/completions", [this](const httplib::Request&, httplib::Response& res) {
      ++arrived;
      const Deadline deadline = Deadline::AfterMs(20000);
      while (!released && !deadline.Passed()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      res.set_content("{}", "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~HoldingNode() {
    released = true;
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::atomic<int> arrived{0};
  std::atomic<bool> released{false};

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

// Without TCP_NODELAY a request written as head and body waits for the node's delayed ACK
// (~40 ms) before its body leaves: every relayed request and health check paid it.
TEST(RouterSocketTest, NodeConnectionsSetTcpNoDelay) {
  HoldingNode node;
  RouterOptions options;
  options.port = 0;
  options.nodes = {node.url()};
  auto router = Router::Create(options);
  ASSERT_TRUE(router.ok()) << router.status().ToString();
  ASSERT_TRUE((*router)->Start().ok());
  const Deadline healthy = Deadline::AfterMs(10000);
  while ((*router)->nodes().HealthyCount() != 1 && !healthy.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ((*router)->nodes().HealthyCount(), 1);
  std::thread request([&] {
    httplib::Client client("127.0.0.1", (*router)->port());
    client.set_read_timeout(30, 0);
    client.Post("/v1/completions", R"({"prompt": "x"})", "application/json");
  });
  const Deadline arrived = Deadline::AfterMs(10000);
  while (node.arrived == 0 && !arrived.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // The router runs in this process: its socket to the node is one of ours. Read while the
  // node holds the request, so the socket is still open.
  const std::vector<int> fds = SocketsConnectedTo(node.port());
  int without = 0;
  for (int fd : fds) without += NoDelay(fd) ? 0 : 1;
  node.released = true;
  request.join();
  ASSERT_EQ(node.arrived.load(), 1);
  ASSERT_FALSE(fds.empty()) << "no socket of this process is connected to the node";
  EXPECT_EQ(without, 0) << without << " of " << fds.size()
                        << " sockets to the node lack TCP_NODELAY";
  (*router)->Stop();
}

// A node whose stream sends its head and then nothing (a long prompt in prefill), and notes
// when the router closes the connection.
class SilentStreamNode {
 public:
  SilentStreamNode() {
    server_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      ++arrived;
      auto fd = std::make_shared<int>(-1);
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, fd, local = req.local_port, remote = req.remote_port](size_t, httplib::DataSink&) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            if (*fd < 0) *fd = FindConnectedSocket(local, remote);
            char byte;
            if (*fd >= 0 && recv(*fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
              closed_at = Clock::now().time_since_epoch().count();
              return false;
            }
            return !stopping.load();
          });
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~SilentStreamNode() {
    stopping = true;
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::atomic<int> arrived{0};
  std::atomic<bool> stopping{false};
  std::atomic<Clock::rep> closed_at{0};  // when the router's connection closed

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

// The router learns that its client left without waiting for the node's next bytes: while a
// stream is silent (a long prefill), a client that closed is seen at the next poll and the
// node's connection is closed, so the node stops working for no one.
TEST(RouterCancelTest, SilentStreamIsClosedAtTheNodeSoonAfterTheClientLeaves) {
  SilentStreamNode node;
  RouterOptions options;
  options.port = 0;
  options.nodes = {node.url()};
  auto router = Router::Create(options);
  ASSERT_TRUE(router.ok()) << router.status().ToString();
  ASSERT_TRUE((*router)->Start().ok());
  ASSERT_TRUE(testing::WaitHealthy((*router)->port(), Deadline::AfterMs(10000)));
  httplib::Client client("127.0.0.1", (*router)->port());
  client.set_read_timeout(30, 0);
  std::thread dropper([&] {
    const Deadline arrived = Deadline::AfterMs(10000);
    while (node.arrived == 0 && !arrived.Passed()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the relay is waiting
    client.stop();
  });
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = R"({"prompt": "x", "stream": true})";
  req.content_receiver = [](const char*, size_t, uint64_t, uint64_t) { return true; };
  httplib::Response res;
  httplib::Error error;
  client.send(req, res, error);
  dropper.join();
  const TimePoint dropped = Clock::now();
  const Deadline deadline = Deadline::AfterMs(8000);
  while (node.closed_at == 0 && !deadline.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(node.closed_at.load(), 0) << "the node's connection stayed open 8 s after the client "
                                         "left (the router waited for bytes to relay)";
  const TimePoint closed{Clock::duration(node.closed_at.load())};
  EXPECT_LT(closed - dropped, std::chrono::seconds(2));
  (*router)->Stop();
}

double Metric(int port, const std::string& name) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(10, 0);
  auto r = client.Get("/metrics");
  if (!r) return -1;
  const size_t at = r->body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::atof(r->body.c_str() + at + name.size() + 2);
}

// Opens `n` long streams to `port` at once and drops each after its first events.
void DropStreams(int port, int n) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([port] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(30, 0);
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.set_header("Content-Type", "application/json");
      req.body = json{
          {"prompt", "Once upon a time"},
          {"max_tokens", 3000},
          {"ignore_eos", true},
          {"stream",
           true}}.dump();
      int pieces = 0;
      req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++pieces < 2; };
      httplib::Response res;
      httplib::Error error;
      client.send(req, res, error);
      client.stop();
    });
  }
  for (std::thread& t : threads) t.join();
}

// Tokens the node generates from the moment `n` dropped streams were all closed until it
// is idle; -1 if it is not idle within the deadline.
double TokensAfterDrop(int send_port, int node_port, int n) {
  DropStreams(send_port, n);
  const double at_drop = Metric(node_port, "pdserve:generation_tokens_total");
  const Deadline idle = Deadline::AfterMs(20000);
  while (Metric(node_port, "pdserve:num_requests_running") != 0 && !idle.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (idle.Passed()) return -1;
  return Metric(node_port, "pdserve:generation_tokens_total") - at_drop;
}

// The node only learns that a client left when a write to it fails. Through the router that
// client is the router's connection, which must close as soon as the router's own client is
// gone: then a dropped stream costs the node about what a stream dropped at the node does.
TEST(RouterCancelTest, DroppedStreamsStopAtTheNodeAsFastAsDirectOnes) {
  const std::string model = testing::TinyModelDir();
  ASSERT_FALSE(model.empty());
  const int node_port = testing::FreePort();
  testing::Subprocess node({testing::BinaryPath("src/cli/pdserve"), "serve", "--model", model,
                            "--listen", "127.0.0.1:" + std::to_string(node_port), "--threads",
                            "1"});
  ASSERT_TRUE(testing::WaitHealthy(node_port, Deadline::AfterMs(60000)));
  RouterOptions options;
  options.port = 0;
  options.nodes = {"http://127.0.0.1:" + std::to_string(node_port)};
  auto router = Router::Create(options);
  ASSERT_TRUE(router.ok()) << router.status().ToString();
  ASSERT_TRUE((*router)->Start().ok());
  ASSERT_TRUE(testing::WaitHealthy((*router)->port(), Deadline::AfterMs(10000)));

  constexpr int kStreams = 16;
  const double direct = TokensAfterDrop(node_port, node_port, kStreams);
  const double routed = TokensAfterDrop((*router)->port(), node_port, kStreams);
  ASSERT_GE(direct, 0) << "the node kept generating after direct drops";
  ASSERT_GE(routed, 0) << "the node kept generating for 20 s after the router's client left";
  std::printf("tokens generated after %d drops: direct %.0f, through the router %.0f\n", kStreams,
              direct, routed);
  // Generous for a loaded machine: a few steps per stream more than direct, far below the
  // 3000 tokens each stream would run to.
  EXPECT_LE(routed, direct + 20.0 * kStreams)
      << "streams dropped through the router kept generating at the node";
  (*router)->Stop();
}

}  // namespace
}  // namespace pdserve::router
