// Router tests. NodePool is pure bookkeeping and is tested directly; the Router is tested in
// this process against fake nodes (small httplib servers whose timing the test controls, so
// ordering claims are checked without timed assertions), then as the real `pdserve router`
// binary in front of two real `pdserve serve` nodes.
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "http/cluster_auth.h"
#include "router/router.h"
#include "router/router_in_process.h"
#include "router/router_nodes.h"
#include "testing/cluster_processes.h"
#include "testing/raw_http_client.h"
#include "testing/test_paths.h"

namespace pdserve::router {
namespace {

using nlohmann::json;

TEST(NodeUrlTest, ParsesAndRejects) {
  auto a = ParseNodeUrl("http://127.0.0.1:8001/");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8001);
  EXPECT_EQ(a->url, "http://127.0.0.1:8001");
  EXPECT_TRUE(ParseNodeUrl("localhost:9").ok());
  for (const char* bad : {"", "http://", "host", "host:0", "host:99999", "host:12x", "https://h:1",
                          "http://h/x:1", ":80"}) {
    EXPECT_FALSE(ParseNodeUrl(bad).ok()) << bad;
  }
}

TEST(NodePoolTest, LeastOutstandingWithRoundRobinTies) {
  NodePool pool;
  ASSERT_TRUE(pool.AddStatic("http://a:1").ok());
  ASSERT_TRUE(pool.AddStatic("http://b:2").ok());
  EXPECT_FALSE(pool.Acquire().has_value()) << "new nodes get traffic only once healthy";
  pool.ReportHealthy("http://a:1");
  pool.ReportHealthy("http://b:2");
  // Ties alternate.
  std::string first = pool.Acquire()->url;
  pool.Release(first);
  std::string second = pool.Acquire()->url;
  pool.Release(second);
  EXPECT_NE(first, second);
  // A busy node is avoided while the other has fewer outstanding requests.
  std::string busy = pool.Acquire()->url;
  std::string other = pool.Acquire()->url;
  EXPECT_NE(other, busy);
  pool.Release(other);
  EXPECT_EQ(pool.Acquire()->url, other) << "0 outstanding beats 1, whatever the turn";
  pool.Release(busy);
  pool.Release(other);
  // Excluded nodes are skipped.
  auto only = pool.Acquire({"http://a:1"});
  ASSERT_TRUE(only.has_value());
  EXPECT_EQ(only->url, "http://b:2");
  EXPECT_FALSE(pool.Acquire({"http://a:1", "http://b:2"}).has_value());
}

// A degraded node (a decode node with no usable prefill peer: it prefills locally) still serves,
// but only when no node that is not degraded is left, whatever its load.
TEST(NodePoolTest, DegradedNodesServeOnlyWhenNoOtherIsLeft) {
  NodePool pool;
  ASSERT_TRUE(pool.AddStatic("http://a:1").ok());
  ASSERT_TRUE(pool.AddStatic("http://b:2").ok());
  EXPECT_TRUE(pool.ReportHealthy("http://a:1", "no usable prefill peer"));
  EXPECT_TRUE(pool.ReportHealthy("http://b:2"));
  EXPECT_EQ(pool.DegradedCount(), 1);
  for (int i = 0; i < 3; ++i) {  // b gets them all, however many it has outstanding
    EXPECT_EQ(pool.Acquire()->url, "http://b:2");
  }
  auto fallback = pool.Acquire({"http://b:2"});
  ASSERT_TRUE(fallback.has_value());
  EXPECT_EQ(fallback->url, "http://a:1");
  const auto snapshot = pool.Snapshot();
  EXPECT_EQ(snapshot[0].degraded, "no usable prefill peer");
  EXPECT_EQ(snapshot[1].degraded, "");
  // Recovered: a change the health checker logs, and a again takes its share.
  EXPECT_TRUE(pool.ReportHealthy("http://a:1"));
  EXPECT_FALSE(pool.ReportHealthy("http://a:1"));
  EXPECT_EQ(pool.DegradedCount(), 0);
  EXPECT_EQ(pool.Acquire()->url, "http://a:1") << "0 outstanding beats 4";
}

TEST(NodePoolTest, HealthTransitions) {
  NodePoolOptions options;
  options.failures_to_down = 2;
  NodePool pool(options);
  ASSERT_TRUE(pool.AddStatic("http://a:1").ok());
  EXPECT_TRUE(pool.ReportHealthy("http://a:1"));
  EXPECT_FALSE(pool.ReportUnhealthy("http://a:1"));
  EXPECT_EQ(pool.HealthyCount(), 1) << "one failure is not enough";
  EXPECT_TRUE(pool.ReportUnhealthy("http://a:1"));
  EXPECT_EQ(pool.HealthyCount(), 0);
  EXPECT_TRUE(pool.ReportHealthy("http://a:1"));
  pool.ReportConnectFailure("http://a:1");
  EXPECT_EQ(pool.HealthyCount(), 0) << "a refused connection takes the node out at once";
}

TEST(NodePoolTest, RegistrationRefreshAndExpiry) {
  NodePoolOptions options;
  options.registration_ttl = std::chrono::seconds(10);
  NodePool pool(options);
  const TimePoint t0 = Clock::now();
  EXPECT_TRUE(*pool.Register("http://n:5", t0));
  EXPECT_FALSE(*pool.Register("http://n:5/", t0 + std::chrono::seconds(8)));
  EXPECT_FALSE(pool.Register("bogus").ok());
  pool.ExpireRegistrations(t0 + std::chrono::seconds(15));
  EXPECT_EQ(pool.Size(), 1) << "refreshed at t0+8";
  EXPECT_TRUE(pool.TakeRemoved().empty());
  pool.ExpireRegistrations(t0 + std::chrono::seconds(19));
  EXPECT_EQ(pool.Size(), 0);
  EXPECT_EQ(pool.TakeRemoved(), std::vector<std::string>{"http://n:5"});
  ASSERT_TRUE(pool.AddStatic("http://s:6").ok());
  pool.ExpireRegistrations(t0 + std::chrono::hours(1));
  EXPECT_EQ(pool.Size(), 1) << "command-line nodes never expire";
}

// Members of the cluster's membership (etcd): added unhealthy, withdrawn when no longer
// listed — at once when idle, else no new request and dropped after the last one; a --node or a
// live registration keeps a node the membership no longer lists.
TEST(NodePoolTest, MembershipAddsAndWithdrawsNodes) {
  NodePool pool;
  EXPECT_TRUE(pool.SetMembers({"http://a:1", "http://b:2", "bogus"}));
  EXPECT_EQ(pool.Size(), 2);
  EXPECT_FALSE(pool.Acquire().has_value()) << "unhealthy until checked";
  pool.ReportHealthy("http://a:1");
  pool.ReportHealthy("http://b:2");
  EXPECT_FALSE(pool.SetMembers({"http://a:1", "http://b:2"})) << "nothing new";
  auto busy = pool.Acquire();  // a: round robin starts there
  ASSERT_TRUE(busy.has_value());
  const std::string kept = busy->url == "http://a:1" ? "http://b:2" : "http://a:1";
  ASSERT_TRUE(pool.AddStatic("http://s:3").ok());
  pool.ReportHealthy("http://s:3");
  EXPECT_TRUE(*pool.Register("http://r:4"));
  pool.ReportHealthy("http://r:4");
  pool.SetMembers({kept, "http://r:4"});
  // The busy node left: it stays for its request but gets no other.
  EXPECT_EQ(pool.Size(), 4);
  for (int i = 0; i < 6; ++i) {
    auto n = pool.Acquire();
    ASSERT_TRUE(n.has_value());
    EXPECT_NE(n->url, busy->url);
    pool.Release(n->url);
  }
  EXPECT_TRUE(pool.TakeRemoved().empty()) << "the busy node is still in the pool";
  pool.Release(busy->url);
  pool.ExpireRegistrations();
  EXPECT_EQ(pool.Size(), 3) << "dropped after its last request";
  EXPECT_EQ(pool.TakeRemoved(), std::vector<std::string>{busy->url});
  EXPECT_TRUE(pool.TakeRemoved().empty()) << "each removal reported once";
  // Leaving the membership does not drop a registered or a command-line node.
  pool.SetMembers({});
  EXPECT_EQ(pool.Size(), 2) << "the member alone left; s (--node) and r (registered) stay";
  EXPECT_EQ(pool.TakeRemoved(), std::vector<std::string>{kept}) << "idle: removed at once";
  for (const NodeSnapshot& n : pool.Snapshot()) EXPECT_NE(n.url, kept);
  // A withdrawn node that comes back is used again.
  EXPECT_TRUE(pool.SetMembers({kept}));
  EXPECT_EQ(pool.Size(), 3);
}

// A node stand-in whose answers the test controls.
class FakeNode {
 public:
  explicit FakeNode(std::string name) : name_(std::move(name)) {
    server_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.status = healthy.load() ? 200 : 503;
      res.set_content("{}", "application/json");
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      ++completions;
      {
        std::unique_lock lock(mu_);
        last_request_id_ = req.get_header_value("X-Request-Id");
        // Held requests stay outstanding until the test releases them.
        cv_.wait_for(lock, std::chrono::seconds(20), [&] { return !hold_; });
      }
      res.status = status.load();
      res.set_content(json{{"node", name_}}.dump(), "application/json");
    });
    // Two SSE events; the second is produced only after the test saw the first.
    server_.Post("/v1/chat/completions", [this](const httplib::Request&, httplib::Response& res) {
      auto step = std::make_shared<int>(0);
      res.set_chunked_content_provider(
          "text/event-stream", [this, step](size_t, httplib::DataSink& sink) {
            if (*step == 0) {
              const std::string first = "data: {\"n\":1}\n\n";
              sink.write(first.data(), first.size());
            } else {
              std::unique_lock lock(mu_);
              second_after_client_saw_first =
                  cv_.wait_for(lock, std::chrono::seconds(10), [&] { return client_saw_first_; });
              lock.unlock();
              const std::string rest = "data: {\"n\":2}\n\ndata: [DONE]\n\n";
              sink.write(rest.data(), rest.size());
              sink.done();
            }
            ++*step;
            return true;
          });
    });
    // An endless stream, to see the router close it when its client leaves.
    server_.Post("/tokenize", [this](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider(
          "text/event-stream",
          [this](size_t, httplib::DataSink& sink) {
            const std::string tick = "data: {}\n\n";
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            if (!sink.write(tick.data(), tick.size())) upstream_closed = true;
            return !upstream_closed.load();
          },
          [this](bool) { upstream_closed = true; });
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeNode() { Stop(); }

  void Stop() {
    Release();
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  void Hold() {
    std::lock_guard lock(mu_);
    hold_ = true;
  }
  void Release() {
    {
      std::lock_guard lock(mu_);
      hold_ = false;
    }
    cv_.notify_all();
  }
  void ClientSawFirst() {
    {
      std::lock_guard lock(mu_);
      client_saw_first_ = true;
    }
    cv_.notify_all();
  }
  std::string last_request_id() {
    std::lock_guard lock(mu_);
    return last_request_id_;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

  std::atomic<bool> healthy{true};
  std::atomic<int> status{200};
  std::atomic<int> completions{0};
  std::atomic<bool> upstream_closed{false};
  std::atomic<bool> second_after_client_saw_first{false};  // read by the test thread

 private:
  std::string name_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  bool client_saw_first_ = false;
  std::string last_request_id_;
};

RouterOptions WithNodes(std::vector<std::string> nodes) {
  RouterOptions options;
  options.nodes = std::move(nodes);
  return options;
}

// Waits (bounded) until the router counts `n` healthy nodes.
bool WaitHealthyNodes(Router& router, int n) {
  const Deadline deadline = Deadline::AfterMs(10000);
  while (router.nodes().HealthyCount() != n) {
    if (deadline.Passed()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

httplib::Client ClientFor(const Router& router) {
  httplib::Client client("127.0.0.1", router.port());
  client.set_read_timeout(30, 0);
  return client;
}

std::string NodeOf(const httplib::Result& r) {
  if (!r) return "<no response>";
  return json::parse(r->body, nullptr, false).value("node", "<bad body>");
}

TEST(RouterTest, LeastOutstandingAvoidsBusyNode) {
  FakeNode a("a"), b("b");
  auto router = StartRouter(WithNodes({a.url(), b.url()}));
  ASSERT_TRUE(router && WaitHealthyNodes(*router, 2));
  a.Hold();
  b.Hold();
  // The first request stays outstanding on one node; the next two must both avoid it
  // (the second goes to the idle node, the third to the node with the fewest: still not it).
  std::string first_node;
  std::thread first([&] {
    auto client = ClientFor(*router);
    first_node = NodeOf(client.Post("/v1/completions", "{}", "application/json"));
  });
  const Deadline d = Deadline::AfterMs(10000);
  while (a.completions + b.completions < 1 && !d.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  FakeNode& busy = a.completions == 1 ? a : b;
  FakeNode& idle = a.completions == 1 ? b : a;
  idle.Release();
  auto client = ClientFor(*router);
  EXPECT_EQ(NodeOf(client.Post("/v1/completions", "{}", "application/json")),
            &idle == &a ? "a" : "b");
  EXPECT_EQ(busy.completions.load(), 1);
  busy.Release();
  first.join();
  EXPECT_EQ(first_node, &busy == &a ? "a" : "b");
}

// Routing by prefix (RouterOptions::prefix_weight): prompts that extend one sent before go
// to the node that had it, where round robin would alternate; unrelated prompts still
// alternate; the preference yields to load (2 outstanding on the holder outweigh a prefix
// worth 2 x 10/11); with weight 0 the same prompts alternate.
TEST(RouterTest, PromptsSharingAPrefixGoWhereThePrefixWentUnlessThatNodeIsBusy) {
  const std::string shared(640, 'x');  // 10 blocks of 64 bytes
  auto body = [&](const std::string& suffix) {
    return json{{"prompt", shared + suffix}, {"max_tokens", 1}}.dump();
  };
  for (const double weight : {2.0, 0.0}) {
    SCOPED_TRACE("weight " + std::to_string(weight));
    FakeNode a("a"), b("b");
    RouterOptions options = WithNodes({a.url(), b.url()});
    options.prefix_weight = weight;
    auto router = StartRouter(options);
    ASSERT_TRUE(router && WaitHealthyNodes(*router, 2));
    auto client = ClientFor(*router);
    const std::string first = NodeOf(client.Post("/v1/completions", body(""), "application/json"));
    std::vector<std::string> got;
    for (int i = 0; i < 4; ++i) {
      got.push_back(NodeOf(client.Post("/v1/completions", body(std::string(70, char('a' + i))),
                                       "application/json")));
    }
    if (weight == 0) {
      EXPECT_NE(got[0], first);
      EXPECT_NE(got[1], got[0]);
      continue;
    }
    for (const std::string& node : got) EXPECT_EQ(node, first);
    // Unrelated prompts: round robin between the nodes.
    const std::string u1 = NodeOf(client.Post(
        "/v1/completions", json{{"prompt", std::string(640, 'u')}}.dump(), "application/json"));
    const std::string u2 = NodeOf(client.Post(
        "/v1/completions", json{{"prompt", std::string(640, 'v')}}.dump(), "application/json"));
    EXPECT_NE(u1, u2);
    // The holder busy: two held requests stay on it (cost 0 - 1.8, then 1 - 1.8, below the
    // other's 0); the third goes to the other node (2 - 1.8 > 0).
    FakeNode& holder = first == "a" ? a : b;
    holder.Hold();
    std::vector<std::thread> held;
    for (int i = 0; i < 2; ++i) {
      held.emplace_back([&, i] {
        auto c = ClientFor(*router);
        c.Post("/v1/completions", body(std::string(5, char('k' + i))), "application/json");
      });
      const Deadline d = Deadline::AfterMs(10000);
      while (router->nodes().Snapshot()[first == "a" ? 0 : 1].outstanding < i + 1 && !d.Passed()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    EXPECT_NE(NodeOf(client.Post("/v1/completions", body("z"), "application/json")), first);
    holder.Release();
    for (std::thread& t : held) t.join();
  }
}

// A node that leaves the membership takes the router's guess of its cache with it: when it
// comes back (perhaps restarted, its cache empty), prompts sharing a prefix it once held go where
// the prefix went since, not back to it. Without the forgetting, the returning node ties with the
// other on the prefix and round robin sends it some of them.
TEST(RouterTest, ANodeThatLeftTheMembershipIsNoLongerThoughtToHoldItsPrefixes) {
  const std::string shared(640, 'y');  // 10 blocks of 64 bytes
  auto body = [&](const std::string& suffix) {
    return json{{"prompt", shared + suffix}, {"max_tokens", 1}}.dump();
  };
  FakeNode a("a"), b("b");
  auto router = StartRouter(RouterOptions{});
  ASSERT_TRUE(router);
  router->SetMembers({a.url(), b.url()});
  ASSERT_TRUE(WaitHealthyNodes(*router, 2));
  auto client = ClientFor(*router);
  const std::string first = NodeOf(client.Post("/v1/completions", body(""), "application/json"));
  ASSERT_TRUE(first == "a" || first == "b") << first;
  const std::string other_url = first == "a" ? b.url() : a.url();
  router->SetMembers({other_url});
  ASSERT_EQ(router->nodes().Size(), 1);
  const std::string other =
      NodeOf(client.Post("/v1/completions", body("-while-away"), "application/json"));
  EXPECT_NE(other, first);
  router->SetMembers({a.url(), b.url()});
  ASSERT_TRUE(WaitHealthyNodes(*router, 2));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(NodeOf(client.Post("/v1/completions", body(std::string(70, char('a' + i))),
                                 "application/json")),
              other)
        << "request " << i;
  }
}

TEST(RouterTest, RetriesOnAnotherNodeWhenOneIsDownAtRequestTime) {
  FakeNode a("a"), b("b");
  // Health checks only at start: the router learns of the dead node from the request itself.
  RouterOptions options = WithNodes({a.url(), b.url()});
  options.health_interval = std::chrono::hours(1);
  auto router = StartRouter(options);
  ASSERT_TRUE(router && WaitHealthyNodes(*router, 2));
  a.Stop();
  auto client = ClientFor(*router);
  for (int i = 0; i < 4; ++i) {
    auto r = client.Post("/v1/completions", "{}", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(NodeOf(r), "b");
  }
  EXPECT_EQ(router->nodes().HealthyCount(), 1) << "refused connection marks the node down";
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("pdserve:router_retries_total 1\n"), std::string::npos)
      << metrics->body;
}

TEST(RouterTest, RetriesA503AndPassesTheLastErrorWhenAllFail) {
  FakeNode a("a"), b("b");
  auto router = StartRouter(WithNodes({a.url(), b.url()}));
  ASSERT_TRUE(router && WaitHealthyNodes(*router, 2));
  a.status = 503;
  auto client = ClientFor(*router);
  for (int i = 0; i < 3; ++i) {
    auto r = client.Post("/v1/completions", "{}", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(NodeOf(r), "b");
  }
  b.status = 500;
  const int calls_before = a.completions + b.completions;
  auto r = client.Post("/v1/completions", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_GE(r->status, 500);
  EXPECT_EQ(a.completions + b.completions, calls_before + 2) << "both nodes were tried";
}

TEST(RouterTest, RelaysSseIncrementally) {
  FakeNode a("a");
  auto router = StartRouter(WithNodes({a.url()}));
  ASSERT_TRUE(router && WaitHealthyNodes(*router, 1));
  auto client = ClientFor(*router);
  std::string received;
  bool first_seen_before_end = false;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = "{\"stream\": true}";
  req.headers.emplace("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    received.append(data, n);
    if (received.find("\"n\":1") != std::string::npos && !first_seen_before_end) {
      first_seen_before_end = received.find("[DONE]") == std::string::npos;
      a.ClientSawFirst();  // only now does the node produce the rest
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error;
  ASSERT_TRUE(client.send(req, res, error)) << httplib::to_string(error);
  EXPECT_EQ(res.status, 200);
  EXPECT_TRUE(first_seen_before_end);
  EXPECT_TRUE(a.second_after_client_saw_first.load())
      << "the node had to wait past its deadline: the router buffered the first event";
  EXPECT_EQ(received, "data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n");
  EXPECT_FALSE(res.get_header_value("X-Request-Id").empty());
}

TEST(RouterTest, ClientDisconnectClosesUpstream) {
  FakeNode a("a");
  auto router = StartRouter(WithNodes({a.url()}));
  ASSERT_TRUE(router && WaitHealthyNodes(*router, 1));
  auto client = ClientFor(*router);
  httplib::Request req;
  req.method = "POST";
  req.path = "/tokenize";
  req.body = "{}";
  int pieces = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++pieces < 3; };
  httplib::Response res;
  httplib::Error error;
  client.send(req, res, error);  // returns once the receiver said stop
  client.stop();
  const Deadline d = Deadline::AfterMs(15000);
  while (!a.upstream_closed && !d.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(a.upstream_closed) << "the node kept streaming to a router whose client left";
  // The outstanding count returns to zero once the relay ends.
  while (router->nodes().Snapshot()[0].outstanding != 0 && !d.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(router->nodes().Snapshot()[0].outstanding, 0);
}

TEST(RouterTest, RequestIdIsForwardedAndReturned) {
  FakeNode a("a");
  auto router = StartRouter(WithNodes({a.url()}));
  ASSERT_TRUE(router && WaitHealthyNodes(*router, 1));
  auto client = ClientFor(*router);
  auto r = client.Post("/v1/completions", {{"X-Request-Id", "abc-123"}}, "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(a.last_request_id(), "abc-123");
  EXPECT_EQ(r->get_header_value("X-Request-Id"), "abc-123");
  r = client.Post("/v1/completions", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_FALSE(a.last_request_id().empty());
  EXPECT_EQ(r->get_header_value("X-Request-Id"), a.last_request_id());
}

// An id the shared policy refuses (too long, unsafe bytes) is replaced by the router, which
// forwards its own id, so the node works under the id the client got back; logging the
// client's bytes raw, or a node choosing a different id, would break the trail.
TEST(RouterTest, UnsafeRequestIdIsReplacedAndTheReplacementForwarded) {
  FakeNode a("a");
  auto router = StartRouter(WithNodes({a.url()}));
  ASSERT_TRUE(router && WaitHealthyNodes(*router, 1));
  auto client = ClientFor(*router);
  for (const std::string& bad : {std::string(100, 'x'), std::string("a<b>{c}"),
                                 std::string("id;rm"), std::string("caf\xc3\xa9")}) {
    auto r = client.Post("/v1/completions", {{"X-Request-Id", bad}}, "{}", "application/json");
    ASSERT_TRUE(r) << bad;
    const std::string chosen = r->get_header_value("X-Request-Id");
    EXPECT_NE(chosen, bad);
    EXPECT_TRUE(chosen.starts_with("req-")) << chosen;
    EXPECT_EQ(a.last_request_id(), chosen) << "the node must see the router's id";
  }
}

TEST(RouterTest, RegistrationAddsANode) {
  FakeNode a("a");
  RouterOptions options;
  options.cluster_key = "cluster-secret";
  auto router = StartRouter(options);
  ASSERT_TRUE(router);
  auto client = ClientFor(*router);
  auto r = client.Post("/v1/completions", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "no_healthy_node");
  EXPECT_EQ(client.Get("/health")->status, 503);

  // A proof covers one request, body included.
  auto proof = [&](const std::string& body) {
    return http::ClusterAuthHeaders(options.cluster_key, "POST", "/internal/register", body);
  };
  const std::string registration = json{{"url", a.url()}}.dump();
  r = client.Post("/internal/register", proof(registration), registration, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  ASSERT_TRUE(WaitHealthyNodes(*router, 1));
  EXPECT_EQ(client.Get("/health")->status, 200);
  EXPECT_EQ(NodeOf(client.Post("/v1/completions", "{}", "application/json")), "a");
  for (const char* bad : {"", "[]", "{\"url\": 5}", "{\"url\": \"ftp:x\"}", "{\"uri\": \"a:1\"}"}) {
    r = client.Post("/internal/register", proof(bad), bad, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << bad;
    EXPECT_TRUE(json::parse(r->body, nullptr, false).contains("error")) << r->body;
  }
  EXPECT_EQ(router->nodes().Size(), 1);
}

TEST(RouterTest, ErrorsHaveOpenAiShape) {
  FakeNode a("a");
  RouterOptions options = WithNodes({a.url()});
  options.api_key = "sekret";
  options.max_body_bytes = 1024;
  auto router = StartRouter(options);
  ASSERT_TRUE(router && WaitHealthyNodes(*router, 1));
  auto client = ClientFor(*router);
  struct Case {
    std::string path;
    httplib::Headers headers;
    std::string body;
    int status;
    std::string code;
  };
  const httplib::Headers auth = {{"Authorization", "Bearer sekret"}};
  const std::vector<Case> cases = {
      {"/v1/completions", {}, "{}", 401, "invalid_api_key"},
      {"/v1/completions", {{"Authorization", "Bearer nope"}}, "{}", 401, "invalid_api_key"},
      {"/v1/nothing", auth, "{}", 404, "not_found"},
      {"/v1/completions", auth, std::string(4096, 'x'), 413, "payload_too_large"},
  };
  for (const Case& c : cases) {
    auto r = client.Post(c.path, c.headers, c.body, "application/json");
    ASSERT_TRUE(r) << c.path;
    EXPECT_EQ(r->status, c.status) << c.path;
    json body = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(body.contains("error")) << r->body;
    EXPECT_EQ(body["error"]["code"], c.code);
    EXPECT_TRUE(body["error"]["message"].is_string());
    EXPECT_TRUE(body["error"]["type"].is_string());
  }
  EXPECT_EQ(client.Get("/health")->status, 200) << "health needs no key";
  auto ok = client.Post("/v1/completions", auth, "{}", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

// A chunked body is held to the limit as a sized one is: refused with 413 once past it, the
// connection closed, and nothing forwarded to a node.
TEST(RouterTest, ChunkedBodyOverTheLimitIsRefusedAndNotForwarded) {
  FakeNode a("a");
  RouterOptions options = WithNodes({a.url()});
  options.max_body_bytes = 64 << 10;
  auto router = StartRouter(options);
  ASSERT_TRUE(router && WaitHealthyNodes(*router, 1));
  testing::RawHttpClient raw(router->port());
  ASSERT_TRUE(raw.ok());
  constexpr size_t kTotal = size_t{32} << 20;
  std::atomic<size_t> sent{0};
  std::thread sender([&] {
    if (!raw.Send(testing::ChunkedPostHead("/v1/completions"))) return;
    const std::string chunk = testing::Chunk(16 << 10);
    while (sent < kTotal && raw.Send(chunk)) sent += 16 << 10;
  });
  // The answer comes while the client is still sending; the server then drains the rest for
  // a bounded time (lingering close) so that the client can read it, and closes.
  std::string answer = raw.ReadAtLeast(12, Deadline::AfterMs(20000));
  const size_t sent_at_answer = sent.load();
  bool closed = false;
  answer += raw.ReadUntilClose(Deadline::AfterMs(30000), &closed);
  sender.join();
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 413 ")) << answer.substr(0, 300);
  EXPECT_NE(answer.find("payload_too_large"), std::string::npos);
  EXPECT_TRUE(closed);
  EXPECT_LT(sent_at_answer, kTotal) << "the router read the whole body";
  EXPECT_EQ(a.completions.load(), 0) << "the body was forwarded";
}

// The real binaries: `pdserve router` in front of two `pdserve serve` nodes on the tiny model.
class RouterClusterTest : public ::testing::Test {
 protected:
  static constexpr char kClusterKey[] = "router-test-cluster-secret";

  void SetUp() override {
    model_ = testing::TinyModelDir();
    ASSERT_FALSE(model_.empty());
    for (int i = 0; i < 2; ++i) {
      node_ports_.push_back(testing::FreePort());
      nodes_.push_back(StartNode(node_ports_.back(), ""));
    }
    router_port_ = testing::FreePort();
    router_ = std::make_unique<testing::Subprocess>(std::vector<std::string>{
        Binary(), "router", "--listen", "127.0.0.1:" + std::to_string(router_port_), "--node",
        NodeUrl(0), "--node", NodeUrl(1), "--health-interval-ms", "200", "--failures-to-down", "2",
        "--cluster-key", kClusterKey});
    for (int port : node_ports_) {
      ASSERT_TRUE(testing::WaitHealthy(port, Deadline::AfterMs(60000)));
    }
    ASSERT_TRUE(WaitRouterHealthyNodes(2));
  }

  static std::string Binary() { return testing::BinaryPath("src/cli/pdserve"); }
  std::string NodeUrl(int i) const {
    return "http://127.0.0.1:" + std::to_string(node_ports_[static_cast<size_t>(i)]);
  }
  std::unique_ptr<testing::Subprocess> StartNode(int port, const std::string& router) {
    std::vector<std::string> argv = {Binary(),    "serve",    "--model",
                                     model_,      "--listen", "127.0.0.1:" + std::to_string(port),
                                     "--threads", "1"};
    if (!router.empty()) {
      for (const char* arg : {"--router", router.c_str(), "--cluster-key", kClusterKey}) {
        argv.push_back(arg);
      }
    }
    return std::make_unique<testing::Subprocess>(argv);
  }
  httplib::Client RouterClient() const {
    httplib::Client client("127.0.0.1", router_port_);
    client.set_read_timeout(60, 0);
    return client;
  }
  std::string Metrics() const {
    auto r = RouterClient().Get("/metrics");
    return r ? r->body : "";
  }
  // Bounded wait until the router's metrics show `n` healthy nodes.
  bool WaitRouterHealthyNodes(int n) const {
    const Deadline deadline = Deadline::AfterMs(30000);
    while (!deadline.Passed()) {
      const std::string m = Metrics();
      int healthy = 0;
      for (size_t at = 0; (at = m.find("pdserve:router_node_healthy{", at)) != std::string::npos;
           ++at) {
        const size_t value = m.find("} ", at);
        if (value != std::string::npos && m[value + 2] == '1') ++healthy;
      }
      if (healthy == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  static json Completion(bool stream) {
    return {
        {"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}, {"stream", stream}};
  }

  std::string model_;
  std::vector<int> node_ports_;
  std::vector<std::unique_ptr<testing::Subprocess>> nodes_;
  int router_port_ = 0;
  std::unique_ptr<testing::Subprocess> router_;
};

TEST_F(RouterClusterTest, AnswersLikeANodeAndSpreadsRequests) {
  httplib::Client node("127.0.0.1", node_ports_[0]);
  node.set_read_timeout(60, 0);
  auto direct = node.Post("/v1/completions", Completion(false).dump(), "application/json");
  ASSERT_TRUE(direct);
  ASSERT_EQ(direct->status, 200) << direct->body;
  const std::string expected = json::parse(direct->body)["choices"][0]["text"];
  for (int i = 0; i < 2; ++i) {
    auto r = RouterClient().Post("/v1/completions", Completion(false).dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], expected);
  }
  // Sequential requests leave both nodes idle in between: ties alternate, so each got one.
  const std::string m = Metrics();
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(m.find("pdserve:router_node_requests_total{node=\"" + NodeUrl(i) + "\"} 1\n"),
              std::string::npos)
        << m;
  }
  // Streamed through the router: several events, the same text, then [DONE].
  auto r = RouterClient().Post("/v1/completions", Completion(true).dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  std::string text;
  int events = 0;
  for (size_t at = 0; (at = r->body.find("data: ", at)) != std::string::npos; ++at) {
    const size_t end = r->body.find("\n\n", at);
    const std::string payload = r->body.substr(at + 6, end - at - 6);
    if (payload == "[DONE]") break;
    ++events;
    json chunk = json::parse(payload, nullptr, false);
    if (chunk.contains("choices") && !chunk["choices"].empty()) {
      text += chunk["choices"][0].value("text", "");
    }
  }
  EXPECT_GT(events, 1);
  EXPECT_EQ(text, expected);
  EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos);
}

TEST_F(RouterClusterTest, KilledNodeIsDetectedAndAvoided) {
  nodes_[0]->Signal(SIGKILL);
  nodes_[0]->Wait(Deadline::AfterMs(10000));
  for (int i = 0; i < 4; ++i) {
    auto r = RouterClient().Post("/v1/completions", Completion(false).dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  EXPECT_TRUE(WaitRouterHealthyNodes(1));
  EXPECT_NE(Metrics().find("pdserve:router_node_healthy{node=\"" + NodeUrl(0) + "\"} 0"),
            std::string::npos);
}

TEST_F(RouterClusterTest, NodeRegistersItself) {
  const int port = testing::FreePort();
  auto extra = StartNode(port, "http://127.0.0.1:" + std::to_string(router_port_));
  ASSERT_TRUE(testing::WaitHealthy(port, Deadline::AfterMs(60000)));
  EXPECT_TRUE(WaitRouterHealthyNodes(3)) << Metrics();
  EXPECT_NE(Metrics().find("http://127.0.0.1:" + std::to_string(port)), std::string::npos);
}

}  // namespace
}  // namespace pdserve::router
