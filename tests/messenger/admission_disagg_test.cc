// Admission by estimated KV wait (docs/messenger.md, "Admission") with real `pdserve serve`
// processes over tcp: a prefill node kept busy by another decode node's long prompts makes
// the decode node under test (deadline 2 s) prefill a short prompt itself, with the colocated
// node's tokens, and refuse a longer one at once with 503 and a Retry-After from its estimate
// — not after the 2 s deadline. With the prefill node idle both go to it and nothing is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "disagg_util.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

constexpr int kAdmissionDeadlineMs = 2000;
constexpr int kAdmissionLocalMax =
    64;  // prompt tokens the decode node prefills itself by admission
constexpr int kBusyLoadTokens = kLongPromptTokens;  // each of the busy prefill node's prompts
// One thread, chunks of 16 tokens: the prefill node takes seconds for a few long prompts.
const std::vector<std::string> kBusyPrefillFlags = {"--page-size",        "4", "--threads", "1",
                                                    "--max-batch-tokens", "16"};

// The decode node's view of its one prefill peer (/internal/messenger/peers).
double AdmissionPeerField(int decode_port, const char* field) {
  const nlohmann::json peers = GetJson(decode_port, "/internal/messenger/peers");
  if (!peers.is_array() || peers.size() != 1 || !peers[0].contains(field)) return -1;
  return peers[0][field].get<double>();
}

