// Prefix caching across a disaggregated pair (docs/messenger.md, "Partial transfers"): the
// decode node looks its own cache up first and asks the prefill node only for the pages after
// its hit; the prefill node computes what its own cache lacks and writes exactly those pages.
// Checked on real `pdserve serve` processes over tcp, with hits ending at every offset within
// a page, on either side or both, against a colocated node without caching: the tokens, P's
// bytes sent, D's bytes not transferred and both pools.
#include <future>

#include <gtest/gtest.h>

#include "disagg_util.h"
#include "model/config.h"

namespace pdserve::testing {
namespace {

const std::vector<std::string> kPartialFlags = {"--page-size", std::to_string(kPage), "--kv-dtype",
                                                "bf16",        "--max-batch-tokens",  "8"};
constexpr int kAnswerLength = 6;

// Bytes of one page's KV on a TP-1 node: every layer, K and V of every KV head, BF16.
int64_t TinyPageBytes() {
  Result<ModelConfig> c = ModelConfig::Load(TinyModelDir());
  if (!c.ok()) return -1;
  return int64_t{c->num_layers} * 2 * c->num_kv_heads * kPage * c->head_dim * 2;
}

int64_t PagesOf(int64_t tokens) { return (tokens + kPage - 1) / kPage; }

std::vector<int32_t> Joined(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class PartialTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    page_bytes_ = TinyPageBytes();
    ASSERT_GT(page_bytes_, 0);
    colocated_ =
        std::make_unique<NodeProcess>(TinyModelDir(), With(kPartialFlags, {"--no-prefix-caching"}));
    ASSERT_TRUE(colocated_->ok()) << colocated_->error();
  }

  // The colocated node's greedy answer, which every disaggregated answer must equal.
  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt) {
    const Completion c = Complete(colocated_->port(), prompt, kAnswerLength);
    EXPECT_EQ(c.status, 200) << c.body.dump();
    return c.token_ids;
  }

  int64_t page_bytes_ = 0;
  std::unique_ptr<NodeProcess> colocated_;
};

// One pair, each prompt sent twice: the second time D holds the full pages of [0, n-1) it
// received the first time (and decoded past), so P is asked only for the last, partly filled
// page — or for nothing, when n-1 is a whole number of pages. Prompt lengths 22..25 put the
// end of D's hit at every offset from the end of [0, n-1).
TEST_F(PartialTransferTest, RepeatedPromptSendsOnlyThePagesTheDecodeNodeLacks) {
  NodeProcess prefill(TinyModelDir(), With(PrefillArgs("tcp"), kPartialFlags));
  ASSERT_TRUE(prefill.ok()) << prefill.error();
  NodeProcess decode(TinyModelDir(), DecodeArgs("tcp", {prefill.port()}, kPartialFlags));
  ASSERT_TRUE(decode.ok()) << decode.error();
  int64_t sent = 0, not_sent = 0, queried = 0;
  for (int length : {22, 23, 24, 25}) {
    const std::vector<int32_t> prompt = RandomPrompt(length, 300 + length);
    const std::vector<int32_t> want = Reference(prompt);
    for (int round = 0; round < 2; ++round) {
      const Completion got = Complete(decode.port(), prompt, kAnswerLength);
      ASSERT_EQ(got.status, 200) << got.body.dump();
      EXPECT_EQ(got.token_ids, want) << "length " << length << " round " << round;
      const int64_t cached = round == 0 ? 0 : (length - 1) / kPage;
      sent += (PagesOf(length - 1) - cached) * page_bytes_;
      not_sent += cached * page_bytes_;
      queried += PagesOf(length - 1) > cached ? length - 1 : 0;
      EXPECT_EQ(WaitForMetric(prefill.port(), "pdserve:messenger_kv_bytes_sent_total",
                              static_cast<double>(sent), 5000),
                sent)
          << "length " << length << " round " << round;
      EXPECT_EQ(NodeMetric(decode.port(), "pdserve:messenger_kv_bytes_received_total"), sent);
      EXPECT_EQ(NodeMetric(decode.port(), "pdserve:messenger_kv_bytes_not_transferred_total"),
                not_sent);
    }
  }
  // Length 25: [0, 24) is 6 whole pages, all cached the second time: P never saw it (it looks
  // up every prompt it is sent).
  EXPECT_EQ(NodeMetric(prefill.port(), "vllm:prefix_cache_queries_total"), queried);
  EXPECT_EQ(queried, 2 * (21 + 22 + 23) + 24);
  ExpectNodeDrained(prefill.port());
  ExpectNodeDrained(decode.port());
  EXPECT_GT(NodeMetric(decode.port(), "pdserve:kv_pages_evictable"), 0);
}

