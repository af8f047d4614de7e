// Speculative decoding on a decode node (issue 33): a decode node with a draft model, fed by a
// prefill node without one, returns the colocated node's greedy tokens without speculation,
// and drafts and accepts exactly as many tokens as a colocated node with the same draft model
// (its draft model runs the prompt itself at the request's first speculative step, so its
// drafts are the colocated node's bit for bit). Every page comes back, draft pages included.
#include <gtest/gtest.h>

#include "disagg_util.h"

namespace pdserve::testing {
namespace {

std::string SpecTarget() {
  return SyntheticModelDir("tiny", {.quiet_from_layer = 2, .quiet_scale = 0.05f});
}
std::vector<std::string> SpecFlags() {
  return {"--speculative",
          "draft",
          "--draft-model",
          SyntheticModelDir("tiny", {.num_layers = 2}),
          "--num-speculative-tokens",
          "3",
          "--page-size",
          std::to_string(kPage)};
}

TEST(SpecDisaggTest, DecodeNodeSpeculatesWithColocatedTokensAndAcceptance) {
  NodeProcess prefill(SpecTarget(),
                      With(PrefillArgs("tcp"), {"--page-size", std::to_string(kPage)}));
  ASSERT_TRUE(prefill.ok()) << prefill.error();
  NodeProcess decode(SpecTarget(), DecodeArgs("tcp", {prefill.port()}, SpecFlags()));
  ASSERT_TRUE(decode.ok()) << decode.error();
  NodeProcess colocated(SpecTarget(), {"--page-size", std::to_string(kPage)});
  ASSERT_TRUE(colocated.ok()) << colocated.error();
  NodeProcess colocated_spec(SpecTarget(), SpecFlags());
  ASSERT_TRUE(colocated_spec.ok()) << colocated_spec.error();
  for (int i = 0; i < 5; ++i) {
    const std::vector<int32_t> prompt = RandomPrompt(5 + 9 * i, 100 + i);
    const Completion want = Complete(colocated.port(), prompt, 64);
    ASSERT_EQ(want.status, 200) << want.body.dump();
    const Completion got = Complete(decode.port(), prompt, 64);
    ASSERT_EQ(got.status, 200) << got.body.dump();
    EXPECT_EQ(got.token_ids, want.token_ids) << "prompt " << i;
    EXPECT_EQ(Complete(colocated_spec.port(), prompt, 64).token_ids, want.token_ids);
    // Acceptance parity, request by request. A node publishes its counters after the step that
    // finished the request, which may be after the answer left: wait for that step.
    for (const NodeProcess* node : {&decode, &colocated_spec}) {
      EXPECT_EQ(WaitForMetric(node->port(), "pdserve:num_requests_running", 0, 10000), 0);
    }
    for (const char* name :
         {"vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
          "vllm:spec_decode_num_accepted_tokens_total"}) {
      EXPECT_EQ(NodeMetric(decode.port(), name), NodeMetric(colocated_spec.port(), name))
          << name << " after prompt " << i;
    }
  }
  const double drafted = NodeMetric(decode.port(), "vllm:spec_decode_num_draft_tokens_total");
  EXPECT_GT(NodeMetric(decode.port(), "vllm:spec_decode_num_accepted_tokens_total"), 0.5 * drafted);
  EXPECT_GT(NodeMetric(decode.port(), "pdserve:decode_remote_prefills_total"), 0);
  ExpectNodeDrained(decode.port());
  ExpectNodeDrained(prefill.port());
  EXPECT_EQ(WaitForMetric(decode.port(), "pdserve:spec_decode_draft_pages_used", 0, 10000), 0);
}

}  // namespace
}  // namespace pdserve::testing
