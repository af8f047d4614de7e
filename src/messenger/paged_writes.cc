#include "messenger/paged_writes.h"

#include <fmt/format.h>

namespace pdserve::messenger {

Result<std::vector<PagedColumn>> GroupPagedWrites(const TransferPlan& plan,
                                                  std::span<const PagePair> pages,
                                                  std::span<const KvWrite> writes) {
  const size_t n = pages.size();
  const size_t per_page = n == 0 ? 0 : writes.size() / n;
  if (per_page == 0 || per_page * n != writes.size()) {
    return Status::Internal(
        fmt::format("transfer plan wrote {} writes for {} pages: not a whole number per page",
                    writes.size(), n));
  }
  const int src_ranks = plan.source().shards.tp_size();
  const int dst_ranks = plan.destination().shards.tp_size();
  std::vector<PagedColumn> columns;
  columns.reserve(per_page);
  for (size_t k = 0; k < per_page; ++k) {
    const KvWrite& first = writes[k];
    if (first.src_rank < 0 || first.src_rank >= src_ranks || first.dst_rank < 0 ||
        first.dst_rank >= dst_ranks) {
      return Status::Internal(fmt::format("planned write from rank {} to rank {}: out of range",
                                          first.src_rank, first.dst_rank));
    }
    PagedColumn c{.src_rank = first.src_rank,
                  .dst_rank = first.dst_rank,
                  .src_stride = plan.source().ranks[first.src_rank].block_bytes(),
                  .dst_stride = plan.destination().ranks[first.dst_rank].block_bytes(),
                  .length = first.length};
    c.src_base = first.src_offset - c.src_stride * static_cast<uint64_t>(pages[0].src);
    c.dst_base = first.dst_offset - c.dst_stride * static_cast<uint64_t>(pages[0].dst);
    for (size_t i = 1; i < n; ++i) {
      const KvWrite& w = writes[i * per_page + k];
      if (w.length != c.length || w.src_rank != c.src_rank || w.dst_rank != c.dst_rank ||
          w.src_offset != c.src_base + c.src_stride * static_cast<uint64_t>(pages[i].src) ||
          w.dst_offset != c.dst_base + c.dst_stride * static_cast<uint64_t>(pages[i].dst)) {
        return Status::Internal("transfer plan's writes of one layer are not page-strided");
      }
    }
    columns.push_back(c);
  }
  return columns;
}

}  // namespace pdserve::messenger
