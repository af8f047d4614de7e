// A prefill node hung (SIGSTOP) with a prompt to prefill, removed by the decode node, then
// resumed (SIGCONT) once the decode node has reused that prompt's pages for another request: the
// writes it then streams must not land there (DESIGN.md §3.5). The decode node gives each
// prefill peer a view of its cache and a registration of its own and, when it removes the
// peer, revokes the view and closes the registration, so such writes fail on arrival. Before
// the per-peer registration the other request's tokens came out wrong over tcp and shm alike.
// (The rest of a write already arriving when the peer is removed is fabric's
// RevokedViewTest.) Real `pdserve serve` processes.
#include <signal.h>

#include <future>

#include <gtest/gtest.h>

#include "disagg_util.h"

namespace pdserve::testing {
namespace {

class MessengerResumedPeerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MessengerResumedPeerTest, ResumedHungPrefillCannotWriteIntoReusedPages) {
  const std::string provider = GetParam();
  const std::vector<std::string> flags = {"--page-size",    "4",  "--threads", "1",
                                          "--heartbeat-ms", "100"};
  // P1 prefills in chunks of 2 (slow), and with a peer timeout of its own far longer than the
  // decode node's it keeps streaming after it resumes, as a node that noticed nothing would.
  auto p1_args = PrefillArgs(provider, {"--max-batch-tokens", "2", "--peer-timeout-ms", "60000"});
  p1_args.insert(p1_args.end(), flags.begin(), flags.end());
  auto p2_args = PrefillArgs(provider, {"--max-batch-tokens", "16", "--peer-timeout-ms", "1500"});
  p2_args.insert(p2_args.end(), flags.begin(), flags.end());
  auto p1 = std::make_unique<NodeProcess>(TinyModelDir(), p1_args);
  auto p2 = std::make_unique<NodeProcess>(TinyModelDir(), p2_args);
  ASSERT_TRUE(p1->ok()) << p1->error();
  ASSERT_TRUE(p2->ok()) << p2->error();
  // 1 MiB of cache is 128 pages of 4 tokens (2 KiB per token on the tiny model): request B's
  // pages can only be the ones request A had.
  auto d_flags = flags;
  d_flags.insert(d_flags.end(), {"--kv-cache-mb", "1", "--peer-timeout-ms", "1500",
                                 "--prefill-timeout-ms", "60000"});
  auto decode = std::make_unique<NodeProcess>(
      TinyModelDir(), DecodeArgs(provider, {p1->port(), p2->port()}, d_flags));
  ASSERT_TRUE(decode->ok()) << decode->error();
  ASSERT_EQ(WaitForMetric(decode->port(), "pdserve:messenger_peers_ready", 2, 20000), 2);
  const int d = decode->port();
  const std::vector<int32_t> a = RandomPrompt(400, 31), b = RandomPrompt(400, 32);
  const httplib::Headers via_p1 = {{"X-Prefill-Peer", PeerName(*p1)}};
  const httplib::Headers via_p2 = {{"X-Prefill-Peer", PeerName(*p2)}};
  const Completion want = Complete(d, b, 100, via_p2);
  ASSERT_EQ(want.status, 200) << want.body.dump();

  // A is pinned to P1, so it is not retried: it fails when P1 is removed, and its pages are
  // released. P1 is stopped first: the tiny model prefills A in tens of milliseconds, too fast
  // to be stopped reliably mid-way on a loaded machine, and stopped first P1 still holds A's
  // PrefillRequest, which it prefills and streams when it resumes.
  ASSERT_EQ(kill(p1->pid(), SIGSTOP), 0);
  const Completion lost = Complete(d, a, 4, via_p1);
  ASSERT_NE(lost.status, 200) << "P1 was stopped: nothing could prefill A";
  EXPECT_NE(lost.body.dump().find("lost"), std::string::npos) << lost.body.dump();
  ExpectNodeDrained(d);

  // B decodes in the pages A had when P1 resumes and streams the rest of A. On a fast run B
  // may finish before it is seen running (the tiny model decodes 100 tokens in tens of ms), so
  // a second B follows the resume at once: P1's late writes meet one of them in A's pages.
  auto b_pending = std::async(std::launch::async, [&] { return Complete(d, b, 100, via_p2); });
  WaitForMetric(d, "pdserve:num_requests_running", 1, 3000);  // may be missed: see above
  ASSERT_EQ(kill(p1->pid(), SIGCONT), 0);
  const Completion after_resume = Complete(d, b, 100, via_p2);
  for (const Completion& got : {b_pending.get(), after_resume}) {
    ASSERT_EQ(got.status, 200) << got.body.dump();
    EXPECT_EQ(got.token_ids, want.token_ids)
        << "writes of the removed prefill node landed in pages the decode node reused";
  }
  ExpectNodeDrained(d);
  ExpectNodeDrained(p2->port());
}

INSTANTIATE_TEST_SUITE_P(Providers, MessengerResumedPeerTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pdserve::testing
