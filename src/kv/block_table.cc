#include "kv/block_table.h"

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

void BlockTable::Release(PagePool& pool) {
  pool.Free(pages_);
  pages_.clear();
}

}  // namespace pdserve
