#include "kv/page_pool.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/check.h"

namespace pdserve {

PagePool::PagePool(int num_pages) : capacity_(num_pages) {
  PD_CHECK(num_pages >= 0);
  MutexLock lock(&mu_);
  pages_.resize(num_pages);
  free_list_.reserve(num_pages);
  for (PageId p = num_pages - 1; p >= 0; --p) free_list_.push_back(p);
}

Result<std::vector<PageId>> PagePool::Allocate(int n) {
  if (n < 0) return Status::InvalidArgument("negative page count");
  MutexLock lock(&mu_);
  const size_t available = free_list_.size() + static_cast<size_t>(evictable_);
  if (static_cast<size_t>(n) > available) {
    return Status::ResourceExhausted(
        fmt::format("KV page pool: {} pages requested, {} of {} free", n, available, capacity_));
  }
  const size_t from_free = std::min(static_cast<size_t>(n), free_list_.size());
  std::vector<PageId> pages(free_list_.end() - static_cast<ptrdiff_t>(from_free), free_list_.end());
  free_list_.resize(free_list_.size() - from_free);
  while (pages.size() < static_cast<size_t>(n)) {
    const PageId victim = lru_head_;
    LruRemove(victim);
    Unregister(victim);
    ++evictions_;
    pages.push_back(victim);
  }
  for (PageId p : pages) pages_[p].refs = 1;
  used_ += n;
  return pages;
}

void PagePool::Free(std::span<const PageId> pages) {
  MutexLock lock(&mu_);
  // Backwards: a span's last page enters the LRU first, so it is evicted first.
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) {
    PD_CHECK_MSG(*it >= 0 && *it < capacity_, "page id out of range");
    Page& page = pages_[*it];
    PD_CHECK_MSG(page.refs > 0, "page freed twice or never allocated");
    if (--page.refs > 0) continue;
    --used_;
    if (page.registered) {
      LruPushBack(*it);
    } else {
      free_list_.push_back(*it);
    }
  }
}

bool PagePool::Register(PageId page, const PageHash& hash, const PageHash& parent,
                        std::span<const int32_t> tokens) {
  MutexLock lock(&mu_);
  PD_CHECK_MSG(page >= 0 && page < capacity_, "page id out of range");
  Page& p = pages_[page];
  PD_CHECK_MSG(p.refs > 0, "only a referenced page may be registered");
  if (p.registered || !index_.emplace(hash, page).second) return false;
  p.registered = true;
  p.hash = hash;
  p.parent = parent;
  p.tokens.assign(tokens.begin(), tokens.end());
  return true;
}

PageId PagePool::MatchLocked(std::span<const PageHash> hashes, const PrefixHasher& hasher,
                             std::span<const int32_t> tokens, size_t i) const {
  auto it = index_.find(hashes[i]);
  if (it == index_.end()) return -1;
  const Page& p = pages_[it->second];
  const PageHash& parent = i == 0 ? hasher.seed() : hashes[i - 1];
  const std::span<const int32_t> want = hasher.IdentityOf(tokens, i);
  if (!(p.parent == parent) ||
      !std::equal(want.begin(), want.end(), p.tokens.begin(), p.tokens.end())) {
    return -1;  // a hash collision: treat as a miss
  }
  return it->second;
}

std::vector<PageId> PagePool::AcquireCached(std::span<const PageHash> hashes,
                                            const PrefixHasher& hasher,
                                            std::span<const int32_t> tokens) {
  PD_CHECK(hasher.HashablePages(tokens.size()) >= hashes.size());
  std::vector<PageId> hit;
  MutexLock lock(&mu_);
  for (size_t i = 0; i < hashes.size(); ++i) {
    const PageId p = MatchLocked(hashes, hasher, tokens, i);
    if (p < 0) break;
    hit.push_back(p);
  }
  for (PageId p : hit) {
    if (pages_[p].refs++ > 0) continue;
    LruRemove(p);
    ++used_;
  }
  return hit;
}

int PagePool::CachedPrefixPages(std::span<const PageHash> hashes, const PrefixHasher& hasher,
                                std::span<const int32_t> tokens) const {
  PD_CHECK(hasher.HashablePages(tokens.size()) >= hashes.size());
  MutexLock lock(&mu_);
  size_t i = 0;
  while (i < hashes.size() && MatchLocked(hashes, hasher, tokens, i) >= 0) ++i;
  return static_cast<int>(i);
}

void PagePool::LruPushBack(PageId p) {
  Page& page = pages_[p];
  page.lru_prev = lru_tail_;
  page.lru_next = -1;
  if (lru_tail_ >= 0) {
    pages_[lru_tail_].lru_next = p;
  } else {
    lru_head_ = p;
  }
  lru_tail_ = p;
  ++evictable_;
}

void PagePool::LruRemove(PageId p) {
  Page& page = pages_[p];
  if (page.lru_prev >= 0) {
    pages_[page.lru_prev].lru_next = page.lru_next;
  } else {
    lru_head_ = page.lru_next;
  }
  if (page.lru_next >= 0) {
    pages_[page.lru_next].lru_prev = page.lru_prev;
  } else {
    lru_tail_ = page.lru_prev;
  }
  page.lru_prev = page.lru_next = -1;
  --evictable_;
}

void PagePool::Unregister(PageId p) {
  Page& page = pages_[p];
  index_.erase(page.hash);
  page.registered = false;
  page.tokens.clear();
}

int PagePool::used() const {
  MutexLock lock(&mu_);
  return used_;
}

int PagePool::free_pages() const {
  MutexLock lock(&mu_);
  return static_cast<int>(free_list_.size()) + evictable_;
}

int PagePool::cached_pages() const {
  MutexLock lock(&mu_);
  return static_cast<int>(index_.size());
}

int PagePool::evictable_pages() const {
  MutexLock lock(&mu_);
  return evictable_;
}

int64_t PagePool::evictions() const {
  MutexLock lock(&mu_);
  return evictions_;
}

}  // namespace pdserve
