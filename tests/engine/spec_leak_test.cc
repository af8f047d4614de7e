// No leaks under speculative decoding (issue 33), colocated: 500 mixed requests through one
// engine with a draft model that is often rejected — greedy and seeded sampled requests, stop
// strings that end a run of accepted drafts before its end, max_tokens reached by a verified
// run, cancels while a prompt is half prefilled and while a sequence decodes, preemptions for
// lack of pages — leave both page pools (target and drafter) empty and no request live, with
// the speculative counters consistent step by step. The disaggregated counterpart with real
// processes is tests/messenger/spec_leak_disagg_test.cc.
//
// What happened in each step is read from outside the engine: the announced chunks
// (StepObserver) give each sequence's drafted tokens (a verification chunk runs the pending
// token and the drafts: it ends past the tokens the request has so far), the outputs give the
// tokens each emitted, and the counters' differences what verification accepted. A sequence
// that goes on emits its accepted drafts plus one token of the target's; one that ends on an
// accepted draft (a stop string inside the run) emits only accepted ones. So the step's
// accepted tokens minus (emitted - 1) per drafting sequence count the sequences that ended
// inside their accepted run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine_test_util.h"
#include "testing/test_models.h"

namespace pdserve {
namespace {

using testing::EngineFixture;
using testing::FixtureOptions;

constexpr int kLeakRequests = 500;
constexpr int kLeakInFlight = 24;
constexpr int kLeakK = 4;

// What the test knows of one request.
struct LeakTracked {
  int prompt_len = 0;
  int max_tokens = 0;
  bool stop_strings = false;  // has stop strings (and ignores EOS: a stop is a stop string's)
  int emitted = 0;            // tokens so far
  int step_tokens = 0;        // tokens of the current step's output
  int step_drafts = 0;        // drafted tokens verified for it in the current step
  bool announced = false;     // scheduled in the current step
  int64_t announced_end = 0;
  bool finished = false;
  int finishes = 0;
  FinishReason reason = FinishReason::kNone;
  bool cancelled_mid_prefill = false;
  bool cancelled_mid_decode = false;
};

// Records each step's chunks into the tracked requests: how many drafted tokens each verifies.
class LeakStepRecorder : public StepObserver {
 public:
  explicit LeakStepRecorder(std::map<std::string, LeakTracked>* tracked) : tracked_(tracked) {}
  void OnStepScheduled(uint64_t, std::span<const AnnouncedChunk> chunks) override {
    for (const AnnouncedChunk& c : chunks) {
      LeakTracked& t = tracked_->at(*c.request_id);
      const int64_t end = c.start + c.count;
      t.announced = true;
      t.announced_end = end;
      t.step_drafts = std::max<int>(0, static_cast<int>(end - (t.prompt_len + t.emitted)));
    }
  }
  void OnLayerDone(uint64_t, int) override {}

