#include "kv/block_table.h"

#include <algorithm>

#include "common/check.h"

namespace pdserve {

Status BlockTable::EnsureCapacity(PagePool& pool, int64_t tokens) {
  int64_t needed = (tokens + page_tokens_ - 1) / page_tokens_ - static_cast<int64_t>(pages_.size());
  if (needed <= 0) return Status::Ok();
  PD_ASSIGN_OR_RETURN(auto fresh, pool.Allocate(static_cast<int>(needed)));
  pages_.insert(pages_.end(), fresh.begin(), fresh.end());
  return Status::Ok();
}

void BlockTable::Append(std::span<const PageId> pages) {
  pages_.insert(pages_.end(), pages.begin(), pages.end());
}

void BlockTable::AppendCached(std::span<const PageId> pages) {
  PD_CHECK_MSG(pages_.empty(), "cached pages go first into an empty table");
  pages_.assign(pages.begin(), pages.end());
  sealed_pages_ = static_cast<int>(pages_.size());
}

void BlockTable::Seal(int pages) {
  PD_CHECK(pages >= 0 && static_cast<size_t>(pages) <= pages_.size());
  sealed_pages_ = std::max(sealed_pages_, pages);
}

void BlockTable::Truncate(PagePool& pool, int64_t tokens) {
  const size_t keep =
      static_cast<size_t>((std::max<int64_t>(tokens, 0) + page_tokens_ - 1) / page_tokens_);
  if (keep >= pages_.size()) return;
  PD_CHECK_MSG(keep >= static_cast<size_t>(sealed_pages_), "truncating a sealed page");
  pool.Free(std::span<const PageId>(pages_).subspan(keep));
  pages_.resize(keep);
}

void BlockTable::Release(PagePool& pool) {
  pool.Free(pages_);
  pages_.clear();
  sealed_pages_ = 0;
}

}  // namespace pdserve