// Hits that differ between the sides, at every offset within a page: a prompt A of L tokens
// (L = 16..19) goes first through decode node D1 and prefill node P1, so both cache it; then
// B = A + 5 new tokens goes
//  - through D1 to P2 (D's hit, floor(L/4) pages, is P's: P2 computes all of B and writes
//    only the pages after D1's hit), and
//  - through D2 to P1 (P's hit only: P1 computes after its cached pages of A and writes
//    every page, the cached ones too).
// Every answer equals the colocated node's; each prefill node sends exactly those pages.
TEST_F(PartialTransferTest, HitsOnEitherSideAtEveryOffsetWithinAPage) {
  NodeProcess p1(TinyModelDir(), With(PrefillArgs("tcp"), kPartialFlags));
  ASSERT_TRUE(p1.ok()) << p1.error();
  NodeProcess p2(TinyModelDir(), With(PrefillArgs("tcp"), kPartialFlags));
  ASSERT_TRUE(p2.ok()) << p2.error();
  NodeProcess d1(TinyModelDir(), DecodeArgs("tcp", {p1.port(), p2.port()}, kPartialFlags));
  ASSERT_TRUE(d1.ok()) << d1.error();
  NodeProcess d2(TinyModelDir(), DecodeArgs("tcp", {p1.port()}, kPartialFlags));
  ASSERT_TRUE(d2.ok()) << d2.error();
  ASSERT_EQ(WaitForMetric(d1.port(), "pdserve:messenger_peers_ready", 2, 20000), 2);
  const httplib::Headers to_p1 = {{"X-Prefill-Peer", PeerName(p1)}};
  const httplib::Headers to_p2 = {{"X-Prefill-Peer", PeerName(p2)}};
  int64_t p1_sent = 0, p2_sent = 0, d1_not_sent = 0, p1_hits = 0;
  for (int length = 16; length < 16 + kPage; ++length) {
    const std::vector<int32_t> a = RandomPrompt(length, 400 + length);
    const std::vector<int32_t> b = Joined(a, RandomPrompt(5, 500 + length));
    const int64_t b_pages = PagesOf(static_cast<int64_t>(b.size()) - 1);
    const Completion first = Complete(d1.port(), a, kAnswerLength, to_p1);
    ASSERT_EQ(first.status, 200) << first.body.dump();
    EXPECT_EQ(first.token_ids, Reference(a));
    p1_sent += PagesOf(length - 1) * page_bytes_;
    const std::vector<int32_t> want = Reference(b);

    const Completion d_hit = Complete(d1.port(), b, kAnswerLength, to_p2);
    ASSERT_EQ(d_hit.status, 200) << d_hit.body.dump();
    EXPECT_EQ(d_hit.token_ids, want) << "D's hit, L = " << length;
    const int64_t d1_cached = length / kPage;  // D1 holds A's full pages (and its answer's)
    p2_sent += (b_pages - d1_cached) * page_bytes_;
    d1_not_sent += d1_cached * page_bytes_;

    const Completion p_hit = Complete(d2.port(), b, kAnswerLength, to_p1);
    ASSERT_EQ(p_hit.status, 200) << p_hit.body.dump();
    EXPECT_EQ(p_hit.token_ids, want) << "P's hit, L = " << length;
    p1_sent += b_pages * page_bytes_;
    p1_hits += (length - 1) / kPage * kPage;  // P1 prefilled A's [0, L-1): its full pages

    EXPECT_EQ(WaitForMetric(p1.port(), "pdserve:messenger_kv_bytes_sent_total",
                            static_cast<double>(p1_sent), 5000),
              p1_sent)
        << "L = " << length;
    EXPECT_EQ(WaitForMetric(p2.port(), "pdserve:messenger_kv_bytes_sent_total",
                            static_cast<double>(p2_sent), 5000),
              p2_sent)
        << "L = " << length;
    EXPECT_EQ(NodeMetric(d1.port(), "pdserve:messenger_kv_bytes_not_transferred_total"),
              d1_not_sent);
    EXPECT_EQ(NodeMetric(d2.port(), "pdserve:messenger_kv_bytes_not_transferred_total"), 0);
    EXPECT_EQ(NodeMetric(p1.port(), "vllm:prefix_cache_hits_total"), p1_hits);
    EXPECT_EQ(NodeMetric(p2.port(), "vllm:prefix_cache_hits_total"), 0);
  }
  for (const NodeProcess* n : {&p1, &p2, &d1, &d2}) ExpectNodeDrained(n->port());
}

