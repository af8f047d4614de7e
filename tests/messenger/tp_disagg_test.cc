// Mismatched tensor parallelism end to end (DESIGN.md §4, §6): a prefill node and a decode node
// of different TP — each node's ranks real `pdserve rank-worker` processes, each rank's KV
// heads in its own cache — return the greedy tokens of a one-rank colocated node, token for
// token. Covers P with more ranks than D (D's pages rebuilt from several P ranks), fewer (each
// D rank fed by the P rank holding its heads), replica groups (a model with one KV head on two
// ranks), over tcp and shm. Page pools return to zero on both sides. With an MLA model's
// replicated latent, every P rank sends its share and each request moves its latent once.
#include <gtest/gtest.h>

#include "disagg_util.h"
#include "model/config.h"
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

// The latent cache of an MLA model is replicated on every P rank, and each request's writes come
// from the replica the transfer plan picks from its seed (D's transfer id): over 100 requests
// every P rank sends within 20% of an even share (P's per-rank counters on /metrics), and each
// request moves exactly its latent's whole pages, once (P's total checked after every request).
// D numbers its transfers from 1, so which rank serves which request is the same in every run.
TEST(TpDisaggShareTest, EveryPrefillRankSendsItsShareOfTheLatent) {
  const std::string model = SyntheticModelDir("deepseek-v3-tiny");
  Result<ModelConfig> config = ModelConfig::Load(model);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_TRUE(config->is_mla());
  NodeProcess prefill(model, PrefillArgs("tcp", NodeFlags(2)));
  ASSERT_TRUE(prefill.ok()) << prefill.error();
  NodeProcess decode(model, DecodeArgs("tcp", {prefill.port()}, NodeFlags(1)));
  ASSERT_TRUE(decode.ok()) << decode.error();
  const std::string sent = "pdserve:messenger_kv_bytes_sent_total";
  const std::string received = "pdserve:messenger_kv_bytes_received_total";
  auto rank_metric = [&](const char* what, int rank) {
    return NodeMetric(prefill.port(), std::string("pdserve:messenger_kv_rank_") + what +
                                          "_sent_total{rank=\"" + std::to_string(rank) + "\"}");
  };
  ASSERT_EQ(NodeMetric(prefill.port(), sent), 0);
  ASSERT_EQ(rank_metric("bytes", 0), 0) << "P publishes a counter per rank";
  ASSERT_EQ(rank_metric("bytes", 1), 0);

  // Per page of 4 tokens and layer, the latent rows: kv_lora_rank + qk_rope_head_dim BF16 values.
  constexpr int kPageTokens = 4;  // NodeFlags
  const int64_t page_bytes = int64_t{kPageTokens} * config->mla.latent_dim() * 2;
  constexpr int kRequests = 100;
  int64_t bytes = 0, writes = 0;
  for (int i = 0; i < kRequests; ++i) {
    const int length = 5 + 4 * (i % 3);  // 4, 8 or 12 tokens prefilled: 1 to 3 pages
    const Completion c = Complete(decode.port(), RandomPrompt(length, 1000 + i), 1);
    ASSERT_EQ(c.status, 200) << "request " << i << ": " << c.body.dump();
    const int pages = (length - 1 + kPageTokens - 1) / kPageTokens;
    bytes += pages * page_bytes * config->num_layers;
    writes += int64_t{pages} * config->num_layers;  // D's one rank holds the whole latent
    // P counts a write when it completes, which may trail D's landing a little.
    ASSERT_EQ(WaitForMetric(prefill.port(), sent, static_cast<double>(bytes), 5000), bytes)
        << "request " << i << " (" << pages << " pages) moved other than its latent";
  }
  EXPECT_EQ(NodeMetric(decode.port(), received), bytes);
  EXPECT_EQ(NodeMetric(prefill.port(), "pdserve:messenger_kv_writes_sent_total"), writes);
  for (const char* what : {"bytes", "writes"}) {
    const double total = std::string(what) == "bytes" ? bytes : writes;
    const double r0 = rank_metric(what, 0), r1 = rank_metric(what, 1);
    EXPECT_EQ(r0 + r1, total) << what;
    for (double share : {r0, r1}) {
      EXPECT_GE(share, 0.8 * total / 2) << what << " of ranks 0 / 1: " << r0 << " / " << r1;
      EXPECT_LE(share, 1.2 * total / 2) << what << " of ranks 0 / 1: " << r0 << " / " << r1;
    }
  }
  ExpectNodeDrained(prefill.port());
  ExpectNodeDrained(decode.port());
}

}  // namespace
}  // namespace pdserve::testing
