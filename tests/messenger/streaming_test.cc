// Layer streaming is real (DESIGN.md §3.3): read from the prefill node's event log
// (/internal/messenger/events) that a long prompt's KV leaves P while P still computes it —
// a step's first layer is posted before that step's forward pass ends, and each chunk's pages
// are posted before the next chunk's step starts — and that every posted write completed.
// Real `pdserve serve` processes over tcp.
#include <algorithm>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "disagg_util.h"

namespace pdserve::testing {
namespace {

constexpr int kChunk = 64;  // P's token budget per step: a 513-token prompt takes 8 steps

// The events of the log, indexed.
struct Timeline {
  std::map<uint64_t, int64_t> scheduled;                   // step -> t_us
  std::map<std::pair<uint64_t, int>, int64_t> layer_done;  // (step, layer) -> t_us
  std::map<uint64_t, std::map<int, int64_t>> posted;       // step -> layer -> t_us
  int64_t writes_posted = 0;
  int64_t writes_complete = -1;
  int num_layers = 0;
};

Timeline ReadTimeline(const nlohmann::json& events) {
  Timeline t;
  for (const auto& e : events) {
    const std::string kind = e["kind"];
    const int64_t at = e["t_us"];
    const uint64_t step = e["step"];
    const int layer = e["layer"];
    if (kind == "step_scheduled") {
      t.scheduled[step] = at;
    } else if (kind == "layer_done") {
      t.layer_done[{step, layer}] = at;
      t.num_layers = std::max(t.num_layers, layer + 1);
    } else if (kind == "writes_posted") {
      t.posted[step].emplace(layer, at);
      t.writes_posted += e["count"].get<int64_t>();
    } else if (kind == "writes_complete") {
      t.writes_complete = e["count"];
    }
  }
  return t;
}

TEST(MessengerStreamingTest, LayersArePostedWhileTheForwardPassRuns) {
  const std::vector<std::string> flags = {"--page-size", "4", "--threads", "1"};
  auto p_args = PrefillArgs("tcp", {"--max-batch-tokens", std::to_string(kChunk)});
  p_args.insert(p_args.end(), flags.begin(), flags.end());
  NodeProcess prefill(TinyModelDir(), p_args);
  ASSERT_TRUE(prefill.ok()) << prefill.error();
  NodeProcess decode(TinyModelDir(), DecodeArgs("tcp", {prefill.port()}, flags));
  ASSERT_TRUE(decode.ok()) << decode.error();

  const std::vector<int32_t> prompt = RandomPrompt(8 * kChunk + 1, 11);
  const Completion got = Complete(decode.port(), prompt, 4);
  ASSERT_EQ(got.status, 200) << got.body.dump();
  ExpectNodeDrained(prefill.port());
  ExpectNodeDrained(decode.port());

  const nlohmann::json events = GetJson(prefill.port(), "/internal/messenger/events");
  ASSERT_TRUE(events.is_array()) << "no event log on the prefill node";
  const Timeline t = ReadTimeline(events);
  ASSERT_GT(t.num_layers, 1);
  // Every step of the prompt posted pages: the prefix of 512 tokens is 8 chunks of 64.
  ASSERT_EQ(t.posted.size(), 8u) << events.dump();
  std::vector<uint64_t> steps;
  for (const auto& [step, layers] : t.posted) {
    steps.push_back(step);
    EXPECT_EQ(static_cast<int>(layers.size()), t.num_layers) << "step " << step;
  }
  int overlapped = 0;
  int ahead_of_next_chunk = 0;
  const int64_t last_step_end = t.layer_done.at({steps.back(), t.num_layers - 1});
  for (size_t i = 0; i < steps.size(); ++i) {
    const uint64_t s = steps[i];
    const auto& layers = t.posted.at(s);
    ASSERT_TRUE(layers.count(0) && t.layer_done.count({s, t.num_layers - 1})) << "step " << s;
    // Layer 0's pages leave while the later layers of the same forward pass still run.
    if (layers.at(0) < t.layer_done.at({s, t.num_layers - 1})) ++overlapped;
    if (i + 1 < steps.size()) {
      ASSERT_TRUE(t.scheduled.count(steps[i + 1]));
      // Chunk i's pages leave before chunk i+1's step starts: not held back to the prompt's end.
      if (layers.at(0) < t.scheduled.at(steps[i + 1])) ++ahead_of_next_chunk;
      // Whatever the scheduling, no chunk but the last two waits for the prompt's last step.
      if (i + 2 < steps.size()) {
        EXPECT_LT(layers.at(0), last_step_end) << "chunk of step " << s << " held to the end";
      }
    }
  }
  // The streamer thread is woken per layer and the engine never waits for it, so on a loaded
  // machine (a CI run beside a soak) it may miss a step of a few milliseconds now and then —
  // but not most of them; a streamer that held pages back would post none ahead.
  EXPECT_GE(2 * overlapped, static_cast<int>(steps.size()))
      << overlapped << " of " << steps.size() << " steps posted layer 0 before their last layer";
  EXPECT_GE(2 * ahead_of_next_chunk, static_cast<int>(steps.size() - 1))
      << ahead_of_next_chunk << " of " << steps.size() - 1
      << " chunks were posted before the next chunk's step started";
  // The first chunk is wholly posted (every layer) before the last chunk's step starts.
  int64_t first_chunk_done = 0;
  for (const auto& [layer, at] : t.posted.at(steps.front())) {
    first_chunk_done = std::max(first_chunk_done, at);
  }
  EXPECT_LT(first_chunk_done, t.scheduled.at(steps.back()));
  // Every posted write completed (and was counted on P) before P let the pages go.
  EXPECT_EQ(t.writes_complete, t.writes_posted);
}

}  // namespace
}  // namespace pdserve::testing
