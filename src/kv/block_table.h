// BlockTable: the pages one sequence's KV lives in, in token order (token t sits in page
// pages()[t / page_tokens], slot t % page_tokens). Bookkeeping only.
//
// The table holds one reference (PagePool) on each of its pages. Its leading sealed pages hold
// final KV in every slot: they are never written again, so they may be shared with other
// sequences (pages taken from the prefix cache are sealed from the start, and a sequence's own
// pages are sealed as their KV completes). Sealed pages never shrink away: Truncate keeps them.
// Thread-compatible: owned by one sequence, used by the thread that schedules it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "kv/layout.h"
#include "kv/page_pool.h"

namespace pdserve {

class BlockTable {
 public:
  explicit BlockTable(int page_tokens) : page_tokens_(page_tokens) {}
  BlockTable(BlockTable&&) = default;
  BlockTable& operator=(BlockTable&&) = default;
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  // Allocates pages until `tokens` fit. All-or-nothing: on ResourceExhausted nothing changed.
  Status EnsureCapacity(PagePool& pool, int64_t tokens);
  // Adopts pages allocated elsewhere (e.g. by the messenger), with the reference taken for
  // them. Appended in order.
  void Append(std::span<const PageId> pages);
  // Adopts pages taken from the prefix cache (PagePool::AcquireCached, which took their
  // references) as the table's first, sealed pages. Precondition: the table is empty.
  void AppendCached(std::span<const PageId> pages);
  // The first `pages` pages hold final KV. Precondition: pages <= pages().size(); a no-op if
  // no more than sealed_pages().
  void Seal(int pages);
  // Drops the pages past the first ones that hold `tokens` tokens (speculative decoding's
  // rejected positions); a no-op if no page lies wholly past them. Precondition: the sealed
  // pages stay (tokens >= sealed_tokens(); aborts otherwise).
  void Truncate(PagePool& pool, int64_t tokens);
  // Drops every page and empties the table.
  void Release(PagePool& pool);

  std::span<const PageId> pages() const { return pages_; }
  int sealed_pages() const { return sealed_pages_; }
  int64_t sealed_tokens() const { return static_cast<int64_t>(sealed_pages_) * page_tokens_; }
  int64_t capacity_tokens() const { return static_cast<int64_t>(pages_.size()) * page_tokens_; }
  int page_tokens() const { return page_tokens_; }
  PageId PageOf(int64_t token) const { return pages_[token / page_tokens_]; }
  int SlotOf(int64_t token) const { return static_cast<int>(token % page_tokens_); }

 private:
  int page_tokens_;
  int sealed_pages_ = 0;
  std::vector<PageId> pages_;
};

}  // namespace pdserve
