// Mismatched tensor parallelism end to end (DESIGN.md §4, §6): a prefill node and a decode node
// of different TP — each node's ranks real `pdserve rank-worker` processes, each rank's KV
// heads in its own cache — return the greedy tokens of a one-rank colocated node, token for
// token. Covers P with more ranks than D (D's pages rebuilt from several P ranks), fewer (each
// D rank fed by the P rank holding its heads), replica groups (a model with one KV head on two
// ranks), over tcp and shm. Page pools return to zero on both sides.
#include <gtest/gtest.h>

#include "disagg_util.h"
#include "testing/test_models.h"

namespace pdserve::testing {
namespace {

struct TpCase {
  const char* preset;
  int prefill_tp;
  int decode_tp;
  const char* provider;
  friend void PrintTo(const TpCase& c, std::ostream* os) {
    *os << c.preset << " P TP " << c.prefill_tp << " -> D TP " << c.decode_tp << " over "
        << c.provider;
  }
};

std::vector<std::string> NodeFlags(int tp) {
  return {"--page-size", "4",    "--max-batch-tokens", "8", "--threads",
          "1",           "--tp", std::to_string(tp)};
}

class TpDisaggTest : public ::testing::TestWithParam<TpCase> {};

TEST_P(TpDisaggTest, DecodeOutputMatchesOneRankColocated) {
  const TpCase c = GetParam();
  const std::string model = SyntheticModelDir(c.preset);
  NodeProcess prefill(model, PrefillArgs(c.provider, NodeFlags(c.prefill_tp)));
  ASSERT_TRUE(prefill.ok()) << prefill.error();
  NodeProcess decode(model, DecodeArgs(c.provider, {prefill.port()}, NodeFlags(c.decode_tp)));
  ASSERT_TRUE(decode.ok()) << decode.error();
  NodeProcess colocated(model, NodeFlags(1));
  ASSERT_TRUE(colocated.ok()) << colocated.error();
  // The nodes really run the ranks asked for.
  EXPECT_EQ(NodeMetric(prefill.port(), "pdserve:tensor_parallel_size"), c.prefill_tp);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:tensor_parallel_size"), c.decode_tp);

  // One token (nothing to transfer), a partial page, several pages, several prefill chunks.
  uint32_t seed = 3;
  for (int length : {1, 6, 13, 37}) {
    const std::vector<int32_t> prompt = RandomPrompt(length, ++seed);
    const Completion want = Complete(colocated.port(), prompt, 6);
    const Completion got = Complete(decode.port(), prompt, 6);
    ASSERT_EQ(want.status, 200) << want.body.dump();
    ASSERT_EQ(got.status, 200) << "length " << length << ": " << got.body.dump();
    EXPECT_EQ(got.token_ids.size(), 6u);
    EXPECT_EQ(got.token_ids, want.token_ids) << "prompt length " << length;
  }
  ExpectNodeDrained(prefill.port());
  ExpectNodeDrained(decode.port());
}

INSTANTIATE_TEST_SUITE_P(Pairs, TpDisaggTest,
                         ::testing::Values(TpCase{"tiny", 2, 1, "tcp"}, TpCase{"tiny", 1, 2, "tcp"},
                                           TpCase{"tiny", 2, 4, "tcp"}, TpCase{"tiny", 2, 1, "shm"},
                                           TpCase{"tiny-llama3", 2, 1, "tcp"},
                                           TpCase{"tiny-llama3", 1, 2, "tcp"},
                                           TpCase{"tiny-qwen2", 3, 2, "tcp"},
                                           TpCase{"qwen3-moe-tiny", 2, 1, "tcp"},
                                           TpCase{"deepseek-v3-tiny", 1, 1, "tcp"},
                                           TpCase{"deepseek-v3-tiny", 2, 1, "tcp"},
                                           TpCase{"deepseek-v3-tiny", 1, 2, "tcp"}),
                         [](const ::testing::TestParamInfo<TpCase>& info) {
                           std::string name = std::string(info.param.preset) + "_p" +
                                              std::to_string(info.param.prefill_tp) + "_d" +
                                              std::to_string(info.param.decode_tp) + "_" +
                                              info.param.provider;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace pdserve::testing