// 20 multi-turn conversations (a shared system prompt, growing history: each turn is the last
// prompt, its answer and a new user message) through a 1P1D pair whose decode node's cache
// holds a third of the conversations' tokens, turn by turn across the conversations: every
// turn's tokens equal a colocated node's without caching; every page of every prompt was
// either sent by P or held by D (bytes sent + bytes not transferred = all the prompts' pages);
// D's cache hit, and evicted; both pools drain.
TEST_F(PartialTransferTest, MultiTurnConversationsUnderEvictionPressure) {
  NodeProcess prefill(TinyModelDir(), With(PrefillArgs("tcp"), kPartialFlags));
  ASSERT_TRUE(prefill.ok()) << prefill.error();
  // 1 MiB: 128 pages of 4 tokens (2 KiB per token).
  NodeProcess decode(TinyModelDir(), DecodeArgs("tcp", {prefill.port()},
                                                With(kPartialFlags, {"--kv-cache-mb", "1"})));
  ASSERT_TRUE(decode.ok()) << decode.error();
  ASSERT_EQ(page_bytes_ * 128, 1 << 20);
  const std::vector<int32_t> system = RandomPrompt(13, 600);
  constexpr int kConversations = 20, kTurns = 4;
  std::vector<std::vector<int32_t>> history(kConversations, system);
  int64_t all_pages = 0;
  for (int turn = 0; turn < kTurns; ++turn) {
    for (int c = 0; c < kConversations; ++c) {
      std::vector<int32_t>& prompt = history[static_cast<size_t>(c)];
      prompt = Joined(prompt, RandomPrompt(12, 700 + 10 * c + turn));
      const std::vector<int32_t> want = Reference(prompt);
      const Completion got = Complete(decode.port(), prompt, kAnswerLength);
      ASSERT_EQ(got.status, 200) << got.body.dump();
      ASSERT_EQ(got.token_ids, want) << "conversation " << c << " turn " << turn;
      all_pages += PagesOf(static_cast<int64_t>(prompt.size()) - 1);
      prompt = Joined(prompt, got.token_ids);
    }
  }
  // The last turns hold 13 + 4 * 12 + 3 * 6 = 79 tokens: 20 conversations are 3x the cache.
  ASSERT_EQ(history[0].size(), 79u + kAnswerLength);
  ExpectNodeDrained(prefill.port());
  ExpectNodeDrained(decode.port());
  const double sent = NodeMetric(prefill.port(), "pdserve:messenger_kv_bytes_sent_total");
  const double not_sent =
      NodeMetric(decode.port(), "pdserve:messenger_kv_bytes_not_transferred_total");
  EXPECT_EQ(sent + not_sent, static_cast<double>(all_pages * page_bytes_));
  EXPECT_GT(not_sent, 0);
  EXPECT_GT(NodeMetric(decode.port(), "vllm:prefix_cache_hits_total"), 0);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:kv_pages_total"), 128);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:kv_pages_evictable"),
            NodeMetric(decode.port(), "pdserve:kv_pages_cached"));
}

