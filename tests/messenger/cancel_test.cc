// Cancel end to end (DESIGN.md §3.5, §6): a client that goes away while its prompt is being
// prefilled makes the decode node send Cancel; the prefill node stops, acknowledges once none of
// its writes can land, and both nodes free every page. Then a storm of requests whose clients
// leave at random moments (before, during and after the KV transfer): both page pools return to
// zero and a normal request still gets the same tokens as before the storm.
// Real `pdserve serve` processes.
#include <atomic>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "disagg_util.h"

namespace pdserve::testing {
namespace {

const std::vector<std::string> kFlags = {"--page-size", "4", "--threads", "1"};
// Prompts of the storm: up to several prefill chunks and pages (fewer under TSan, whose
// kernels run ~15x slower: disagg_util.h).
constexpr int kStormMaxPrompt = kThreadSanitizer ? 200 : 600;

struct Pair {
  std::unique_ptr<NodeProcess> prefill, decode;
};

Pair StartPair(const std::string& provider) {
  Pair p;
  auto p_args = PrefillArgs(provider, {"--max-batch-tokens", "16"});
  p_args.insert(p_args.end(), kFlags.begin(), kFlags.end());
  p.prefill = std::make_unique<NodeProcess>(TinyModelDir(), p_args);
  if (!p.prefill->ok()) return p;
  p.decode = std::make_unique<NodeProcess>(TinyModelDir(),
                                           DecodeArgs(provider, {p.prefill->port()}, kFlags));
  // A request sent before the handshake waits for a peer: it would be cancelled without ever
  // reaching the prefill node (seen on a loaded host).
  if (p.decode->ok()) WaitForMetric(p.decode->port(), "pdserve:messenger_peers_ready", 1, 10000);
  return p;
}

TEST(MessengerCancelTest, ClientGoneMidPrefillCancelsOnBothNodes) {
  const Pair c = StartPair("tcp");
  ASSERT_TRUE(c.prefill->ok()) << c.prefill->error();
  ASSERT_TRUE(c.decode->ok()) << c.decode->error();
  // Prefilled in chunks of 16 for ~0.2 s (a quiet fast host) to seconds: the client goes as
  // soon as the prefill node runs it (a fixed wait failed on a quiet host: the KV had landed).
  const std::vector<int32_t> prompt = RandomPrompt(kLongPromptTokens, 3);
  const int p = c.prefill->port();
  ASSERT_TRUE(StreamThenDrop(c.decode->port(), prompt, 8, 10000, [p] {
    return NodeMetric(p, "pdserve:messenger_requests_in_flight") == 1;
  }));
  EXPECT_EQ(WaitForMetric(c.decode->port(), "pdserve:messenger_requests_cancelled_total", 1, 10000),
            1)
      << "the decode node sent no Cancel";
  // Counted on P only if the job was still running when the Cancel came.
  EXPECT_EQ(
      WaitForMetric(c.prefill->port(), "pdserve:messenger_requests_cancelled_total", 1, 10000), 1)
      << "the prefill node did not stop a running job";
  ExpectNodeDrained(c.prefill->port());
  ExpectNodeDrained(c.decode->port());
  EXPECT_EQ(NodeMetric(c.decode->port(), "pdserve:messenger_slots_in_use"), 0);
  // Both still serve.
  const Completion after = Complete(c.decode->port(), RandomPrompt(9, 4), 3);
  EXPECT_EQ(after.status, 200) << after.body.dump();
}

class MessengerCancelStormTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MessengerCancelStormTest, RandomDisconnectsLeaveNothingBehind) {
  const Pair c = StartPair(GetParam());
  ASSERT_TRUE(c.prefill->ok()) << c.prefill->error();
  ASSERT_TRUE(c.decode->ok()) << c.decode->error();
  const std::vector<int32_t> reference_prompt = RandomPrompt(53, 99);
  const Completion before = Complete(c.decode->port(), reference_prompt, 8);
  ASSERT_EQ(before.status, 200) << before.body.dump();

  constexpr int kRequests = 150;
  constexpr int kClients = 12;
  std::atomic<int> next{0}, completed{0}, bad{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < kClients; ++t) {
    clients.emplace_back([&] {
      for (int i = next++; i < kRequests; i = next++) {
        std::mt19937 rng(1000 + i);
        const int length = std::uniform_int_distribution<int>(1, kStormMaxPrompt)(rng);
        const std::vector<int32_t> prompt = RandomPrompt(length, 2000 + i);
        if (rng() % 4 == 0) {  // a client that stays
          const Completion got = Complete(c.decode->port(), prompt, 4);
          if (got.status == 200 && got.token_ids.size() == 4) {
            ++completed;
          } else {
            ++bad;
          }
        } else {
          const int hold_ms = std::uniform_int_distribution<int>(0, 600)(rng);
          if (!StreamThenDrop(c.decode->port(), prompt, 64, hold_ms)) ++bad;
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(bad.load(), 0) << "requests of clients that stayed failed";
  EXPECT_GT(completed.load(), 0);
  ExpectNodeDrained(c.prefill->port(), 20000);
  ExpectNodeDrained(c.decode->port(), 20000);
  EXPECT_EQ(NodeMetric(c.decode->port(), "pdserve:messenger_slots_in_use"), 0);
  // The storm cancelled transfers in flight on both sides, not only finished requests.
  EXPECT_GT(NodeMetric(c.decode->port(), "pdserve:messenger_requests_cancelled_total"), 0);
  EXPECT_GT(NodeMetric(c.prefill->port(), "pdserve:messenger_requests_cancelled_total"), 0);
  const Completion after = Complete(c.decode->port(), reference_prompt, 8);
  ASSERT_EQ(after.status, 200) << after.body.dump();
  EXPECT_EQ(after.token_ids, before.token_ids);
  ExpectNodeDrained(c.prefill->port());
  ExpectNodeDrained(c.decode->port());
}

INSTANTIATE_TEST_SUITE_P(Providers, MessengerCancelStormTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pdserve::testing
