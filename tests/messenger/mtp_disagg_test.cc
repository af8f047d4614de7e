// Speculative decoding with DeepSeek's MTP module, disaggregated (issue 33): the prefill node
// writes the module's KV layer with the pages and the hidden state of position n-2 into the
// decode node's context buffer; the decode node runs token n-1 with drafts from its first step.
// Its greedy tokens equal a colocated node's without speculation, and it drafts and accepts
// exactly as many tokens as a colocated node with MTP (acceptance parity), also with other
// tensor parallelism on each side. A prefill node without the module's KV is refused by name.
#include <chrono>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "disagg_util.h"

namespace pdserve::testing {
namespace {

std::string MtpTarget() {
  return SyntheticModelDir(
      "deepseek-v3-tiny",
      {.quiet_from_layer = 0, .quiet_scale = 0.01f, .head_scale = 8.0f, .mtp_mimic = true});
}

std::vector<std::string> MtpNodeFlags(int tp, bool mtp, bool drafts) {
  std::vector<std::string> f = {"--page-size", std::to_string(kPage), "--tp", std::to_string(tp)};
  if (mtp) f.insert(f.end(), {"--speculative", "mtp"});
  if (drafts) f.insert(f.end(), {"--num-speculative-tokens", "3"});
  return f;
}

struct MtpTpCase {
  int prefill_tp;
  int decode_tp;
};

class MtpDisaggTest : public ::testing::TestWithParam<MtpTpCase> {};

TEST_P(MtpDisaggTest, DecodeNodeDraftsAndAcceptsAsColocated) {
  const MtpTpCase c = GetParam();
  NodeProcess prefill(MtpTarget(), PrefillArgs("tcp", MtpNodeFlags(c.prefill_tp, true, false)));
  ASSERT_TRUE(prefill.ok()) << prefill.error();
  NodeProcess decode(MtpTarget(),
                     DecodeArgs("tcp", {prefill.port()}, MtpNodeFlags(c.decode_tp, true, true)));
  ASSERT_TRUE(decode.ok()) << decode.error();
  NodeProcess colocated(MtpTarget(), MtpNodeFlags(1, false, false));
  ASSERT_TRUE(colocated.ok()) << colocated.error();
  NodeProcess colocated_mtp(MtpTarget(), MtpNodeFlags(1, true, true));
  ASSERT_TRUE(colocated_mtp.ok()) << colocated_mtp.error();
  for (int i = 0; i < 5; ++i) {
    const std::vector<int32_t> prompt = RandomPrompt(5 + 9 * i, 300 + i);
    const Completion want = Complete(colocated.port(), prompt, 64);
    ASSERT_EQ(want.status, 200) << want.body.dump();
    const Completion got = Complete(decode.port(), prompt, 64);
    ASSERT_EQ(got.status, 200) << got.body.dump();
    EXPECT_EQ(got.token_ids, want.token_ids) << "prompt " << i;
    EXPECT_EQ(Complete(colocated_mtp.port(), prompt, 64).token_ids, want.token_ids);
    for (const NodeProcess* node : {&decode, &colocated_mtp}) {
      EXPECT_EQ(WaitForMetric(node->port(), "pdserve:num_requests_running", 0, 10000), 0);
    }
    // Acceptance parity, request by request: the drafts are the same bits on both.
    for (const char* name :
         {"vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
          "vllm:spec_decode_num_accepted_tokens_total"}) {
      EXPECT_EQ(NodeMetric(decode.port(), name), NodeMetric(colocated_mtp.port(), name))
          << name << " after prompt " << i;
    }
  }
  const double drafted = NodeMetric(decode.port(), "vllm:spec_decode_num_draft_tokens_total");
  EXPECT_GT(NodeMetric(decode.port(), "vllm:spec_decode_num_accepted_tokens_total"),
            0.15 * drafted);
  EXPECT_GT(NodeMetric(decode.port(), "pdserve:decode_remote_prefills_total"), 0);
  ExpectNodeDrained(decode.port());
  ExpectNodeDrained(prefill.port());
}

INSTANTIATE_TEST_SUITE_P(Tp, MtpDisaggTest,
                         ::testing::Values(MtpTpCase{1, 1}, MtpTpCase{2, 1}, MtpTpCase{1, 2}),
                         [](const ::testing::TestParamInfo<MtpTpCase>& info) {
                           return "p" + std::to_string(info.param.prefill_tp) + "_d" +
                                  std::to_string(info.param.decode_tp);
                         });

// Prefix caching with MTP on both nodes of a pair (on by default; docs/messenger.md, "The
// context buffer"), against a colocated MTP node without caching: prompts of 13 to 16 tokens
// (every residue of n-2 modulo the page) twice each, a conversation, and concurrent requests
// that share their first pages (cached on both nodes) — whose context slots must not be those
// pages'. Each answer's tokens and the drafted and accepted totals equal the colocated node's;
// the second time a prompt comes, D holds its full pages below n-2 and P sends only the rest.
TEST(MtpDisaggCachingTest, CachedPagesAndSharedFirstPagesDraftAsColocated) {
  NodeProcess prefill(MtpTarget(), PrefillArgs("tcp", MtpNodeFlags(1, true, false)));
  ASSERT_TRUE(prefill.ok()) << prefill.error();
  NodeProcess decode(MtpTarget(), DecodeArgs("tcp", {prefill.port()}, MtpNodeFlags(1, true, true)));
  ASSERT_TRUE(decode.ok()) << decode.error();
  NodeProcess colocated(MtpTarget(), With(MtpNodeFlags(1, true, true), {"--no-prefix-caching"}));
  ASSERT_TRUE(colocated.ok()) << colocated.error();
  constexpr int kAnswer = 10;
  auto expect_parity = [&](const std::string& what) {
    for (const char* name :
         {"vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
          "vllm:spec_decode_num_accepted_tokens_total"}) {
      EXPECT_EQ(NodeMetric(decode.port(), name), NodeMetric(colocated.port(), name))
          << name << " after " << what;
    }
  };
  auto both = [&](const std::vector<int32_t>& prompt, const std::string& what) {
    const Completion want = Complete(colocated.port(), prompt, kAnswer);
    EXPECT_EQ(want.status, 200) << want.body.dump();
    const Completion got = Complete(decode.port(), prompt, kAnswer);
    EXPECT_EQ(got.status, 200) << got.body.dump();
    EXPECT_EQ(got.token_ids, want.token_ids) << what;
    EXPECT_EQ(WaitForMetric(decode.port(), "pdserve:num_requests_running", 0, 10000), 0);
    expect_parity(what);
    return got.token_ids;
  };
  const std::string sent_metric = "pdserve:messenger_kv_bytes_sent_total";
  const std::string not_sent_metric = "pdserve:messenger_kv_bytes_not_transferred_total";
  double sent = 0, not_sent = 0, page_bytes = 0;
  for (int length = 13; length <= 16; ++length) {
    const std::vector<int32_t> prompt = RandomPrompt(length, 900 + length);
    const int64_t pages = (length - 1 + kPage - 1) / kPage;  // of [0, n-1)
    for (int round = 0; round < 2; ++round) {
      const std::string what =
          "length " + std::to_string(length) + " round " + std::to_string(round);
      both(prompt, what);
      if (page_bytes == 0) {  // the first transfer, once P's writes all completed: [0, n-1)
        ASSERT_EQ(WaitForMetric(prefill.port(), "pdserve:messenger_requests_in_flight", 0, 5000),
                  0);
        page_bytes = NodeMetric(prefill.port(), sent_metric) / static_cast<double>(pages);
        ASSERT_GT(page_bytes, 0);
      }
      // The second time D holds the full pages below n-2: P is asked only for the rest.
      const int64_t cached = round == 0 ? 0 : (length - 2) / kPage;
      sent += static_cast<double>(pages - cached) * page_bytes;
      not_sent += static_cast<double>(cached) * page_bytes;
      EXPECT_EQ(WaitForMetric(prefill.port(), sent_metric, sent, 5000), sent) << what;
      EXPECT_EQ(NodeMetric(decode.port(), not_sent_metric), not_sent) << what;
    }
  }
  // A conversation: each turn is the history, its answers and a new message.
  std::vector<int32_t> history = RandomPrompt(10, 950);
  for (int turn = 0; turn < 3; ++turn) {
    history.insert(history.end(), {7 + turn, 11 + turn, 13 + turn});
    const std::vector<int32_t> answer = both(history, "turn " + std::to_string(turn));
    history.insert(history.end(), answer.begin(), answer.end());
  }
  EXPECT_GT(NodeMetric(decode.port(), not_sent_metric), not_sent) << "the conversation hit";
  // Concurrent requests sharing their first two pages, cached on both nodes.
  const std::vector<int32_t> shared = RandomPrompt(9, 990);
  both(shared, "the shared prefix");
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p = shared;
    const std::vector<int32_t> own = RandomPrompt(3 + i, 991 + i);
    p.insert(p.end(), own.begin(), own.end());
    prompts.push_back(std::move(p));
  }
  auto all_at_once = [&](int port) {
    std::vector<std::future<Completion>> futures;
    for (const auto& p : prompts) {
      futures.push_back(
          std::async(std::launch::async, [port, &p] { return Complete(port, p, kAnswer); }));
    }
    std::vector<std::vector<int32_t>> out;
    for (auto& f : futures) {
      const Completion c = f.get();
      EXPECT_EQ(c.status, 200) << c.body.dump();
      out.push_back(c.token_ids);
    }
    return out;
  };
  const double hits_before = NodeMetric(decode.port(), "vllm:prefix_cache_hits_total");
  EXPECT_EQ(all_at_once(decode.port()), all_at_once(colocated.port()));
  EXPECT_EQ(WaitForMetric(decode.port(), "pdserve:num_requests_running", 0, 10000), 0);
  expect_parity("the concurrent requests");
  EXPECT_GE(NodeMetric(decode.port(), "vllm:prefix_cache_hits_total") - hits_before, 6 * 2 * kPage);
  EXPECT_GT(NodeMetric(prefill.port(), "vllm:prefix_cache_hits_total"), 0);
  EXPECT_GT(NodeMetric(decode.port(), "vllm:spec_decode_num_accepted_tokens_total"), 0);
  ExpectNodeDrained(decode.port());
  ExpectNodeDrained(prefill.port());
}

TEST(MtpDisaggRefusalTest, APrefillNodeWithoutTheMtpLayerIsRefusedByName) {
  NodeProcess prefill(MtpTarget(), PrefillArgs("tcp", MtpNodeFlags(1, false, false)));
  ASSERT_TRUE(prefill.ok()) << prefill.error();
  NodeProcess decode(MtpTarget(), DecodeArgs("tcp", {prefill.port()},
                                             With(MtpNodeFlags(1, true, true),
                                                  {"--local-prefill-fallback", "off"})));
  ASSERT_TRUE(decode.ok()) << decode.error();
  std::string error;
  for (int i = 0; i < 200 && error.empty(); ++i) {
    const nlohmann::json peers = GetJson(decode.port(), "/internal/messenger/peers");
    for (const nlohmann::json& p : peers.is_array() ? peers : nlohmann::json::array()) {
      if (p.value("refused", false)) error = p.value("last_error", "");
    }
    if (error.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(error.find("speculation differs"), std::string::npos) << error;
  EXPECT_NE(error.find("kv=plain"), std::string::npos) << error;
}

}  // namespace
}  // namespace pdserve::testing