 private:
  std::map<std::string, LeakTracked>* tracked_;
};

TEST(SpecLeakTest, FiveHundredMixedRequestsLeaveNoPageAndNoRequest) {
  // Layers 2-3 of "tiny" at 0.3 of their weight: the two-layer draft is rejected often.
  const std::string target =
      testing::SyntheticModelDir("tiny", {.quiet_from_layer = 2, .quiet_scale = 0.3f});
  FixtureOptions o;
  o.page_tokens = 4;
  o.max_batch_tokens = 48;  // prompts of up to 120 tokens take several steps
  o.num_pages = 80;         // 320 tokens for 24 requests of up to 168: preemptions
  o.draft_dir = testing::SyntheticModelDir("tiny", {.num_layers = 2});
  o.speculative_tokens = kLeakK;
  EngineFixture fx(target, o);
  Engine& engine = fx.engine();
  std::map<std::string, LeakTracked> tracked;
  LeakStepRecorder recorder(&tracked);
  engine.SetStepObserver(&recorder);

  std::mt19937 rng(20261207);
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int submitted = 0, live = 0;
  auto submit = [&] {
    EngineRequest r;
    r.id = "leak" + std::to_string(submitted++);
    r.prompt.resize(static_cast<size_t>(uniform(1, 120)));
    for (int32_t& t : r.prompt) t = uniform(3, 2000);
    if (uniform(0, 1) == 0) {
      r.params.temperature = 0;
    } else {
      r.params.temperature = 0.8f;
      r.params.top_p = 0.95f;
      r.params.seed = static_cast<uint64_t>(submitted);
    }
    r.params.max_tokens = uniform(1, 48);
    r.params.ignore_eos = uniform(0, 1) == 0;
    LeakTracked& t = tracked[r.id];
    // Single characters: a stop string ends a run wherever the text holds one.
    if (uniform(0, 9) < 4) {
      r.params.stop = {uniform(0, 1) == 0 ? "e" : "a", " t"};
      r.params.ignore_eos = true;
      t.stop_strings = true;
    }
    t.prompt_len = static_cast<int>(r.prompt.size());
    t.max_tokens = r.params.max_tokens;
    r.on_output = [&t, &live](const RequestOutput& out) {
      EXPECT_FALSE(t.finished) << out.id << ": output after its end";
      t.emitted += static_cast<int>(out.tokens.size());
      t.step_tokens += static_cast<int>(out.tokens.size());
      if (!out.finished) return;
      EXPECT_TRUE(out.status.ok() || out.finish_reason == FinishReason::kCancelled)
          << out.id << ": " << out.status.ToString();
      t.finished = true;
      ++t.finishes;
      t.reason = out.finish_reason;
      --live;
    };
    ++live;
    ASSERT_TRUE(engine.Submit(std::move(r)).ok());
  };

  SpecDecodeStats last;
  last.accepted_per_position.assign(kLeakK, 0);
  int64_t inside_run_stops = 0, inside_run_other = 0, length_in_verification = 0;
  int64_t verification_steps = 0, steps = 0;
  int cancels_mid_prefill = 0, cancels_mid_decode = 0;
  while (submitted < kLeakRequests || live > 0) {
    while (submitted < kLeakRequests && live < kLeakInFlight) submit();
    for (auto& [id, t] : tracked) {
      t.step_tokens = 0;
      t.step_drafts = 0;
      t.announced = false;
    }
    // Nothing to run only when the cancels this step drained ended the last requests.
    if (!engine.Step()) {
      ASSERT_EQ(live, 0) << "requests live but nothing ran";
    }
    ASSERT_LT(++steps, 20000);
    const SpecDecodeStats s = engine.stats().spec;
    // The step's counters against what its chunks and outputs show.
    int64_t drafting = 0, drafted = 0, emitted_beyond_one = 0, drafting_finished = 0;
    std::vector<std::pair<FinishReason, bool>> reasons;  // and whether it had stop strings
    for (auto& [id, t] : tracked) {
      if (!t.announced || t.step_drafts == 0) continue;
      ++drafting;
      drafted += t.step_drafts;
      EXPECT_GE(t.step_tokens, 1) << id;
      EXPECT_LE(t.step_tokens, t.step_drafts + 1) << id;
      emitted_beyond_one += t.step_tokens - 1;
      if (t.finished && t.step_tokens > 0 && t.reason != FinishReason::kCancelled) {
        ++drafting_finished;
        reasons.emplace_back(t.reason, t.stop_strings);
        length_in_verification += t.reason == FinishReason::kLength;
      }
    }
    EXPECT_EQ(s.drafts - last.drafts, drafting) << "step " << steps;
    EXPECT_EQ(s.draft_tokens - last.draft_tokens, drafted) << "step " << steps;
    const int64_t ended_inside_run = s.accepted_tokens - last.accepted_tokens - emitted_beyond_one;
    EXPECT_GE(ended_inside_run, 0) << "step " << steps;
    EXPECT_LE(ended_inside_run, drafting_finished) << "step " << steps;
    if (ended_inside_run > 0) {
      const bool all_stop_strings = std::all_of(reasons.begin(), reasons.end(), [](const auto& r) {
        return r.first == FinishReason::kStop && r.second;
      });
      (all_stop_strings ? inside_run_stops : inside_run_other) += ended_inside_run;
    }
    verification_steps += drafting > 0;
    last = s;

    // Cancels: some requests whose prompt is half prefilled, some decoding.
    for (auto& [id, t] : tracked) {
      if (t.finished || !t.announced) continue;
      if (t.emitted == 0 && t.announced_end < t.prompt_len && uniform(0, 99) < 15) {
        t.cancelled_mid_prefill = true;
        ++cancels_mid_prefill;
        engine.Cancel(id);
      } else if (t.emitted > 0 && uniform(0, 999) < 15) {
        t.cancelled_mid_decode = true;
        ++cancels_mid_decode;
        engine.Cancel(id);
      }
    }
  }
  engine.RunUntilIdle();

  int stopped = 0, cancelled = 0;
  for (const auto& [id, t] : tracked) {
    EXPECT_EQ(t.finishes, 1) << id;
    EXPECT_LE(t.emitted, t.max_tokens) << id;
    if (t.reason == FinishReason::kLength) {
      EXPECT_EQ(t.emitted, t.max_tokens) << id;
    }
    if (t.cancelled_mid_prefill || t.cancelled_mid_decode) {
      EXPECT_EQ(t.reason, FinishReason::kCancelled) << id;
    }
    if (t.cancelled_mid_prefill) {
      EXPECT_EQ(t.emitted, 0) << id;
    }
    stopped += t.reason == FinishReason::kStop;
    cancelled += t.reason == FinishReason::kCancelled;
  }
  EXPECT_EQ(static_cast<int>(tracked.size()), kLeakRequests);

  // Nothing left: no request, no page of either cache.
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.running, 0);
  EXPECT_EQ(stats.waiting, 0);
  EXPECT_EQ(stats.awaiting_kv, 0);
  EXPECT_EQ(stats.pages_used, 0);
  EXPECT_EQ(engine.page_pool().used(), 0);
  ASSERT_NE(engine.drafter(), nullptr);
  ASSERT_NE(engine.drafter()->page_pool(), nullptr);  // a draft model has its own cache
  EXPECT_EQ(engine.drafter()->page_pool()->used(), 0);
  EXPECT_EQ(stats.spec.draft_pages_used, 0);

