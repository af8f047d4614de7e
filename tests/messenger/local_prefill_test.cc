// Conditional disaggregation (docs/messenger.md): a decode node started with
// --local-prefill-max-tokens N prefills prompts of at most N tokens itself and sends longer ones
// to its prefill node; both give the colocated node's greedy tokens, and the decode node's
// counters say which path each prompt took. Real `pdserve serve` processes over tcp.
#include <gtest/gtest.h>

#include "disagg_util.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

constexpr int kLocalMax = 8;
const std::vector<std::string> kLocalPrefillFlags = {"--page-size", "4", "--max-batch-tokens", "8"};

TEST(LocalPrefillTest, ShortPromptsPrefillLocallyLongOnesRemotelyBothMatchColocated) {
  const std::string model = TinyModelDir();
  NodeProcess prefill(model, PrefillArgs("tcp", kLocalPrefillFlags));
  ASSERT_TRUE(prefill.ok()) << prefill.error();
  // Built here rather than with DecodeArgs, which turns local prefill off.
  std::vector<std::string> decode_args = {"--role",
                                          "decode",
                                          "--fabric-provider",
                                          "tcp",
                                          "--cluster-key",
                                          kClusterKey,
                                          "--prefill-peer",
                                          "127.0.0.1:" + std::to_string(prefill.port()),
                                          "--local-prefill-max-tokens",
                                          std::to_string(kLocalMax)};
  NodeProcess decode(model, With(decode_args, kLocalPrefillFlags));
  ASSERT_TRUE(decode.ok()) << decode.error();
  NodeProcess colocated(model, kLocalPrefillFlags);
  ASSERT_TRUE(colocated.ok()) << colocated.error();
  ASSERT_EQ(WaitForMetric(decode.port(), "pdserve:messenger_peers_ready", 1, 30000), 1);

  // kLocalMax itself is local (at most N); one more token goes to the prefill node, and a long
  // prompt spans several pages and prefill chunks.
  struct Case {
    int length;
    bool local;
  };
  int local = 0, remote = 0;
  for (const Case& c :
       {Case{kLocalMax, true}, Case{kLocalMax + 1, false}, Case{29, false}, Case{3, true}}) {
    const std::vector<int32_t> prompt =
        RandomPrompt(c.length, 100 + static_cast<uint32_t>(c.length));
    const Completion want = Complete(colocated.port(), prompt, 6);
    const Completion got = Complete(decode.port(), prompt, 6);
    ASSERT_EQ(want.status, 200) << want.body.dump();
    ASSERT_EQ(got.status, 200) << "length " << c.length << ": " << got.body.dump();
    EXPECT_EQ(got.token_ids.size(), 6u);
    EXPECT_EQ(got.token_ids, want.token_ids) << "prompt length " << c.length;
    (c.local ? local : remote) += 1;
    EXPECT_EQ(NodeMetric(decode.port(), "pdserve:decode_local_prefills_total"), local)
        << "after the prompt of " << c.length << " tokens";
    EXPECT_EQ(NodeMetric(decode.port(), "pdserve:decode_remote_prefills_total"), remote)
        << "after the prompt of " << c.length << " tokens";
  }
  ExpectNodeDrained(decode.port());
  ExpectNodeDrained(prefill.port());
}

}  // namespace
}  // namespace pdserve::testing
