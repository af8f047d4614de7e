// Scheduler: decides each step's batch — continuous batching with a per-step token budget and
// chunked prefill, prefill and decode mixed in one step. Pure bookkeeping over Sequences and
// the PagePool; no model, no I/O. Owned by the engine's loop thread.
//
// Policy, per step:
//  1. every running sequence in decode gets one token (oldest first); if its next page cannot
//     be allocated, the newest running sequence is preempted (pages released, recomputed later;
//     kernels are batch-invariant, so recomputation reproduces the same KV). A sequence with
//     speculation (Sequence::spec_tokens) also gets room for up to that many drafted tokens —
//     fewer where max_tokens, the context, the budget or free pages allow fewer; never by
//     preempting;
//  2. running sequences still in prefill get chunks from the remaining budget (oldest first);
//  3. waiting sequences are admitted (FIFO) while budget, running slots and pages allow; one
//     that holds no pages first shares the cached pages of its longest cached prefix
//     (engine/prefix_cache.h) and computes only the rest.
#pragma once

#include <climits>
#include <cstdint>
#include <deque>
#include <vector>

#include "engine/prefix_cache.h"
#include "engine/sequence.h"
#include "kv/page_pool.h"

namespace pdserve {

struct SchedulerOptions {
  int max_batch_tokens = 512;  // token budget of one step
  int max_running = 64;        // sequences scheduled at once
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int64_t start = 0;  // first token position of the chunk
  int64_t count = 0;
  bool want_logits = false;  // the chunk ends where a token must be sampled
  // Decode with speculation: tokens that may be drafted and verified after this one (pages are
  // allocated for them); the engine sets `count` and `logit_rows` to 1 + the drafted tokens.
  int speculative = 0;
  int logit_rows = 1;
};

class Scheduler {
 public:
  // prefix_cache may be null (no prefix caching); it must outlive the scheduler.
  Scheduler(const SchedulerOptions& options, PagePool* pool, PrefixCache* prefix_cache = nullptr)
      : options_(options), pool_(pool), prefix_cache_(prefix_cache) {}

  // Positions a sequence may reach (the model's context, the cache): drafted tokens stop there.
  void set_max_sequence_tokens(int64_t tokens) { max_sequence_tokens_ = tokens; }

  // Queues a sequence for admission (kGenerate/kPrefillOnly) — or, for preempted ones, at the
  // front so they resume first.
  void AddWaiting(Sequence* seq, bool front = false);
  // kRemotePrefill sequence whose KV has landed: runs its last prompt token next step.
  void AddRunning(Sequence* seq);
  // Forgets a sequence wherever it is (finished or cancelled). Does not release its pages.
  void Remove(Sequence* seq);

  // Plans one step. Sequences preempted to make room are released and re-queued.
  std::vector<ScheduledChunk> Schedule();

  const std::deque<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  bool idle() const { return running_.empty() && waiting_.empty(); }
  int64_t preemptions() const { return preemptions_; }

 private:
  // Releases the newest running sequence other than `keep`; false if there is none.
  bool PreemptNewest(const Sequence* keep);
  // Chunk of a prefilling sequence within `budget` tokens (0 if no pages).
  int64_t PlanPrefillChunk(Sequence* seq, int64_t budget);

  SchedulerOptions options_;
  PagePool* pool_;
  PrefixCache* prefix_cache_;
  std::deque<Sequence*> running_;  // admission order
  std::deque<Sequence*> waiting_;
  int64_t max_sequence_tokens_ = INT64_MAX;
  uint64_t next_admit_order_ = 0;
  int64_t preemptions_ = 0;
};

}  // namespace pdserve