  // The counters over the whole run: accepted drafts are a prefix of each draft.
  const SpecDecodeStats& s = stats.spec;
  ASSERT_EQ(s.accepted_per_position.size(), static_cast<size_t>(kLeakK));
  int64_t per_position_sum = 0;
  for (int k = 0; k < kLeakK; ++k) {
    per_position_sum += s.accepted_per_position[k];
    if (k > 0) {
      EXPECT_LE(s.accepted_per_position[k], s.accepted_per_position[k - 1]) << k;
    }
  }
  EXPECT_EQ(per_position_sum, s.accepted_tokens);
  EXPECT_LE(s.accepted_per_position[0], s.drafts);
  EXPECT_LE(s.accepted_tokens, s.draft_tokens);
  EXPECT_LE(s.draft_tokens, s.drafts * kLeakK);
  const double acceptance = static_cast<double>(s.accepted_tokens) / s.draft_tokens;
  std::printf(
      "%lld steps (%lld verifying), %lld drafts, %lld drafted, %lld accepted (%.1f%%); %d stopped, "
      "%d cancelled (%d mid-prefill, %d mid-decode), %lld preemptions; ended inside an accepted "
      "run: %lld by a stop string, %lld otherwise or undecided; max_tokens reached verifying: "
      "%lld\n",
      static_cast<long long>(steps), static_cast<long long>(verification_steps),
      static_cast<long long>(s.drafts), static_cast<long long>(s.draft_tokens),
      static_cast<long long>(s.accepted_tokens), 100 * acceptance, stopped, cancelled,
      cancels_mid_prefill, cancels_mid_decode, static_cast<long long>(stats.preemptions),
      static_cast<long long>(inside_run_stops), static_cast<long long>(inside_run_other),
      static_cast<long long>(length_in_verification));

  // The mix did what it is for: rejections (acceptance well below 100%), stop strings inside
  // accepted runs, max_tokens reached by verification, cancels of both kinds, preemptions.
  EXPECT_GT(acceptance, 0.1);
  EXPECT_LT(acceptance, 0.8);
  EXPECT_GT(inside_run_stops, 5);
  EXPECT_GT(length_in_verification, 20);
  EXPECT_GT(cancels_mid_prefill, 10);
  EXPECT_GT(cancels_mid_decode, 10);
  EXPECT_GT(stopped, 20);
  EXPECT_GT(stats.preemptions, 0);
}

// Found by the test above: a preempted sequence is recomputed as a prefill of its prompt and
// the tokens it had generated; when that recompute is chunked, a chunk that ends past the
// prompt but before the last token must not make the sequence decode (a decode step runs one
// token at num_computed and would sample a token that already exists). Greedy output under
// such preemptions equals the unpressed output, with and without speculation.
TEST(SpecLeakTest, ChunkedRecomputeAfterPreemptionKeepsTheOutput) {
  const std::string target =
      testing::SyntheticModelDir("tiny", {.quiet_from_layer = 2, .quiet_scale = 0.3f});
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts(6);
  for (auto& p : prompts) {
    p.resize(8 + rng() % 12);
    for (int32_t& t : p) t = static_cast<int32_t>(3 + rng() % 2000);
  }
  const int n = 40;
  EngineFixture roomy(target, {.page_tokens = 4});
  const auto want = roomy.GreedyBatch(prompts, n);
  for (int k : {0, 3}) {
    FixtureOptions o{.page_tokens = 4, .max_batch_tokens = 12, .num_pages = 28};
    if (k > 0) {
      o.draft_dir = testing::SyntheticModelDir("tiny", {.num_layers = 2});
      o.speculative_tokens = k;
    }
    EngineFixture tight(target, o);
    EXPECT_EQ(tight.GreedyBatch(prompts, n), want) << "K " << k;
    EXPECT_GT(tight.engine().stats().preemptions, 0) << "K " << k;
    EXPECT_EQ(tight.engine().page_pool().used(), 0);
  }
}

}  // namespace
}  // namespace pdserve
