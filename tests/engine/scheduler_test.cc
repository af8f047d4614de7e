#include "engine/scheduler.h"

#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "engine/sampler.h"

namespace pdserve {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  Sequence* NewSeq(int prompt_len, RequestKind kind = RequestKind::kGenerate) {
    EngineRequest req;
    req.id = "r" + std::to_string(seqs_.size());
    req.prompt.assign(prompt_len, 1);
    req.kind = kind;
    seqs_.push_back(
        std::make_unique<Sequence>(std::move(req), kPageTokens, Sampler(SamplingParams{}, seeds_)));
    return seqs_.back().get();
  }
  // Pretends the forward pass ran: KV computed, and a token sampled where logits were wanted.
  static void Complete(const std::vector<ScheduledChunk>& plan) {
    for (const ScheduledChunk& c : plan) {
      c.seq->num_computed += c.count;
      if (c.want_logits) c.seq->tokens.push_back(7);
    }
  }

  static constexpr int kPageTokens = 4;
  SeedSource seeds_{1};
  std::vector<std::unique_ptr<Sequence>> seqs_;
};

TEST_F(SchedulerTest, ChunksLongPromptsWithinTheTokenBudget) {
  PagePool pool(100);
  Scheduler s({.max_batch_tokens = 8, .max_running = 4}, &pool);
  Sequence* a = NewSeq(20);
  s.AddWaiting(a);
  std::vector<int64_t> chunk_sizes;
  while (!a->in_decode()) {
    auto plan = s.Schedule();
    ASSERT_EQ(plan.size(), 1u);
    EXPECT_EQ(plan[0].start, a->num_computed);
    chunk_sizes.push_back(plan[0].count);
    EXPECT_EQ(plan[0].want_logits, a->num_computed + plan[0].count == 20);
    Complete(plan);
  }
  EXPECT_EQ(chunk_sizes, (std::vector<int64_t>{8, 8, 4}));
  EXPECT_EQ(pool.used(), 5);  // 20 tokens + the sampled one's slot comes next step
  auto plan = s.Schedule();
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].count, 1);
  EXPECT_TRUE(plan[0].want_logits);
  EXPECT_EQ(pool.used(), 6);
}

TEST_F(SchedulerTest, MixesDecodeTokensAndPrefillChunksInOneStep) {
  PagePool pool(100);
  Scheduler s({.max_batch_tokens = 6, .max_running = 4}, &pool);
  Sequence* a = NewSeq(3);
  s.AddWaiting(a);
  Complete(s.Schedule());  // a prefilled, one token sampled
  Sequence* b = NewSeq(10);
  s.AddWaiting(b);
  auto plan = s.Schedule();
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].seq, a);  // decode first
  EXPECT_EQ(plan[0].count, 1);
  EXPECT_EQ(plan[1].seq, b);
  EXPECT_EQ(plan[1].count, 5);  // the rest of the budget
  EXPECT_FALSE(plan[1].want_logits);
}

TEST_F(SchedulerTest, RespectsMaxRunning) {
  PagePool pool(100);
  Scheduler s({.max_batch_tokens = 100, .max_running = 2}, &pool);
  for (int i = 0; i < 3; ++i) s.AddWaiting(NewSeq(2));
  auto plan = s.Schedule();
  EXPECT_EQ(plan.size(), 2u);
  EXPECT_EQ(s.waiting().size(), 1u);
}

TEST_F(SchedulerTest, PreemptsTheNewestWhenPagesRunOutAndReleasesItsPages) {
  PagePool pool(4);  // 16 tokens
  Scheduler s({.max_batch_tokens = 64, .max_running = 4}, &pool);
  Sequence* old_seq = NewSeq(8);
  Sequence* new_seq = NewSeq(8);
  s.AddWaiting(old_seq);
  s.AddWaiting(new_seq);
  Complete(s.Schedule());  // both prefilled: 4 pages used, each has 9 tokens now
  EXPECT_EQ(pool.used(), 4);
  auto plan = s.Schedule();  // old needs a 3rd page: new is preempted
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].seq, old_seq);
  EXPECT_EQ(s.preemptions(), 1);
  EXPECT_EQ(new_seq->state, SequenceState::kWaiting);
  EXPECT_EQ(new_seq->num_computed, 0);
  EXPECT_TRUE(new_seq->table.pages().empty());
  EXPECT_EQ(s.waiting().front(), new_seq);
  EXPECT_EQ(pool.used(), 3);
}

TEST_F(SchedulerTest, PrefillOnlyRequestsNeverAskForLogits) {
  PagePool pool(10);
  Scheduler s({.max_batch_tokens = 64, .max_running = 4}, &pool);
  Sequence* p = NewSeq(9, RequestKind::kPrefillOnly);
  s.AddWaiting(p);
  auto plan = s.Schedule();
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].count, 9);
  EXPECT_FALSE(plan[0].want_logits);
}

TEST_F(SchedulerTest, WaitsForPagesInsteadOfOverAllocating) {
  PagePool pool(2);
  Scheduler s({.max_batch_tokens = 64, .max_running = 4}, &pool);
  Sequence* a = NewSeq(8);
  Sequence* b = NewSeq(4);
  s.AddWaiting(a);
  s.AddWaiting(b);
  auto plan = s.Schedule();
  ASSERT_EQ(plan.size(), 1u);  // b cannot get a page yet
  EXPECT_EQ(plan[0].seq, a);
  EXPECT_EQ(pool.used(), 2);
  EXPECT_EQ(s.waiting().size(), 1u);
}

}  // namespace
}  // namespace pdserve
