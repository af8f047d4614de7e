// Speculative decoding with DeepSeek's MTP module, disaggregated (issue 33): the prefill node
// writes the module's KV layer with the pages and the hidden state of position n-2 into the
// decode node's context buffer; the decode node runs token n-1 with drafts from its first step.
// Its greedy tokens equal a colocated node's without speculation, and it drafts and accepts
// exactly as many tokens as a colocated node with MTP (acceptance parity), also with other
// tensor parallelism on each side. A prefill node without the module's KV is refused by name.
#include <chrono>
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
