// Drafter: what proposes tokens for speculative decoding — a draft model
// (engine/draft_model_drafter.h) or DeepSeek's MTP module (engine/mtp_drafter.h). The engine
// asks it each step for up to k tokens per sequence in decode, verifies them in one pass of the
// target model and tells it how much of the sequence stands. What a drafter keeps per sequence
// lives in the Sequence's draft fields (draft_table, draft_computed, drafts, mtp_hidden). Loop
// thread only.
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"
#include "kv/page_pool.h"

namespace pdserve {

struct Sequence;

// Draft up to `tokens` (>= 1) tokens for `seq`, whose last token is pending (not yet run).
struct DraftWish {
  Sequence* seq = nullptr;
  int tokens = 0;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Called once by Engine::Create, before anything else: the drafter's cache gets as many
  // pages of `page_tokens` as the target's, so it never runs short before the target does.
  virtual Status CreateCache(int num_pages, int page_tokens) = 0;
  // Fills each wish's seq->drafts (cleared first) with at most `tokens` drafted tokens, one
  // batched pass per drafted position; fewer, or none, where the drafter's cache has no room.
  // An error leaves every wish with no drafts (the step then decodes without them).
  virtual Status Propose(std::span<const DraftWish> wishes) = 0;
  // Verification kept the sequence's tokens [0, valid) as they were drafted: the drafter
  // forgets what it computed at positions >= valid and returns the pages wholly past them.
  virtual void Rollback(Sequence& seq, int64_t valid) = 0;
  // Returns every page the sequence holds in the drafter's cache (finished, or preempted).
  virtual void Release(Sequence& seq) = 0;
  // The drafter's own page pool; null when its KV lives in the target's pages (MTP).
  virtual const PagePool* page_pool() const = 0;
};

}  // namespace pdserve
