// PagePool: bookkeeping of the KV pages — who holds each and which hold cached prefixes. No
// storage, no tensors.
//
// A page is in one of three states:
//  - free: no reference, no content anyone may ask for; on the free list;
//  - referenced: held by one or more owners (a sequence's block table, a request whose pages
//    writes may still reach or read); each holder took one reference (Allocate or
//    AcquireCached) and drops it with Free;
//  - cached-unreferenced (evictable): no reference, but the page holds the KV of a registered
//    prefix (Register) and a later request may take it back (AcquireCached). These pages form
//    an LRU; Allocate takes free pages first, then evicts the least recently used cached page
//    (its hash is dropped).
// A registered page holds full, final KV: nobody writes it again (callers keep this: only
// sealed pages are registered, engine/prefix_cache.h). used() counts referenced pages only: a
// pool whose pages are all free or evictable is empty.
//
// Thread-safe (one mutex guards it), but in pdserve only the engine's loop thread allocates,
// frees and looks up pages (the scheduler, and the engine as requests end or their held pages
// are released; at destruction, once the loop has stopped). Messenger threads never touch the
// pool: they hand pages back through Engine::ReleaseHeldPages, which posts to the loop. Other
// threads only read the counters (tests, through Engine::page_pool()).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "kv/layout.h"
#include "kv/page_hash.h"

namespace pdserve {

class PagePool {
 public:
  explicit PagePool(int num_pages);
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // All-or-nothing: n pages with one reference each, or ResourceExhausted and nothing changed.
  // Free pages first, then evictable ones, least recently used first.
  Result<std::vector<PageId>> Allocate(int n) EXCLUDES(mu_);
  // Drops one reference from each page. A page left without one becomes evictable if it is
  // registered, else free. Pages of one call that become evictable are queued so that the
  // span's later pages are evicted first (a sequence's tail before its head, which other
  // prompts share more often). A page with no reference (double free, out of range) is a
  // programmer error and aborts: a page must never be handed out twice.
  void Free(std::span<const PageId> pages) EXCLUDES(mu_);

  // ---- Prefix cache.
  // Registers a referenced page as holding the prefix `hash` names: `parent` is the previous
  // page's hash (PrefixHasher::seed() for a first page) and `tokens` the tokens its identity
  // covers (PrefixHasher::IdentityOf: the page's own, then its lookahead), both kept to check
  // every later hit. False, and nothing changes, if another page holds `hash` already or this
  // page is registered already. Precondition: the page's KV is final.
  bool Register(PageId page, const PageHash& hash, const PageHash& parent,
                std::span<const int32_t> tokens) EXCLUDES(mu_);
  // The pages of the longest run of leading pages of a prompt that the cache holds, taking a
  // reference on each (an evictable one leaves the LRU). hashes[i] is page i's under `hasher`.
  // Page i matches when a page holds hashes[i] with the same parent hash (hasher.seed() for
  // i = 0) and the same identity tokens, hasher.IdentityOf(tokens, i) — the lookahead token
  // included, so a hash collision never yields foreign KV, not even in a page's last slot.
  // Precondition: tokens holds the identity tokens of hashes.size() pages.
  std::vector<PageId> AcquireCached(std::span<const PageHash> hashes, const PrefixHasher& hasher,
                                    std::span<const int32_t> tokens) EXCLUDES(mu_);
  // How many leading pages AcquireCached would return now, taking nothing (e.g. how many
  // leading tokens of a prompt a node holds).
  int CachedPrefixPages(std::span<const PageHash> hashes, const PrefixHasher& hasher,
                        std::span<const int32_t> tokens) const EXCLUDES(mu_);

  int capacity() const { return capacity_; }
  int used() const EXCLUDES(mu_);             // referenced pages
  int free_pages() const EXCLUDES(mu_);       // pages Allocate can hand out: free + evictable
  int cached_pages() const EXCLUDES(mu_);     // registered pages, referenced or not
  int evictable_pages() const EXCLUDES(mu_);  // registered pages without a reference
  int64_t evictions() const EXCLUDES(mu_);    // registered pages evicted so far
  double usage() const { return capacity_ == 0 ? 0.0 : static_cast<double>(used()) / capacity_; }

 private:
  struct Page {
    int32_t refs = 0;
    bool registered = false;
    PageHash hash;
    PageHash parent;
    std::vector<int32_t> tokens;  // registered pages: the tokens of the page's identity
    PageId lru_prev = -1;         // evictable pages: neighbours in the LRU (-1: none)
    PageId lru_next = -1;
  };
  // Index of the page registered under hashes[i] that matches (see AcquireCached), -1 if none.
  PageId MatchLocked(std::span<const PageHash> hashes, const PrefixHasher& hasher,
                     std::span<const int32_t> tokens, size_t i) const REQUIRES(mu_);
  void LruPushBack(PageId p) REQUIRES(mu_);  // most recently used
  void LruRemove(PageId p) REQUIRES(mu_);
  // Drops p's registration (its hash leaves the index).
  void Unregister(PageId p) REQUIRES(mu_);

  const int capacity_;
  mutable Mutex mu_;
  std::vector<PageId> free_list_ GUARDED_BY(mu_);  // a stack, lowest ids on top
  std::vector<Page> pages_ GUARDED_BY(mu_);
  std::unordered_map<PageHash, PageId, PageHashHasher> index_ GUARDED_BY(mu_);
  PageId lru_head_ GUARDED_BY(mu_) = -1;  // least recently used evictable page
  PageId lru_tail_ GUARDED_BY(mu_) = -1;
  int evictable_ GUARDED_BY(mu_) = 0;
  int used_ GUARDED_BY(mu_) = 0;
  int64_t evictions_ GUARDED_BY(mu_) = 0;
};

}  // namespace pdserve
