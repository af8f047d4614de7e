// PagePool: bookkeeping of which KV pages are free. No storage, no tensors.
// Thread-safe (one mutex guards it), but in pdserve only the engine's loop thread allocates and
// frees pages (the scheduler, and the engine as requests end or their held pages are released;
// at destruction, once the loop has stopped). Messenger threads never touch the pool: they hand
// pages back through Engine::ReleaseHeldPages, which posts to the loop. Other threads only read
// the counters (tests, through Engine::page_pool()).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "kv/layout.h"

namespace pdserve {

class PagePool {
 public:
  explicit PagePool(int num_pages);
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // All-or-nothing: n pages, or ResourceExhausted and nothing allocated.
  Result<std::vector<PageId>> Allocate(int n) EXCLUDES(mu_);
  // Returns pages to the pool. A page that is not allocated (double free, out of range) is a
  // programmer error and aborts: a page must never be handed out twice.
  void Free(std::span<const PageId> pages) EXCLUDES(mu_);

  int capacity() const { return capacity_; }
  int used() const EXCLUDES(mu_);
  int free_pages() const EXCLUDES(mu_);
  double usage() const { return capacity_ == 0 ? 0.0 : static_cast<double>(used()) / capacity_; }

 private:
  const int capacity_;
  mutable Mutex mu_;
  std::vector<PageId> free_list_ GUARDED_BY(mu_);  // a stack, lowest ids on top
  std::vector<uint8_t> allocated_ GUARDED_BY(mu_);
};

}  // namespace pdserve
