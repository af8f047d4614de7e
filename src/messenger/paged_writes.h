// How the prefill side turns one layer's planned writes for a run of pages into paged writes
// (LayerStreamer): TransferPlan::AppendLayerWrites emits, page after page, the same routes, so
// write k of every page moves the same length between the same two ranks at offsets one block
// stride apart per page id (the layout is layer-major). Each such column becomes one
// fabric::PagedWrite from the source rank's registered region to the destination rank's
// memory descriptor. Pure function; safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "kv/transfer_plan.h"

namespace pdserve::messenger {

// Write k of every page: page i moves `length` bytes from src_base + src_stride * pages[i].src
// in src_rank's cache region to dst_base + dst_stride * pages[i].dst in dst_rank's (a base is
// where page 0's bytes would be: offsets are linear in the page id within a layer).
struct PagedColumn {
  int src_rank = 0;
  int dst_rank = 0;
  uint64_t src_base = 0;
  uint64_t src_stride = 0;
  uint64_t dst_base = 0;
  uint64_t dst_stride = 0;
  uint64_t length = 0;
  friend bool operator==(const PagedColumn&, const PagedColumn&) = default;
};

// Groups `writes` — AppendLayerWrites of `pages` for one layer of `plan` — into columns, in
// the plan's route order. Internal if the writes are not that shape (an uneven count per page,
// a column that changes length, ranks or stride) or name a rank outside either side.
Result<std::vector<PagedColumn>> GroupPagedWrites(const TransferPlan& plan,
                                                  std::span<const PagePair> pages,
                                                  std::span<const KvWrite> writes);

}  // namespace pdserve::messenger
