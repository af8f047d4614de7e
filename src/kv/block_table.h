// BlockTable: the pages one sequence's KV lives in, in token order (token t sits in page
// pages()[t / page_tokens], slot t % page_tokens). Bookkeeping only.
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
  // Adopts pages allocated elsewhere (e.g. by the messenger). Appended in order.
  void Append(std::span<const PageId> pages);
  // Returns the pages past the first ones that hold `tokens` tokens to the pool (speculative
  // decoding's rejected positions); a no-op if no page lies wholly past them.
  void Truncate(PagePool& pool, int64_t tokens);
  // Returns every page to the pool and empties the table.
  void Release(PagePool& pool);

  std::span<const PageId> pages() const { return pages_; }
  int64_t capacity_tokens() const { return static_cast<int64_t>(pages_.size()) * page_tokens_; }
  int page_tokens() const { return page_tokens_; }
  PageId PageOf(int64_t token) const { return pages_[token / page_tokens_]; }
  int SlotOf(int64_t token) const { return static_cast<int>(token % page_tokens_); }

 private:
  int page_tokens_;
  std::vector<PageId> pages_;
};

}  // namespace pdserve
