// Sequence: the engine's state of one request — its tokens, how many have KV in the cache,
// its pages, sampler and stop state. Owned and touched only by the engine's loop thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "engine/request.h"
#include "engine/sampler.h"
#include "kv/block_table.h"
#include "kv/page_hash.h"
#include "tokenizer/tokenizer.h"

namespace pdserve {

class StopChecker;

enum class SequenceState : uint8_t {
  kWaiting,     // queued; no pages (or released by preemption)
  kAwaitingKv,  // kRemotePrefill: pages allocated, KV arriving from a prefill node
  kRunning,     // scheduled every step: prefill chunks, then one decode token per step
  kFinished,
};

struct Sequence {
  Sequence(EngineRequest request, int page_tokens, Sampler sampler);
  ~Sequence();
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  EngineRequest request;
  SequenceState state = SequenceState::kWaiting;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int64_t num_computed = 0;     // tokens [0, num_computed) have their KV in the cache
  int prompt_len = 0;
  BlockTable table;
  Sampler sampler;
  std::unique_ptr<StopChecker> stop;            // null without a tokenizer
  std::unique_ptr<IncrementalDecoder> decoder;  // null without a tokenizer
  uint64_t admit_order = 0;  // for preemption: the newest admitted is preempted first

  // Speculative decoding (engine/drafter.h). The target verifies `verify` (the pending token,
  // then the drafts) in one chunk; the drafter's own cache holds [0, draft_computed).
  int spec_tokens = 0;             // most tokens drafted a step; 0: no speculation
  std::vector<int32_t> drafts;     // this step's drafted tokens
  std::vector<float> draft_probs;  // sampling: [drafts][vocab], the q each draft was drawn from
  std::vector<int32_t> verify;     // this step's verified chunk
  BlockTable draft_table;          // pages of the drafter's cache
  int64_t draft_computed = 0;      // tokens [0, draft_computed) have KV in the drafter's cache
  // With the MTP KV layer (engine/mtp_drafter.h): the target's final-normed hidden state of
  // position num_computed - 1, where the next drafts start; empty until a pass produced it.
  std::vector<float> mtp_hidden;
  // With the MTP KV layer: positions [0, mtp_final) hold their final module entries (computed
  // from the true next token), at most num_computed. A prefill's rows but its last, a drafting
  // pass 1 (the entry of num_computed - 1) and a verification's accepted drafts extend it, each
  // only where it reaches; a rejected draft's entry, or one never written, stops it until
  // rewritten. What the prefix cache may seal (engine/prefix_cache.h).
  int64_t mtp_final = 0;

  // Prefix caching (engine/prefix_cache.h): the hashes of `tokens`' first full pages, as far
  // as they were needed (tokens only grow, so they stay valid), and whether the sequence's
  // first admission was counted in the cache's statistics.
  std::vector<PageHash> page_hashes;
  bool prefix_counted = false;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int completion_tokens() const { return static_cast<int>(tokens.size()) - prompt_len; }
  // Tokens that still need a forward pass (>= 1 while running).
  int64_t pending() const { return num_tokens() - num_computed; }
  // Every token but the pending last one has been run, and that one is a decode step: a token
  // sampled here, or, for a speculating sequence, also the last prompt token (which then runs
  // with drafts, as on a decode node after a remote prefill).
  bool in_decode() const {
    return num_computed == num_tokens() - 1 && (spec_tokens > 0 || num_computed >= prompt_len);
  }
  // How many tokens must be computed before the request is done with prefill: the prompt on a
  // prefill node; else every token, or all but the last for a speculating sequence.
  int64_t prefill_target() const {
    if (request.kind == RequestKind::kPrefillOnly) return prompt_len;
    return spec_tokens > 0 ? num_tokens() - 1 : num_tokens();
  }
};

}  // namespace pdserve
