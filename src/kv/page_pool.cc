#include "kv/page_pool.h"

#include <fmt/format.h>

#include "common/check.h"

namespace pdserve {

PagePool::PagePool(int num_pages) : capacity_(num_pages), allocated_(num_pages, 0) {
  PD_CHECK(num_pages >= 0);
  free_list_.reserve(num_pages);
  for (PageId p = num_pages - 1; p >= 0; --p) free_list_.push_back(p);
}

Result<std::vector<PageId>> PagePool::Allocate(int n) {
  if (n < 0) return Status::InvalidArgument("negative page count");
  MutexLock lock(&mu_);
  if (static_cast<size_t>(n) > free_list_.size()) {
    return Status::ResourceExhausted(fmt::format("KV page pool: {} pages requested, {} of {} free",
                                                 n, free_list_.size(), capacity_));
  }
  std::vector<PageId> pages(free_list_.end() - n, free_list_.end());
  free_list_.resize(free_list_.size() - n);
  for (PageId p : pages) allocated_[p] = 1;
  return pages;
}

void PagePool::Free(std::span<const PageId> pages) {
  MutexLock lock(&mu_);
  for (PageId p : pages) {
    PD_CHECK_MSG(p >= 0 && p < capacity_, "page id out of range");
    PD_CHECK_MSG(allocated_[p] == 1, "page freed twice or never allocated");
    allocated_[p] = 0;
    free_list_.push_back(p);
  }
}

int PagePool::used() const {
  MutexLock lock(&mu_);
  return capacity_ - static_cast<int>(free_list_.size());
}

int PagePool::free_pages() const {
  MutexLock lock(&mu_);
  return static_cast<int>(free_list_.size());
}

}  // namespace pdserve
