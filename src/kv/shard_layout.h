// KvShardLayout: how one side's tensor-parallel ranks split the model's KV heads
// (DESIGN.md §4). Each rank holds one contiguous range of heads; ranks whose ranges are
// identical form a replica group (kv_heads < TP, or a latent cache shared by all ranks), and
// the groups' ranges partition the model's heads. Pure bookkeeping; plain value type,
// thread-compatible.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve {

// Heads [begin, end) of the full model.
struct HeadRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
  friend bool operator==(const HeadRange&, const HeadRange&) = default;
};

class KvShardLayout {
 public:
  // Ranks, heads and head-range caps; far above any real deployment, they bound what a
  // peer's handshake may ask for.
  static constexpr int kMaxRanks = 1024;
  static constexpr int kMaxKvHeads = 1 << 12;

  KvShardLayout() = default;  // no ranks; only a placeholder to assign over

  // Checks that every range is non-empty and inside [0, total_kv_heads), that any two ranges
  // are identical or disjoint, and that together they cover every head.
  static Result<KvShardLayout> Create(int total_kv_heads, std::vector<HeadRange> rank_heads);

  // The usual tensor-parallel split. kv_heads >= tp: contiguous ranges, the first
  // (kv_heads % tp) ranks one head more. kv_heads < tp: rank r holds head r * kv_heads / tp,
  // so the replicas of a head are consecutive ranks.
  static Result<KvShardLayout> ForTensorParallel(int total_kv_heads, int tp_size);

  int total_kv_heads() const { return total_kv_heads_; }
  int tp_size() const { return static_cast<int>(rank_heads_.size()); }
  const std::vector<HeadRange>& rank_heads() const { return rank_heads_; }
  // Precondition for the rank and group accessors: the index is in range.
  const HeadRange& heads(int rank) const { return rank_heads_[rank]; }

  // Replica groups, ordered by their first head; each lists its ranks in ascending order.
  int num_groups() const { return static_cast<int>(groups_.size()); }
  const std::vector<int>& group_ranks(int group) const { return groups_[group]; }
  const HeadRange& group_heads(int group) const { return rank_heads_[groups_[group][0]]; }
  int group_of(int rank) const { return group_of_[rank]; }
  // Position of `rank` within its replica group.
  int replica_index(int rank) const { return replica_index_[rank]; }

  std::string ToString() const;
  friend bool operator==(const KvShardLayout& a, const KvShardLayout& b) {
    return a.total_kv_heads_ == b.total_kv_heads_ && a.rank_heads_ == b.rank_heads_;
  }

 private:
  int total_kv_heads_ = 0;
  std::vector<HeadRange> rank_heads_;
  // Derived from rank_heads_ by Create.
  std::vector<std::vector<int>> groups_;
  std::vector<int> group_of_;
  std::vector<int> replica_index_;
};

}  // namespace pdserve
