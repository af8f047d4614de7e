// Disaggregated serving end to end (DESIGN.md §6, first invariant): a decode node fed by a
// prefill node over the KV messenger returns, token for token, the greedy output of a colocated
// node — for prompts of 1, 2, page-1, page, page+1 tokens, several pages, and longer than one
// prefill chunk — over tcp and over shm. Page pools are back to zero afterwards on both sides.
// Real `pdserve serve` processes spoken to over HTTP.
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "disagg_util.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

// Small chunks on the prefill node, so that long prompts take several forward passes.
const std::vector<std::string> kModelFlags = {"--page-size", std::to_string(kPage),
                                              "--max-batch-tokens", "8"};

struct Cluster {
  std::unique_ptr<NodeProcess> prefill, decode, colocated;
};

Cluster StartCluster(const std::string& model, const std::string& provider) {
  Cluster c;
  c.prefill = std::make_unique<NodeProcess>(model, [&] {
    auto a = PrefillArgs(provider);
    a.insert(a.end(), kModelFlags.begin(), kModelFlags.end());
    return a;
  }());
  if (!c.prefill->ok()) return c;
  c.decode = std::make_unique<NodeProcess>(model, [&] {
    auto a = DecodeArgs(provider, {c.prefill->port()});
    a.insert(a.end(), kModelFlags.begin(), kModelFlags.end());
    return a;
  }());
  c.colocated = std::make_unique<NodeProcess>(model, kModelFlags);
  return c;
}

void ExpectPoolsDrained(const Cluster& c) {
  for (const NodeProcess* node : {c.prefill.get(), c.decode.get()}) {
    EXPECT_EQ(WaitForMetric(node->port(), "pdserve:messenger_requests_in_flight", 0, 10000), 0)
        << "node on port " << node->port();
    EXPECT_EQ(WaitForMetric(node->port(), "pdserve:kv_cache_usage_perc", 0, 10000), 0)
        << "KV pages still in use on port " << node->port();
  }
}

class DisaggTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DisaggTest, SyntheticPromptsMatchColocatedTokenForToken) {
  const Cluster c = StartCluster(TinyModelDir(), GetParam());
  ASSERT_TRUE(c.prefill->ok()) << c.prefill->error();
  ASSERT_TRUE(c.decode->ok()) << c.decode->error();
  ASSERT_TRUE(c.colocated->ok()) << c.colocated->error();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(3, 250);
  // 1 and 2: nothing / one token to transfer; page-1, page, page+1; several pages; beyond one
  // prefill chunk (8 tokens) several times over.
  for (int length : {1, 2, kPage - 1, kPage, kPage + 1, 3 * kPage + 2, 37}) {
    std::vector<int32_t> prompt(length);
    for (int32_t& t : prompt) t = token(rng);
    const Completion want = Complete(c.colocated->port(), prompt, 6);
    const Completion got = Complete(c.decode->port(), prompt, 6);
    ASSERT_EQ(want.status, 200) << want.body.dump();
    ASSERT_EQ(got.status, 200) << "length " << length << ": " << got.body.dump();
    EXPECT_EQ(got.token_ids.size(), 6u);
    EXPECT_EQ(got.token_ids, want.token_ids) << "prompt length " << length;
  }
  ExpectPoolsDrained(c);
  // The prefill node serves no generation API.
  EXPECT_EQ(Complete(c.prefill->port(), {5, 6, 7}, 2).status, 404);
}

TEST_P(DisaggTest, Stories260KGoldenPromptsMatchColocated) {
  PD_REQUIRE_SHARED("models/stories260K");
  const std::string dir = SharedPath("models/stories260K");
  const Cluster c = StartCluster(dir, GetParam());
  ASSERT_TRUE(c.prefill->ok()) << c.prefill->error();
  ASSERT_TRUE(c.decode->ok()) << c.decode->error();
  ASSERT_TRUE(c.colocated->ok()) << c.colocated->error();
  std::ifstream in(dir + "/golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_FALSE(golden["cases"].empty());
  for (const auto& k : golden["cases"]) {
    const auto prompt = k["prompt_ids"].get<std::vector<int32_t>>();
    const auto greedy = k["greedy_ids"].get<std::vector<int32_t>>();
    const int n = static_cast<int>(greedy.size());
    const Completion want = Complete(c.colocated->port(), prompt, n);
    const Completion got = Complete(c.decode->port(), prompt, n);
    ASSERT_EQ(got.status, 200) << got.body.dump();
    EXPECT_EQ(got.token_ids, want.token_ids) << k["prompt"];
    EXPECT_EQ(got.token_ids, greedy) << k["prompt"];
  }
  ExpectPoolsDrained(c);
}

INSTANTIATE_TEST_SUITE_P(Providers, DisaggTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pdserve::testing
