#include "kv/shard_layout.h"

#include <algorithm>

#include <fmt/format.h>

namespace pdserve {

Result<KvShardLayout> KvShardLayout::Create(int total_kv_heads, std::vector<HeadRange> rank_heads) {
  if (total_kv_heads < 1 || total_kv_heads > kMaxKvHeads) {
    return Status::InvalidArgument(
        fmt::format("shard layout: {} KV heads (must be 1..{})", total_kv_heads, kMaxKvHeads));
  }
  if (rank_heads.empty() || rank_heads.size() > static_cast<size_t>(kMaxRanks)) {
    return Status::InvalidArgument(
        fmt::format("shard layout: {} ranks (must be 1..{})", rank_heads.size(), kMaxRanks));
  }
  for (size_t r = 0; r < rank_heads.size(); ++r) {
    const HeadRange& h = rank_heads[r];
    if (h.begin < 0 || h.begin >= h.end || h.end > total_kv_heads) {
      return Status::InvalidArgument(fmt::format(
          "shard layout: rank {} holds heads [{}, {}), not a non-empty range of [0, {})", r,
          h.begin, h.end, total_kv_heads));
    }
  }
  KvShardLayout layout;
  layout.total_kv_heads_ = total_kv_heads;
  layout.rank_heads_ = std::move(rank_heads);
  const int tp = layout.tp_size();
  std::vector<int> by_begin(tp);
  for (int r = 0; r < tp; ++r) by_begin[r] = r;
  std::stable_sort(by_begin.begin(), by_begin.end(), [&](int a, int b) {
    return layout.rank_heads_[a].begin < layout.rank_heads_[b].begin;
  });
  // Walking ranks by first head: a rank either repeats the current group's range exactly or
  // starts the next group right where the current one ends (no overlap, no gap).
  layout.group_of_.assign(tp, 0);
  layout.replica_index_.assign(tp, 0);
  int covered = 0;
  for (int r : by_begin) {
    const HeadRange& h = layout.rank_heads_[r];
    if (!layout.groups_.empty() && h == layout.group_heads(layout.num_groups() - 1)) {
      layout.replica_index_[r] = static_cast<int>(layout.groups_.back().size());
      layout.groups_.back().push_back(r);
    } else if (h.begin == covered) {
      layout.groups_.push_back({r});
      covered = h.end;
    } else {
      return Status::InvalidArgument(fmt::format(
          "shard layout: rank {} holds heads [{}, {}), which {} the heads held by other ranks", r,
          h.begin, h.end, h.begin < covered ? "partly overlap" : "leave a gap before"));
    }
    layout.group_of_[r] = layout.num_groups() - 1;
  }
  if (covered != total_kv_heads) {
    return Status::InvalidArgument(
        fmt::format("shard layout: heads [{}, {}) are held by no rank", covered, total_kv_heads));
  }
  return layout;
}

Result<KvShardLayout> KvShardLayout::ForTensorParallel(int total_kv_heads, int tp_size) {
  if (tp_size < 1 || tp_size > kMaxRanks || total_kv_heads < 1) {
    return Status::InvalidArgument(
        fmt::format("shard layout: TP {} over {} KV heads", tp_size, total_kv_heads));
  }
  std::vector<HeadRange> heads(tp_size);
  if (total_kv_heads >= tp_size) {
    const int base = total_kv_heads / tp_size, extra = total_kv_heads % tp_size;
    for (int r = 0; r < tp_size; ++r) {
      heads[r].begin = r * base + std::min(r, extra);
      heads[r].end = heads[r].begin + base + (r < extra ? 1 : 0);
    }
  } else {
    for (int r = 0; r < tp_size; ++r) {
      heads[r].begin = r * total_kv_heads / tp_size;
      heads[r].end = heads[r].begin + 1;
    }
  }
  return Create(total_kv_heads, std::move(heads));
}

std::string KvShardLayout::ToString() const {
  std::string out = fmt::format("kv_heads={} ranks=[", total_kv_heads_);
  for (int r = 0; r < tp_size(); ++r) {
    out += fmt::format("{}{}:{}", r == 0 ? "" : " ", rank_heads_[r].begin, rank_heads_[r].end);
  }
  return out + "]";
}

}  // namespace pdserve
