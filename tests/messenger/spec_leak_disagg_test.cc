// No leaks under speculative decoding (issue 33), disaggregated: a prefill node and a decode
// node with a draft model (real `pdserve serve` processes over libfabric's tcp and shm), or
// both with DeepSeek-V3's MTP module (its hidden state crossing in the context buffer), serve
// 500 mixed requests over HTTP — greedy and seeded sampled, stop strings, clients that close
// their stream after a few events (the decode node cancels a sequence that drafts) or while the
// prompt is still being prefilled and transferred — and afterwards both nodes show no request
// in flight and no page in use, KV pool and drafter pool alike. The colocated counterpart, with
// step-by-step checks of the counters, is tests/engine/spec_leak_test.cc.
#include <atomic>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "disagg_util.h"

namespace pdserve::testing {
namespace {

using json = nlohmann::json;

constexpr int kLeakDisaggRequests = 500;
constexpr int kLeakDisaggClients = 12;
constexpr int kLeakDisaggK = 4;

// Layers 2-3 of "tiny" at 0.3 of their weight, drafted by its first two layers: often rejected.
std::string LeakDisaggTarget() {
  return SyntheticModelDir("tiny", {.quiet_from_layer = 2, .quiet_scale = 0.3f});
}

// DeepSeek-V3's shape drafting with its MTP module (mtp_disagg_test.cc's pair): the prefill node
// writes the hidden state into the decode node's context buffer, which cancelled requests must
// release with their pages.
std::string LeakDisaggMtpTarget() {
  return SyntheticModelDir(
      "deepseek-v3-tiny",
      {.quiet_from_layer = 0, .quiet_scale = 0.01f, .head_scale = 8.0f, .mtp_mimic = true});
}

struct LeakDisaggCase {
  std::string provider;
  bool mtp = false;  // else a draft model on the decode node
};
void PrintTo(const LeakDisaggCase& c, std::ostream* os) {
  *os << c.provider << (c.mtp ? " mtp" : " draft");
}

// The body of request i: prompt ids, greedy or seeded sampling, stop strings or not.
json LeakDisaggBody(std::mt19937& rng, int i, const std::vector<int32_t>& prompt, int max_tokens) {
  json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"stream", true}};
  if (rng() % 2 == 0) {
    body["temperature"] = 0;
  } else {
    body["temperature"] = 0.8;
    body["top_p"] = 0.95;
    body["seed"] = i;
  }
  if (rng() % 5 < 2) {
    body["stop"] = {rng() % 2 == 0 ? "e" : "a", " t"};
    body["ignore_eos"] = true;
  } else {
    body["ignore_eos"] = rng() % 2 == 0;
  }
  return body;
}

class SpecLeakDisaggTest : public ::testing::TestWithParam<LeakDisaggCase> {};