// D's choice of prefill peer by prefix (docs/messenger.md, "Peer choice"): prompts extending
// one that went to P2 go to P2 while it is idle (without the prefix term the tie would go to
// P1, the first peer), and to P1 when P2 is busy with more tokens than the prefix saves. D
// runs without caching, so every prompt is asked of a prefill node.
TEST(PrefillPeerChoiceTest, PrefersThePeerHoldingThePrefixUnlessItIsBusy) {
  NodeProcess p1(TinyModelDir(), With(PrefillArgs("tcp"), kPartialFlags));
  ASSERT_TRUE(p1.ok()) << p1.error();
  NodeProcess p2(TinyModelDir(), With(PrefillArgs("tcp"), kPartialFlags));
  ASSERT_TRUE(p2.ok()) << p2.error();
  NodeProcess decode(TinyModelDir(),
                     DecodeArgs("tcp", {p1.port(), p2.port()},
                                With(kPartialFlags, {"--no-prefix-caching", "--prefill-timeout-ms",
                                                     std::to_string(kPrefillTimeoutMs)})));
  ASSERT_TRUE(decode.ok()) << decode.error();
  ASSERT_EQ(WaitForMetric(decode.port(), "pdserve:messenger_peers_ready", 2, 20000), 2);
  const std::vector<int32_t> shared = RandomPrompt(40, 800);
  const Completion first = Complete(decode.port(), shared, 2, {{"X-Prefill-Peer", PeerName(p2)}});
  ASSERT_EQ(first.status, 200) << first.body.dump();
  const std::string queries = "vllm:prefix_cache_queries_total";
  for (uint32_t i = 0; i < 3; ++i) {
    const Completion got = Complete(decode.port(), Joined(shared, RandomPrompt(9, 810 + i)), 2);
    ASSERT_EQ(got.status, 200) << got.body.dump();
  }
  EXPECT_EQ(NodeMetric(p1.port(), queries), 0) << "P1 got a prompt P2 holds the prefix of";
  EXPECT_EQ(NodeMetric(p2.port(), queries), 39 + 3 * 48);
  // 9 pages of the shared prompt the first time; 10 after (the second cached its 10th page).
  EXPECT_EQ(NodeMetric(p2.port(), "vllm:prefix_cache_hits_total"), 36 + 40 + 40);

  // P2 busy with a long prompt: its outstanding tokens outweigh the 36 it would save.
  auto busy = std::async(std::launch::async, [&] {
    return Complete(decode.port(), RandomPrompt(kLongPromptTokens, 820), 2,
                    {{"X-Prefill-Peer", PeerName(p2)}});
  });
  ASSERT_EQ(WaitForMetric(p2.port(), "pdserve:messenger_requests_in_flight", 1, 10000), 1);
  const Completion moved = Complete(decode.port(), Joined(shared, RandomPrompt(9, 830)), 2);
  ASSERT_EQ(moved.status, 200) << moved.body.dump();
  EXPECT_EQ(NodeMetric(p1.port(), queries), 48);
  ASSERT_EQ(busy.get().status, 200);
  for (const NodeProcess* n : {&p1, &p2, &decode}) ExpectNodeDrained(n->port());
}

}  // namespace
}  // namespace pdserve::testing
