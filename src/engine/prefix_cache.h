// PrefixCache: automatic prefix caching for one engine. A sequence's full pages are sealed as
// their KV becomes final and registered in the PagePool under a chained hash of their tokens
// (kv/page_hash.h); a sequence that is admitted later takes the cached pages of its longest
// cached prefix by reference (PagePool::AcquireCached) and computes only the rest. Full pages
// are never written again, so sharing needs no copy; a partly filled page is never shared.
// Batch-invariant kernels make a hit give the bits a miss gives.
//
// What seeds the hashes (the salt), i.e. what besides the tokens changes a page's KV: the
// model's fingerprint (Transformer::Fingerprint: config, kernel path, the linear weights'
// format), the KV cache's dtype and kind, and the page size. Left out, and why: the weights'
// bytes (one engine serves one checkpoint for its life), the TP size (TP never changes a bit,
// tests/engine/tp_forward_test.cc), sampling parameters (KV does not depend on them); there
// are no LoRA adapters or multimodal inputs.
//
// With the MTP KV layer (Transformer::mtp_kv, engine/mtp_drafter.h) the module's entry of a
// position is computed from the next token as well, so a page's last slot depends on the token
// after the page: pages are hashed, and a hit's tokens checked, one token further (a lookahead
// of 1, kv/page_hash.h), and a page is sealed only once its every MTP entry is final too —
// Sequence::mtp_final, which the engine keeps: an entry written with a draft that verification
// rejected, or not written at all (the last prefilled position, whose entry the next drafting
// pass writes), is not final until a pass rewrites it with the true next token.
// A kRemotePrefill sequence (a decode node's) looks the cache up when its pages are allocated
// — only the rest is asked of a prefill node — and its pages are registered like any other's
// once admitted (all its KV landed): the messenger's handshake admits only prefill nodes that
// compute this engine's bits (same model identity, weight format, kernel path and KV layout;
// tensor parallelism changes no bit), so their KV is what this engine would have computed.
// Pages of a transfer that did not complete are never sealed (num_computed stays at the hit).
// With caching off, pages are still sealed (BlockTable's checks hold) but never registered.
// Loop thread only (the scheduler at admission, the engine after each step and as requests
// end); stats() from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string_view>

#include "engine/sequence.h"
#include "kv/page_hash.h"
#include "kv/page_pool.h"

namespace pdserve {

// vLLM's prefix-cache counters, in tokens: each request's first admission queries its tokens
// and hits the tokens it found cached. A preempted request's readmission is not counted.
struct PrefixCacheStats {
  int64_t queries = 0;
  int64_t hits = 0;
};

class PrefixCache {
 public:
  // The result of a lookup at admission.
  struct Hit {
    bool queried = false;  // the cache was looked up (caching on, a sequence with no pages)
    int64_t tokens = 0;    // tokens whose KV the sequence now shares
  };

  // mtp_kv: the cache holds the MTP module's KV layer (the lookahead and mtp_final above).
  PrefixCache(PagePool* pool, bool enabled, std::string_view salt, int page_tokens, bool mtp_kv);
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  bool enabled() const { return enabled_; }
  // A waiting sequence about to be admitted: if it holds no pages, takes the cached pages of
  // its longest cached prefix — at most prefill_target() - 1 tokens rounded down to a page (at
  // least one token must run: the last prompt token's logits give the first output token; with
  // the MTP layer, the last prefilled position's hidden state starts the first drafts) —
  // and counts their tokens computed (and final: mtp_final).
  Hit Acquire(Sequence* seq);
  // The sequence was admitted after all: counts the lookup (first admission only).
  void CountAdmission(Sequence* seq, const Hit& hit);
  // It was not (no pages for the rest): hands the shared pages back, as before Acquire.
  void Return(Sequence* seq, const Hit& hit);
  // Seals the sequence's pages whose every slot now holds final KV and registers them (caching
  // on). Call after every step for running sequences (and before a
  // sequence's pages are released) — never while num_computed counts drafted tokens that
  // verification may still reject, except as Finish does (the bound in the .cc). With the MTP
  // layer only pages below mtp_final are sealed.
  void Seal(Sequence* seq);
  // How many leading tokens of `tokens` the cache holds, in full pages, taking nothing.
  int64_t CachedTokens(std::span<const int32_t> tokens) const;

  PrefixCacheStats stats() const {
    return {queries_.load(std::memory_order_relaxed), hits_.load(std::memory_order_relaxed)};
  }

 private:
  PagePool* const pool_;
  const bool enabled_;
  const bool mtp_kv_;
  const PrefixHasher hasher_;
  std::atomic<int64_t> queries_{0};
  std::atomic<int64_t> hits_{0};
};

}  // namespace pdserve