TEST_P(SpecLeakDisaggTest, FiveHundredRequestsWithDropsAndStopsLeaveBothNodesEmpty) {
  const std::string provider = GetParam().provider;
  const bool mtp = GetParam().mtp;
  const std::string target = mtp ? LeakDisaggMtpTarget() : LeakDisaggTarget();
  const std::vector<std::string> common = {"--page-size", std::to_string(kPage), "--threads", "1"};
  NodeProcess prefill(
      target, With(PrefillArgs(provider), mtp ? With(common, {"--speculative", "mtp"}) : common));
  ASSERT_TRUE(prefill.ok()) << prefill.error();
  const std::vector<std::string> drafter =
      mtp ? std::vector<std::string>{"--speculative", "mtp"}
          : std::vector<std::string>{"--speculative", "draft", "--draft-model",
                                     SyntheticModelDir("tiny", {.num_layers = 2})};
  NodeProcess decode(target,
                     DecodeArgs(provider, {prefill.port()},
                                With(With(common, drafter),
                                     {"--num-speculative-tokens", std::to_string(kLeakDisaggK)})));
  ASSERT_TRUE(decode.ok()) << decode.error();
  // A request sent before the handshake would wait for a peer.
  ASSERT_EQ(WaitForMetric(decode.port(), "pdserve:messenger_peers_ready", 1, 10000), 1);

  std::atomic<int> next{0}, completed{0}, stopped{0}, dropped_mid_decode{0}, dropped_early{0};
  std::atomic<int> bad{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kLeakDisaggClients; ++c) {
    clients.emplace_back([&] {
      for (int i = next++; i < kLeakDisaggRequests; i = next++) {
        std::mt19937 rng(7000 + i);
        const int kind = static_cast<int>(rng() % 10);
        if (kind == 0) {
          // Gone while the prompt is prefilled on P or its KV is in flight.
          const int length = 200 + static_cast<int>(rng() % 400);
          if (!StreamThenDrop(decode.port(), RandomPrompt(length, 9000 + i), 64,
                              static_cast<int>(rng() % 60))) {
            ++bad;
          }
          ++dropped_early;
          continue;
        }
        const std::vector<int32_t> prompt =
            RandomPrompt(1 + static_cast<int>(rng() % 80), 9000 + i);
        if (kind <= 3) {
          // Gone after a few tokens of a long answer: cancelled while it drafts.
          json body = LeakDisaggBody(rng, i, prompt, 96);
          body.erase("stop");
          body["ignore_eos"] = true;
          const int events = 1 + static_cast<int>(rng() % 4);
          const SseStream s = PostStream(decode.port(), "/v1/completions", body, events);
          if (s.status != 200) ++bad;
          ++dropped_mid_decode;
          continue;
        }
        const int max_tokens = 1 + static_cast<int>(rng() % 40);
        const json body = LeakDisaggBody(rng, i, prompt, max_tokens);
        const SseStream s = PostStream(decode.port(), "/v1/completions", body);
        int tokens = 0;
        std::string reason;
        for (const json& e : s.events) {
          if (!e.is_object() || !e.contains("choices") || e["choices"].empty()) continue;
          const json& choice = e["choices"][0];
          if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
            reason = choice["finish_reason"];
          }
          if (e.contains("usage") && e["usage"].is_object()) {
            tokens = e["usage"].value("completion_tokens", tokens);
          }
        }
        if (s.status != 200 || !s.done || (reason != "stop" && reason != "length")) {
          ++bad;
          ADD_FAILURE() << "request " << i << ": " << s.status << " " << s.raw.substr(0, 300);
          continue;
        }
        ++completed;
        stopped += reason == "stop";
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(bad.load(), 0);

  // Both nodes drained: no request in flight, no KV page, no drafter page, no transfer slot.
  ExpectNodeDrained(prefill.port(), 20000);
  ExpectNodeDrained(decode.port(), 20000);
  for (const NodeProcess* node : {&prefill, &decode}) {
    for (const char* gauge :
         {"pdserve:kv_pages_used", "pdserve:num_requests_running", "pdserve:num_requests_waiting",
          "pdserve:messenger_requests_in_flight"}) {
      EXPECT_EQ(WaitForMetric(node->port(), gauge, 0, 10000), 0) << gauge << " on " << node->port();
    }
  }
  for (const char* gauge :
       {"pdserve:spec_decode_draft_pages_used", "pdserve:messenger_slots_in_use",
        "pdserve:messenger_requests_waiting_kv"}) {
    EXPECT_EQ(WaitForMetric(decode.port(), gauge, 0, 10000), 0) << gauge;
  }

  // The mix did what it is for: the decode node speculated with rejections, stop strings ended
  // answers, and clients that left were cancelled there rather than served to the end.
  const int d = decode.port();
  const double drafts = NodeMetric(d, "vllm:spec_decode_num_drafts_total");
  const double drafted = NodeMetric(d, "vllm:spec_decode_num_draft_tokens_total");
  const double accepted = NodeMetric(d, "vllm:spec_decode_num_accepted_tokens_total");
  const double served = NodeMetric(d, "pdserve:request_success_total{finished_reason=\"stop\"}") +
                        NodeMetric(d, "pdserve:request_success_total{finished_reason=\"length\"}");
  std::printf(
      "%s%s: %d completed (%d by a stop string), %d dropped mid-decode, %d dropped early; decode "
      "node: %.0f served, %.0f drafts, %.0f drafted, %.0f accepted (%.1f%%), %.0f transfers "
      "cancelled\n",
      provider.c_str(), mtp ? " (MTP)" : "", completed.load(), stopped.load(),
      dropped_mid_decode.load(), dropped_early.load(), served, drafts, drafted, accepted,
      100 * accepted / drafted, NodeMetric(d, "pdserve:messenger_requests_cancelled_total"));
  // The MTP pair drafts 4 from one module chained (11% accepted in a run, most of it at the
  // first position); the draft-model pair ~40%.
  EXPECT_GT(accepted, (mtp ? 0.04 : 0.1) * drafted);
  EXPECT_LT(accepted, 0.8 * drafted);
  EXPECT_LE(drafted, kLeakDisaggK * drafts);
  for (int k = 1; k < kLeakDisaggK; ++k) {
    const auto position = [d](int p) {
      return NodeMetric(d, "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"" +
                               std::to_string(p) + "\"}");
    };
    EXPECT_LE(position(k), position(k - 1)) << k;
  }
  EXPECT_GT(stopped.load(), 20);
  // Most of the streams closed after a few of their 96 tokens never finished on the node.
  EXPECT_LT(served, completed.load() + 0.5 * dropped_mid_decode.load() + dropped_early.load());
  EXPECT_GT(dropped_mid_decode.load(), 50);
}

INSTANTIATE_TEST_SUITE_P(Providers, SpecLeakDisaggTest,
                         ::testing::Values(LeakDisaggCase{"tcp"}, LeakDisaggCase{"shm"},
                                           LeakDisaggCase{"tcp", true}),
                         [](const auto& info) {
                           return info.param.provider + (info.param.mtp ? "_mtp" : "");
                         });

}  // namespace
}  // namespace pdserve::testing
