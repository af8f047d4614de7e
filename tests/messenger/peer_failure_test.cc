// Peers that die, hang or come back (DESIGN.md §3.5, §6): a prefill node killed (SIGKILL) or
// hung (SIGSTOP) while a prompt's KV streams makes the decode node retry that request on a
// second prefill node, prefill it itself, or (--local-prefill-fallback off) fail it with an
// error naming the peer — and later ones at once; a prefill node restarted at the
// same address is handshaken again and used; a decode node killed mid-transfer leaves the
// prefill node with nothing held, ready for a new decode node. Every surviving node ends with
// no page in use. Real `pdserve serve` processes over tcp (a killed shm peer can hang its
// survivor inside libfabric: docs/fabric.md).
#include <signal.h>

#include <future>

#include <gtest/gtest.h>

#include "disagg_util.h"

namespace pdserve::testing {
namespace {

constexpr int kLongPrompt = kLongPromptTokens;  // prefill steps of 16 tokens: seconds
// kPrefillTimeoutMs (disagg_util.h) bounds a hang; only the test that waits for a request to
// fail for want of a peer uses a short one.

// Without prefix caching (here and on the decode nodes): these tests send a prompt again and
// fault the prefill node while it computes it; a cache hit would leave nothing to compute (or
// nothing to ask P), and the request ended before the fault (seen in CI: "WaitUntilPrefilling"
// false, the repeat served in 21 ms).
std::unique_ptr<NodeProcess> StartPrefill(const std::string& listen = "127.0.0.1:0") {
  auto args = PrefillArgs("tcp", {"--max-batch-tokens", "16", "--no-prefix-caching"});
  args.insert(args.end(), kQuickPeerLossFlags.begin(), kQuickPeerLossFlags.end());
  return std::make_unique<NodeProcess>(TinyModelDir(), args, listen);
}

// A decode node whose prefill peers are all ready: a request's deadline starts when its pages
// are allocated, and under TSan the handshake alone took over a second of a 4 s deadline.
std::unique_ptr<NodeProcess> StartDecode(const std::vector<int>& prefill_ports,
                                         const std::vector<std::string>& extra = {}) {
  auto decode = std::make_unique<NodeProcess>(
      TinyModelDir(), DecodeArgs("tcp", prefill_ports, [&extra] {
        auto a = kQuickPeerLossFlags;
        a.insert(a.end(), {"--prefill-timeout-ms", std::to_string(kPrefillTimeoutMs),
                           "--no-prefix-caching"});
        a.insert(a.end(), extra.begin(), extra.end());
        return a;
      }()));
  const double peers = static_cast<double>(prefill_ports.size());
  if (decode->ok()) {
    EXPECT_EQ(WaitForMetric(decode->port(), "pdserve:messenger_peers_ready", peers, 20000), peers);
  }
  return decode;
}

// Waits until the prefill node on `port` runs a prefill request (deadline 10 s).
bool WaitUntilPrefilling(int port) {
  return WaitForMetric(port, "pdserve:messenger_requests_in_flight", 1, 10000) == 1;
}

// Without local fallback: the request whose prefill node dies fails naming the peer, and with
// no prefill node left a request is refused at once (503, Retry-After) — never after the
// prefill deadline — naming how the peer was lost. /health says degraded, /ready 503.
TEST(MessengerPeerFailureTest, KilledPrefillFailsTheRequestAndLaterOnesAtOnceWithoutFallback) {
  auto prefill = StartPrefill();
  ASSERT_TRUE(prefill->ok()) << prefill->error();
  const int prefill_port = prefill->port();
  auto decode = StartDecode({prefill_port}, {"--local-prefill-fallback", "off"});
  ASSERT_TRUE(decode->ok()) << decode->error();
  EXPECT_EQ(GetText(decode->port(), "/ready"), std::make_pair(200, std::string("ok\n")));
  const std::vector<int32_t> prompt = RandomPrompt(kLongPrompt, 21);
  auto pending =
      std::async(std::launch::async, [&] { return Complete(decode->port(), prompt, 4); });
  ASSERT_TRUE(WaitUntilPrefilling(prefill_port));
  ASSERT_EQ(kill(prefill->pid(), SIGKILL), 0);
  const Completion failed = pending.get();
  EXPECT_EQ(failed.status, 503) << failed.body.dump();
  EXPECT_NE(
      ErrorMessage(failed).find("prefill peer 127.0.0.1:" + std::to_string(prefill_port) + " lost"),
      std::string::npos)
      << ErrorMessage(failed);
  prefill.reset();
  ExpectNodeDrained(decode->port());
  EXPECT_EQ(WaitForMetric(decode->port(), "pdserve:messenger_peers_ready", 0, 10000), 0);
  // The decode node keeps serving: a prompt it would send to a prefill node is refused at once.
  const Completion no_peer = Complete(decode->port(), RandomPrompt(9, 1), 2);
  EXPECT_EQ(no_peer.status, 503) << no_peer.body.dump();
  EXPECT_FALSE(no_peer.retry_after.empty());
  EXPECT_LT(no_peer.seconds, 1.0);
  // The reason names the peer and how it was found dead: a missed heartbeat, a control message
  // that could not be delivered before its deadline, or a send the transport failed at once
  // (tcp seeing the closed connection: "send to peer 1 failed: ... Broken pipe").
  const std::string message = ErrorMessage(no_peer);
  EXPECT_NE(message.find("no usable prefill peer"), std::string::npos) << message;
  EXPECT_NE(message.find("127.0.0.1:" + std::to_string(prefill_port)), std::string::npos)
      << message;
  EXPECT_TRUE(message.find("no heartbeat answer") != std::string::npos ||
              message.find("did not complete before its deadline") != std::string::npos ||
              message.find("send to peer") != std::string::npos)
      << message;
  const auto [health_status, health] = GetText(decode->port(), "/health");
  EXPECT_EQ(health_status, 200);
  EXPECT_EQ(health.rfind("degraded: no usable prefill peer", 0), 0u) << health;
  EXPECT_EQ(GetText(decode->port(), "/ready").first, 503);
  ExpectNodeDrained(decode->port());
}

// With local fallback (the default): the request whose prefill node dies mid-transfer is
// prefilled by the decode node once the peer is removed, and so are later ones, at once.
TEST(MessengerPeerFailureTest, KilledPrefillsRequestsArePrefilledByTheDecodeNode) {
  auto prefill = StartPrefill();
  ASSERT_TRUE(prefill->ok()) << prefill->error();
  auto decode = StartDecode({prefill->port()});
  ASSERT_TRUE(decode->ok()) << decode->error();
  const std::vector<int32_t> prompt = RandomPrompt(kLongPrompt, 21);
  const Completion want = Complete(decode->port(), prompt, 4);
  ASSERT_EQ(want.status, 200) << want.body.dump();
  auto pending =
      std::async(std::launch::async, [&] { return Complete(decode->port(), prompt, 4); });
  ASSERT_TRUE(WaitUntilPrefilling(prefill->port()));
  ASSERT_EQ(kill(prefill->pid(), SIGKILL), 0);
  const Completion got = pending.get();
  ASSERT_EQ(got.status, 200) << got.body.dump();
  EXPECT_EQ(got.token_ids, want.token_ids);
  prefill.reset();
  const std::vector<int32_t> later_prompt = RandomPrompt(37, 3);
  const Completion later = Complete(decode->port(), later_prompt, 3);
  ASSERT_EQ(later.status, 200) << later.body.dump();
  EXPECT_EQ(later.token_ids.size(), 3u);
  EXPECT_EQ(NodeMetric(decode->port(), "pdserve:decode_fallback_prefills_total"), 2);
  EXPECT_EQ(GetText(decode->port(), "/ready").first, 503);
  ExpectNodeDrained(decode->port());
}

// A prefill node restarted at the same address (new fabric address, new incarnation) is
// handshaken from scratch and used again. `mid_transfer`: killed while streaming a prompt.
void ExpectRestartedPrefillUsed(bool mid_transfer) {
  auto prefill = StartPrefill();
  ASSERT_TRUE(prefill->ok()) << prefill->error();
  const int prefill_port = prefill->port();
  auto decode = StartDecode({prefill_port});
  ASSERT_TRUE(decode->ok()) << decode->error();
  const std::vector<int32_t> prompt = RandomPrompt(mid_transfer ? kLongPrompt : 77, 24);
  const Completion want = Complete(decode->port(), prompt, 4);
  ASSERT_EQ(want.status, 200) << want.body.dump();
  std::future<Completion> pending;
  if (mid_transfer) {
    pending = std::async(std::launch::async, [&] { return Complete(decode->port(), prompt, 4); });
    ASSERT_TRUE(WaitUntilPrefilling(prefill_port));
  }
  ASSERT_EQ(kill(prefill->pid(), SIGKILL), 0);
  if (mid_transfer) {  // prefilled by the decode node once the peer is removed
    const Completion got = pending.get();
    ASSERT_EQ(got.status, 200) << got.body.dump();
    EXPECT_EQ(got.token_ids, want.token_ids);
  }
  prefill.reset();
  EXPECT_EQ(WaitForMetric(decode->port(), "pdserve:messenger_peers_ready", 0, 10000), 0);
  prefill = StartPrefill("127.0.0.1:" + std::to_string(prefill_port));
  ASSERT_TRUE(prefill->ok()) << prefill->error();
  EXPECT_EQ(WaitForMetric(decode->port(), "pdserve:messenger_peers_ready", 1, 20000), 1);
  const Completion again = Complete(decode->port(), prompt, 4);
  ASSERT_EQ(again.status, 200) << again.body.dump();
  EXPECT_EQ(again.token_ids, want.token_ids);
  ExpectNodeDrained(decode->port());
  ExpectNodeDrained(prefill->port());
}

// Both variants once failed: the restarted node's KV writes never counted on the decode node,
// because the fabric attributed their immediates (FI_SOURCE) to the removed predecessor's
// address-vector entry and dropped them. Such arrivals now count towards a waiting expectation.
TEST(MessengerPeerFailureTest, RestartedPrefillIsHandshakenAndUsedAgain) {
  ExpectRestartedPrefillUsed(/*mid_transfer=*/false);
}

TEST(MessengerPeerFailureTest, PrefillKilledMidTransferThenRestartedIsUsedAgain) {
  ExpectRestartedPrefillUsed(/*mid_transfer=*/true);
}

// A long request goes to one of two prefill nodes; `fault` kills or stops that one; the decode
// node moves the request to the other and returns the same tokens.
void ExpectRetriedOnSecondPrefill(int fault) {
  auto p1 = StartPrefill();
  auto p2 = StartPrefill();
  ASSERT_TRUE(p1->ok()) << p1->error();
  ASSERT_TRUE(p2->ok()) << p2->error();
  auto decode = StartDecode({p1->port(), p2->port()});
  ASSERT_TRUE(decode->ok()) << decode->error();
  const std::vector<int32_t> prompt = RandomPrompt(kLongPrompt, 22);
  const Completion want = Complete(decode->port(), prompt, 4);
  ASSERT_EQ(want.status, 200) << want.body.dump();

  auto pending =
      std::async(std::launch::async, [&] { return Complete(decode->port(), prompt, 4); });
  // Whichever prefill node took it.
  NodeProcess* victim = nullptr;
  NodeProcess* survivor = nullptr;
  for (int i = 0; i < 200 && victim == nullptr; ++i) {
    if (NodeMetric(p1->port(), "pdserve:messenger_requests_in_flight") == 1) {
      victim = p1.get(), survivor = p2.get();
    } else if (NodeMetric(p2->port(), "pdserve:messenger_requests_in_flight") == 1) {
      victim = p2.get(), survivor = p1.get();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ASSERT_NE(victim, nullptr) << "no prefill node took the request";
  ASSERT_EQ(kill(victim->pid(), fault), 0);
  const Completion got = pending.get();
  ASSERT_EQ(got.status, 200) << got.body.dump();
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_EQ(NodeMetric(decode->port(), "pdserve:messenger_requests_retried_total"), 1);
  ExpectNodeDrained(decode->port());
  ExpectNodeDrained(survivor->port());
  if (fault == SIGSTOP) kill(victim->pid(), SIGKILL);  // a stopped process cannot take SIGTERM
}

TEST(MessengerPeerFailureTest, KilledPrefillIsRetriedOnTheOther) {
  ExpectRetriedOnSecondPrefill(SIGKILL);
}

TEST(MessengerPeerFailureTest, HungPrefillIsRemovedByHeartbeatAndRetriedOnTheOther) {
  ExpectRetriedOnSecondPrefill(SIGSTOP);
}

TEST(MessengerPeerFailureTest, KilledDecodeLeavesThePrefillNodeClean) {
  auto prefill = StartPrefill();
  ASSERT_TRUE(prefill->ok()) << prefill->error();
  auto decode = StartDecode({prefill->port()});
  ASSERT_TRUE(decode->ok()) << decode->error();
  const std::vector<int32_t> prompt = RandomPrompt(kLongPrompt, 23);
  const Completion want = Complete(decode->port(), prompt, 4);
  ASSERT_EQ(want.status, 200) << want.body.dump();
  auto pending =
      std::async(std::launch::async, [&] { return Complete(decode->port(), prompt, 4); });
  ASSERT_TRUE(WaitUntilPrefilling(prefill->port()));
  ASSERT_EQ(kill(decode->pid(), SIGKILL), 0);
  EXPECT_NE(pending.get().status, 200);
  decode.reset();
  // P notices (connection errors or missed heartbeats), stops the job and frees its pages.
  ExpectNodeDrained(prefill->port());
  EXPECT_EQ(WaitForMetric(prefill->port(), "pdserve:messenger_peers_ready", 0, 10000), 0);
  // And serves a new decode node.
  decode = StartDecode({prefill->port()});
  ASSERT_TRUE(decode->ok()) << decode->error();
  const Completion got = Complete(decode->port(), prompt, 4);
  ASSERT_EQ(got.status, 200) << got.body.dump();
  EXPECT_EQ(got.token_ids, want.token_ids);
  ExpectNodeDrained(prefill->port());
  ExpectNodeDrained(decode->port());
}

}  // namespace
}  // namespace pdserve::testing
