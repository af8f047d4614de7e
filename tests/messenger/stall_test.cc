// Peers that stall and come back (DESIGN.md §3.5, §6): a prefill node or a decode node paused
// (SIGSTOP) past the peer timeout is removed by the other side — for safety — and, once it
// answers again (SIGCONT), handshaken as a new epoch of the same process and used again; while
// no prefill peer is usable the decode node says so (/health "degraded", /ready 503) and
// decides every request at once: prefilled here, or refused with 503 and Retry-After. Tokens
// equal a colocated node's; both page pools end at zero. Real `pdserve serve` processes over tcp.
#include <signal.h>

#include <chrono>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "disagg_util.h"
#include "testing/cluster_processes.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

using std::chrono::steady_clock;

// How long a resumed peer may take to be used again. D asks a removed peer's HTTP API again
// after at most a second (messenger::kMaxReconnectBackoff; a paused node's answer is usually
// already awaited) and the handshake is four messages: a bound with room for a loaded host.
constexpr auto kReadmissionBound = std::chrono::seconds(5);

double Seconds(steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Cluster {
  std::unique_ptr<NodeProcess> prefill, decode, colocated;
};

// A prefill node, a decode node pointed at it (every prompt remote unless no prefill peer is
// usable) with `decode_extra`, and a colocated reference; the decode node's peer is ready.
Cluster StartCluster(const std::vector<std::string>& decode_extra = {}) {
  Cluster c;
  auto p_args = PrefillArgs("tcp", {"--max-batch-tokens", "16"});
  p_args.insert(p_args.end(), kQuickPeerLossFlags.begin(), kQuickPeerLossFlags.end());
  c.prefill = std::make_unique<NodeProcess>(TinyModelDir(), p_args);
  if (!c.prefill->ok()) return c;
  auto d_args = kQuickPeerLossFlags;
  d_args.insert(d_args.end(), {"--prefill-timeout-ms", std::to_string(kPrefillTimeoutMs)});
  d_args.insert(d_args.end(), decode_extra.begin(), decode_extra.end());
  c.decode =
      std::make_unique<NodeProcess>(TinyModelDir(), DecodeArgs("tcp", {c.prefill->port()}, d_args));
  c.colocated = std::make_unique<NodeProcess>(
      TinyModelDir(), std::vector<std::string>{"--page-size", "4", "--threads", "1"});
  if (c.decode->ok()) {
    EXPECT_EQ(WaitForMetric(c.decode->port(), "pdserve:messenger_peers_ready", 1, 20000), 1);
  }
  return c;
}

#define ASSERT_CLUSTER_OK(c)                              \
  ASSERT_TRUE((c).prefill->ok()) << (c).prefill->error(); \
  ASSERT_TRUE((c).decode->ok()) << (c).decode->error();   \
  ASSERT_TRUE((c).colocated->ok()) << (c).colocated->error()

// A request through the decode node that its prefill peer prefills: the colocated tokens, and
// the remote-prefill counter moves by one.
void ExpectServedRemotely(const Cluster& c, uint32_t seed) {
  const std::vector<int32_t> prompt = RandomPrompt(37, seed);
  const Completion want = Complete(c.colocated->port(), prompt, 6);
  ASSERT_EQ(want.status, 200) << want.body.dump();
  const double remote_before = NodeMetric(c.decode->port(), "pdserve:decode_remote_prefills_total");
  const double fallback_before =
      NodeMetric(c.decode->port(), "pdserve:decode_fallback_prefills_total");
  const Completion got = Complete(c.decode->port(), prompt, 6);
  ASSERT_EQ(got.status, 200) << got.body.dump();
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_EQ(NodeMetric(c.decode->port(), "pdserve:decode_remote_prefills_total"),
            remote_before + 1);
  EXPECT_EQ(NodeMetric(c.decode->port(), "pdserve:decode_fallback_prefills_total"),
            fallback_before);
}

// The router's /health "status" once it is `want` (polled up to 10 s); the last seen otherwise.
std::string WaitForRouterStatus(int router_port, const std::string& want) {
  std::string seen;
  for (const Deadline d = Deadline::AfterMs(10000); !d.Passed();) {
    const nlohmann::json health = nlohmann::json::parse(GetText(router_port, "/health").second,
                                                        nullptr, /*allow_exceptions=*/false);
    seen = health.is_object() ? health.value("status", "") : "";
    if (seen == want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return seen;
}

// Polls until the decode node has `n` ready prefill peers; the time it took.
steady_clock::duration WaitForReadyPeers(int port, int n) {
  const auto start = steady_clock::now();
  EXPECT_EQ(WaitForMetric(port, "pdserve:messenger_peers_ready", n, 30000), n);
  return steady_clock::now() - start;
}

TEST(MessengerStallTest, PausedPrefillIsTakenBackAndUsedAgain) {
  Cluster c = StartCluster();
  ASSERT_CLUSTER_OK(c);
  const int d = c.decode->port();
  ExpectServedRemotely(c, 1);
  EXPECT_EQ(GetText(d, "/health"), std::make_pair(200, std::string("ok\n")));
  const int router_port = FreePort();
  Subprocess router({BinaryPath("src/cli/pdserve"), "router", "--listen",
                     "127.0.0.1:" + std::to_string(router_port), "--node",
                     "http://127.0.0.1:" + std::to_string(d), "--health-interval-ms", "100"});
  ASSERT_TRUE(WaitHealthy(router_port, Deadline::AfterMs(20000)));
  EXPECT_EQ(WaitForRouterStatus(router_port, "ok"), "ok");

  ASSERT_EQ(kill(c.prefill->pid(), SIGSTOP), 0);
  WaitForReadyPeers(d, 0);  // removed after 1.5 s without a heartbeat answer
  // Degraded, and says why; a prompt is prefilled here at once instead of waiting.
  const auto [health_status, health] = GetText(d, "/health");
  EXPECT_EQ(health_status, 200);
  EXPECT_EQ(health.rfind("degraded: no usable prefill peer", 0), 0u) << health;
  EXPECT_NE(health.find("no heartbeat answer"), std::string::npos) << health;
  EXPECT_EQ(GetText(d, "/ready").first, 503);
  // The router shows it, and still sends it requests (the only node).
  EXPECT_EQ(WaitForRouterStatus(router_port, "degraded"), "degraded");
  EXPECT_NE(GetText(router_port, "/metrics")
                .second.find("pdserve:router_node_degraded{node=\"http"
                             "://127.0.0.1:" +
                             std::to_string(d) + "\"} 1"),
            std::string::npos);
  const std::vector<int32_t> prompt = RandomPrompt(37, 2);
  const Completion want = Complete(c.colocated->port(), prompt, 6);
  const Completion local = Complete(d, prompt, 6);
  ASSERT_EQ(local.status, 200) << local.body.dump();
  EXPECT_EQ(local.token_ids, want.token_ids);
  EXPECT_LT(local.seconds, kPrefillTimeoutMs / 1000.0 / 2);
  EXPECT_EQ(NodeMetric(d, "pdserve:decode_fallback_prefills_total"), 1);

  ASSERT_EQ(kill(c.prefill->pid(), SIGCONT), 0);
  const auto readmitted_after = WaitForReadyPeers(d, 1);
  EXPECT_LT(readmitted_after, kReadmissionBound);
  std::cout << "[          ] resumed prefill node ready again on the decode node after "
            << Seconds(readmitted_after) << " s\n";
  EXPECT_EQ(NodeMetric(d, "pdserve:messenger_peer_readmissions_total"), 1);
  // P removed D too (no heartbeat while it stood still, or D's new epoch) and took it back.
  EXPECT_EQ(WaitForMetric(c.prefill->port(), "pdserve:messenger_peer_readmissions_total", 1, 10000),
            1);
  const nlohmann::json peers = GetJson(d, "/internal/messenger/peers");
  ASSERT_TRUE(peers.is_array() && peers.size() == 1) << peers.dump();
  EXPECT_EQ(peers[0].value("epoch", 0), 2) << peers.dump();
  EXPECT_EQ(GetText(d, "/ready"), std::make_pair(200, std::string("ok\n")));
  EXPECT_EQ(WaitForRouterStatus(router_port, "ok"), "ok");
  ExpectServedRemotely(c, 3);
  ExpectNodeDrained(d);
  ExpectNodeDrained(c.prefill->port());
}

TEST(MessengerStallTest, PausedDecodeIsTakenBackByItsPrefillPeer) {
  Cluster c = StartCluster();
  ASSERT_CLUSTER_OK(c);
  const int d = c.decode->port(), p = c.prefill->port();
  ExpectServedRemotely(c, 4);

  ASSERT_EQ(kill(c.decode->pid(), SIGSTOP), 0);
  // P removes the silent decode node after its peer timeout.
  EXPECT_EQ(WaitForMetric(p, "pdserve:messenger_peers_ready", 0, 20000), 0);
  ASSERT_EQ(kill(c.decode->pid(), SIGCONT), 0);
  const auto start = steady_clock::now();
  // D sees that it stood still past the peer timeout and begins a new epoch with P at once.
  EXPECT_EQ(WaitForMetric(p, "pdserve:messenger_peers_ready", 1, 30000), 1);
  WaitForReadyPeers(d, 1);
  const auto readmitted_after = steady_clock::now() - start;
  EXPECT_LT(readmitted_after, kReadmissionBound);
  std::cout << "[          ] resumed decode node taken back by the prefill node after "
            << Seconds(readmitted_after) << " s\n";
  EXPECT_EQ(NodeMetric(p, "pdserve:messenger_peer_readmissions_total"), 1);
  ExpectServedRemotely(c, 5);
  ExpectNodeDrained(d);
  ExpectNodeDrained(p);
}

// Without local fallback: a request whose prefill node is removed while it waits on it ends
// within a second of the removal (not at its 60 s deadline), and a request with no usable
// peer is refused at once with 503 and Retry-After. The resumed peer then serves again.
TEST(MessengerStallTest, RequestsEndWithinASecondOfTheirPeersRemovalWithoutFallback) {
  Cluster c = StartCluster({"--local-prefill-fallback", "off"});
  ASSERT_CLUSTER_OK(c);
  const int d = c.decode->port(), p = c.prefill->port();
  const std::vector<int32_t> prompt = RandomPrompt(kLongPromptTokens, 6);
  auto pending = std::async(std::launch::async, [&] {
    Completion got = Complete(d, prompt, 4);
    return std::make_pair(got, steady_clock::now());
  });
  ASSERT_EQ(WaitForMetric(p, "pdserve:messenger_requests_in_flight", 1, 10000), 1);
  ASSERT_EQ(kill(c.prefill->pid(), SIGSTOP), 0);
  WaitForReadyPeers(d, 0);
  const auto removed_at = steady_clock::now();  // within one 50 ms poll of the removal
  const auto [lost, ended_at] = pending.get();
  EXPECT_EQ(lost.status, 503) << lost.body.dump();
  EXPECT_NE(ErrorMessage(lost).find("lost"), std::string::npos) << ErrorMessage(lost);
  EXPECT_LT(Seconds(ended_at - removed_at), 1.0);
  ExpectNodeDrained(d);

  const Completion refused = Complete(d, RandomPrompt(37, 7), 2);
  EXPECT_EQ(refused.status, 503) << refused.body.dump();
  EXPECT_FALSE(refused.retry_after.empty());
  EXPECT_LT(refused.seconds, 1.0);
  EXPECT_NE(ErrorMessage(refused).find("no usable prefill peer"), std::string::npos)
      << ErrorMessage(refused);
  EXPECT_EQ(NodeMetric(d, "pdserve:decode_fallback_prefills_total"), 0);

  ASSERT_EQ(kill(c.prefill->pid(), SIGCONT), 0);
  EXPECT_LT(WaitForReadyPeers(d, 1), kReadmissionBound);
  const Completion want = Complete(c.colocated->port(), prompt, 4);
  const Completion again = Complete(d, prompt, 4);
  ASSERT_EQ(again.status, 200) << again.body.dump();
  EXPECT_EQ(again.token_ids, want.token_ids);
  ExpectNodeDrained(d);
  ExpectNodeDrained(p);
}

}  // namespace
}  // namespace pdserve::testing