TEST(AdmissionDisaggTest, BusyPrefillNodeMeansLocalPrefillOrAnImmediate503IdleOneServesAll) {
  const std::string model = TinyModelDir();
  NodeProcess prefill(model, PrefillArgs("tcp", kBusyPrefillFlags));
  ASSERT_TRUE(prefill.ok()) << prefill.error();
  // The load: a decode node that waits as long as it takes (60 s, no admission).
  NodeProcess loader(
      model, DecodeArgs("tcp", {prefill.port()}, With(kBusyPrefillFlags, {"--admission", "off"})));
  ASSERT_TRUE(loader.ok()) << loader.error();
  NodeProcess decode(model,
                     DecodeArgs("tcp", {prefill.port()},
                                With(kBusyPrefillFlags,
                                     {"--prefill-timeout-ms", std::to_string(kAdmissionDeadlineMs),
                                      "--admission", "local", "--admission-local-max-tokens",
                                      std::to_string(kAdmissionLocalMax)})));
  ASSERT_TRUE(decode.ok()) << decode.error();
  NodeProcess colocated(model, kBusyPrefillFlags);
  ASSERT_TRUE(colocated.ok()) << colocated.error();
  ASSERT_EQ(WaitForMetric(loader.port(), "pdserve:messenger_peers_ready", 1, 30000), 1);
  ASSERT_EQ(WaitForMetric(decode.port(), "pdserve:messenger_peers_ready", 1, 30000), 1);

  const std::vector<int32_t> short_prompt = RandomPrompt(40, 1);  // within kAdmissionLocalMax
  const std::vector<int32_t> long_prompt = RandomPrompt(100, 2);  // over it
  const Completion short_want = Complete(colocated.port(), short_prompt, 6);
  const Completion long_want = Complete(colocated.port(), long_prompt, 6);
  ASSERT_EQ(short_want.status, 200);
  ASSERT_EQ(long_want.status, 200);

  // Idle: before any measurement, and after one, the prefill node serves.
  Completion got = Complete(decode.port(), short_prompt, 6);
  ASSERT_EQ(got.status, 200) << ErrorMessage(got);
  EXPECT_EQ(got.token_ids, short_want.token_ids);
  const Completion warm = Complete(loader.port(), RandomPrompt(kBusyLoadTokens, 3), 1);
  ASSERT_EQ(warm.status, 200) << ErrorMessage(warm);
  const double rate = NodeMetric(prefill.port(), "pdserve:messenger_prefill_tokens_per_second");
  ASSERT_GT(rate, 0) << "the prefill node measured no rate";
  for (int i = 0; i < 50 && AdmissionPeerField(decode.port(), "prefill_tokens_per_second") <= 0;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GT(AdmissionPeerField(decode.port(), "prefill_tokens_per_second"), 0)
      << "no rate reported";
  got = Complete(decode.port(), long_prompt, 6);
  ASSERT_EQ(got.status, 200) << ErrorMessage(got);
  EXPECT_EQ(got.token_ids, long_want.token_ids);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:decode_remote_prefills_total"), 2);

  // Busy: about 8 s of prompts queued at the measured rate (4x the deadline).
  const int loads = std::clamp(static_cast<int>(std::ceil(rate * 8.0 / kBusyLoadTokens)), 2, 40);
  std::atomic<bool> drop{false};
  std::vector<std::thread> clients;
  struct JoinClients {  // also when an assertion returns early
    std::atomic<bool>& drop;
    std::vector<std::thread>& clients;
    ~JoinClients() {
      drop = true;
      for (std::thread& t : clients) {
        if (t.joinable()) t.join();
      }
    }
  } join_clients{drop, clients};
  for (int i = 0; i < loads; ++i) {
    clients.emplace_back([&, i] {
      StreamThenDrop(loader.port(), RandomPrompt(kBusyLoadTokens, 10 + static_cast<uint32_t>(i)), 4,
                     120000, [&] { return drop.load(); });
    });
  }
  const double queued = 0.9 * loads * (kBusyLoadTokens - 1);
  for (int i = 0; i < 100 && AdmissionPeerField(decode.port(), "queued_tokens") < queued; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(AdmissionPeerField(decode.port(), "queued_tokens"), queued)
      << loads << " prompts of " << kBusyLoadTokens << " tokens at " << rate << " tokens/s";

  // Prefilled here, with the colocated node's tokens.
  got = Complete(decode.port(), short_prompt, 6);
  ASSERT_EQ(got.status, 200) << ErrorMessage(got);
  EXPECT_EQ(got.token_ids, short_want.token_ids);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:decode_admission_prefills_total"), 1);
  // Too long for this node's room: refused at once, told to come back when the queue will
  // have drained enough (about 8 s - 2 s at the rate measured).
  got = Complete(decode.port(), long_prompt, 6);
  EXPECT_EQ(got.status, 503) << ErrorMessage(got);
  EXPECT_LT(got.seconds, 1.0) << "waited for a failure already certain";
  EXPECT_NE(ErrorMessage(got).find("admission: prefill peer"), std::string::npos)
      << ErrorMessage(got);
  EXPECT_GE(std::atoi(got.retry_after.c_str()), 3) << "Retry-After: " << got.retry_after;
  EXPECT_NE(ErrorMessage(got).find("(retry after " + got.retry_after + " s)"), std::string::npos)
      << ErrorMessage(got);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:decode_admission_refusals_total"), 1);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:messenger_requests_expired_total"), 0);

  // Idle again (the load's clients gone, their prefills cancelled): served by the prefill node.
  drop = true;
  for (std::thread& t : clients) t.join();
  clients.clear();
  ASSERT_EQ(WaitForMetric(prefill.port(), "pdserve:messenger_outstanding_prefill_tokens", 0, 30000),
            0);
  for (int i = 0; i < 50 && AdmissionPeerField(decode.port(), "queued_tokens") > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  got = Complete(decode.port(), long_prompt, 6);
  ASSERT_EQ(got.status, 200) << ErrorMessage(got);
  EXPECT_EQ(got.token_ids, long_want.token_ids);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:decode_remote_prefills_total"), 3);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:decode_admission_refusals_total"), 1);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:decode_admission_prefills_total"), 1);
  EXPECT_EQ(NodeMetric(loader.port(), "pdserve:decode_admission_refusals_total"), 0);
  ExpectNodeDrained(decode.port());
  ExpectNodeDrained(loader.port());
  ExpectNodeDrained(prefill.port());
}

}  // namespace
}  // namespace pdserve::testing
