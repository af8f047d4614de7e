#include "engine/scheduler.h"

#include <algorithm>

#include "common/check.h"

namespace pdserve {

void Scheduler::AddWaiting(Sequence* seq, bool front) {
  seq->state = SequenceState::kWaiting;
  if (front) {
    waiting_.push_front(seq);
  } else {
    waiting_.push_back(seq);
  }
}

void Scheduler::AddRunning(Sequence* seq) {
  seq->state = SequenceState::kRunning;
  seq->admit_order = next_admit_order_++;
  running_.push_back(seq);
}

void Scheduler::Remove(Sequence* seq) {
  std::erase(running_, seq);
  std::erase(waiting_, seq);
}

bool Scheduler::PreemptNewest(const Sequence* keep) {
  Sequence* victim = nullptr;
  for (Sequence* s : running_) {
    // A prefill-only sequence's pages may be the source of writes in flight (request.h).
    if (s == keep || s->request.kind == RequestKind::kPrefillOnly) continue;
    if (victim == nullptr || s->admit_order > victim->admit_order) victim = s;
  }
  if (victim == nullptr) return false;
  std::erase(running_, victim);
  victim->table.Release(*pool_);
  victim->num_computed = 0;
  victim->mtp_final = 0;
  ++preemptions_;
  AddWaiting(victim, /*front=*/true);
  return true;
}

int64_t Scheduler::PlanPrefillChunk(Sequence* seq, int64_t budget) {
  const int64_t chunk = std::min(budget, seq->prefill_target() - seq->num_computed);
  if (chunk <= 0) return 0;
  if (!seq->table.EnsureCapacity(*pool_, seq->num_computed + chunk).ok()) {
    // Take what the pages already held allow rather than nothing.
    const int64_t fits = seq->table.capacity_tokens() - seq->num_computed;
    return std::clamp<int64_t>(fits, 0, chunk);
  }
  return chunk;
}

std::vector<ScheduledChunk> Scheduler::Schedule() {
  std::vector<ScheduledChunk> plan;
  int64_t budget = options_.max_batch_tokens;

  // 1. Decode: one token for every running sequence past its prompt.
  std::vector<Sequence*> decoding;
  for (Sequence* s : running_) {
    if (s->in_decode()) decoding.push_back(s);
  }
  std::sort(decoding.begin(), decoding.end(),
            [](const Sequence* a, const Sequence* b) { return a->admit_order < b->admit_order; });
  for (size_t i = 0; i < decoding.size(); ++i) {
    Sequence* s = decoding[i];
    if (s->state != SequenceState::kRunning) continue;  // preempted below by an older one
    // Drafted tokens: at most max_tokens - 1 past this step's (verification adds one of its
    // own), inside the context; pages for them only if free.
    int64_t speculative = std::min<int64_t>(
        {s->spec_tokens, s->request.params.max_tokens - s->completion_tokens() - 1,
         max_sequence_tokens_ - s->num_tokens(), budget - 1});
    bool ok = false;
    if (speculative > 0) {
      ok = s->table.EnsureCapacity(*pool_, s->num_tokens() + speculative).ok();
      // Never at the cost of a page a later sequence needs for its one plain token.
      const int later = static_cast<int>(decoding.size() - i - 1);
      if (ok && pool_->free_pages() < later) {
        s->table.Truncate(*pool_, s->num_tokens());
        ok = false;
      }
      if (!ok) speculative = 0;
    }
    if (!ok) ok = s->table.EnsureCapacity(*pool_, s->num_tokens()).ok();
    while (!ok && PreemptNewest(s)) ok = s->table.EnsureCapacity(*pool_, s->num_tokens()).ok();
    if (!ok) {  // nothing else to preempt: this one waits for pages
      std::erase(running_, s);
      s->table.Release(*pool_);
      s->num_computed = 0;
      s->mtp_final = 0;
      ++preemptions_;
      AddWaiting(s, /*front=*/true);
      continue;
    }
    if (budget <= 0) break;
    speculative = std::max<int64_t>(speculative, 0);
    plan.push_back({.seq = s,
                    .start = s->num_computed,
                    .count = 1,
                    .want_logits = true,
                    .speculative = static_cast<int>(speculative)});
    budget -= 1 + speculative;
  }
  // Drop chunks of sequences preempted after they were planned.
  std::erase_if(plan,
                [](const ScheduledChunk& c) { return c.seq->state != SequenceState::kRunning; });

  // 2. Running sequences still in prefill.
  for (Sequence* s : running_) {
    if (budget <= 0) break;
    if (s->in_decode()) continue;
    const int64_t chunk = PlanPrefillChunk(s, budget);
    if (chunk == 0) continue;
    plan.push_back({s, s->num_computed, chunk,
                    s->request.kind != RequestKind::kPrefillOnly &&
                        s->num_computed + chunk == s->num_tokens()});
    budget -= chunk;
  }

  // 3. Admit waiting sequences while budget, slots and pages allow.
  while (budget > 0 && !waiting_.empty() &&
         static_cast<int>(running_.size()) < options_.max_running) {
    Sequence* s = waiting_.front();
    if (s->in_decode()) {
      // A speculating one-token prompt: nothing to prefill; its token runs as a decode step.
      if (!s->table.EnsureCapacity(*pool_, s->num_tokens()).ok()) break;
      waiting_.pop_front();
      AddRunning(s);
      plan.push_back({.seq = s, .start = s->num_computed, .count = 1, .want_logits = true});
      budget -= 1;
      continue;
    }
    const PrefixCache::Hit hit =
        prefix_cache_ != nullptr ? prefix_cache_->Acquire(s) : PrefixCache::Hit{};
    const int64_t chunk = PlanPrefillChunk(s, budget);
    if (chunk == 0) {  // no pages: keep FIFO order, retry next step
      // A waiting sequence holds no shared pages: they would be pinned for nothing.
      if (prefix_cache_ != nullptr) prefix_cache_->Return(s, hit);
      break;
    }
    if (prefix_cache_ != nullptr) prefix_cache_->CountAdmission(s, hit);
    waiting_.pop_front();
    AddRunning(s);
    plan.push_back({s, s->num_computed, chunk,
                    s->request.kind != RequestKind::kPrefillOnly &&
                        s->num_computed + chunk == s->num_tokens()});
    budget -= chunk;
  }
  return plan;
}

}  // namespace pdserve
