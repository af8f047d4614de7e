// Requests and completions of the transfer engine: what a caller posts (paged writes, single
// writes, immediate-only writes, messages) and how it learns each one's terminal status.
// Plain types except TransferCounter, which is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "fabric/descriptors.h"

namespace pdserve::fabric {

using PeerId = uint32_t;
inline constexpr PeerId kUnknownPeer = 0;  // sender not (or no longer) added as a peer
using RegionId = uint32_t;

// Counts finished transfers for callers that poll or wait instead of taking callbacks.
// Thread-safe.
class TransferCounter {
 public:
  void Record(const Status& status) EXCLUDES(mu_);
  uint64_t succeeded() const { return succeeded_.load(std::memory_order_acquire); }
  uint64_t failed() const { return failed_.load(std::memory_order_acquire); }
  uint64_t finished() const { return succeeded() + failed(); }
  Status first_error() const EXCLUDES(mu_);
  // True once finished() >= n; false if `deadline` passes first.
  bool WaitFor(uint64_t n, Deadline deadline) const EXCLUDES(mu_);

 private:
  std::atomic<uint64_t> succeeded_{0};
  std::atomic<uint64_t> failed_{0};
  mutable Mutex mu_;
  mutable CondVar cv_;
  Status first_error_ GUARDED_BY(mu_);
};

// How a transfer reports its end: the callback (run on a progress thread; keep it short and
// never block in it) and/or the counter (must outlive the transfer). Exactly one terminal
// Status per posted transfer: Ok, Unavailable (the provider reported an error),
// DeadlineExceeded, or Cancelled (peer removed, engine shut down).
struct Completion {
  std::function<void(const Status&)> callback;
  TransferCounter* counter = nullptr;
};

// src pages -> dst pages: page i moves `length` bytes from
//   src region + src_offset + src_pages[i] * src_stride
// to
//   dst + dst_offset + dst_pages[i] * dst_stride,
// with `immediate` (when set) delivered to the receiver with every page. The page lists are
// only read during the Post call.
struct PagedWrite {
  RegionId src_region = 0;
  uint64_t src_offset = 0;
  uint64_t src_stride = 0;
  std::span<const uint32_t> src_pages;
  PeerId peer = kUnknownPeer;
  const MemoryDescriptor* dst = nullptr;  // read during the Post call only
  uint64_t dst_offset = 0;
  uint64_t dst_stride = 0;
  std::span<const uint32_t> dst_pages;
  uint64_t length = 0;  // bytes per page, > 0
  std::optional<uint32_t> immediate;
  std::optional<Deadline> deadline;  // default: FabricConfig::default_transfer_timeout
};

struct SingleWrite {
  RegionId src_region = 0;
  uint64_t src_offset = 0;
  PeerId peer = kUnknownPeer;
  const MemoryDescriptor* dst = nullptr;
  uint64_t dst_offset = 0;
  uint64_t length = 0;  // > 0; for no payload use PostImmediate
  std::optional<uint32_t> immediate;
  std::optional<Deadline> deadline;
};

}  // namespace pdserve::fabric
