#include "model/tp_slices.h"

#include <algorithm>

#include <fmt/format.h>

#include "kv/shard_layout.h"

namespace pdserve {
namespace {

// Rank `rank`'s contiguous share of `n` output columns, in whole 64-column blocks of the
// packed BF16 layout (the last ranks' shares may be shorter, or empty for a small n).
DimRange ColumnShare(int n, int rank, int size) {
  constexpr int kBlock = 64;
  const int per_rank = (n + size - 1) / size;
  const int share = (per_rank + kBlock - 1) / kBlock * kBlock;
  const int begin = std::min(n, rank * share);
  return {begin, std::min(n, begin + share)};
}

}  // namespace

Result<TpSlices> TpSlices::Create(const ModelConfig& config, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return Status::InvalidArgument(fmt::format("tensor-parallel rank {} of {}", rank, size));
  }
  PD_ASSIGN_OR_RETURN(KvShardLayout shards,
                      KvShardLayout::ForTensorParallel(config.num_kv_heads, size));
  TpSlices t;
  t.rank = rank;
  t.size = size;
  const HeadRange kv = shards.heads(rank);
  t.kv_heads = {kv.begin, kv.end};
  // Query heads: those of this rank's KV heads; the replicas of a KV head split them.
  const int group = config.num_heads / config.num_kv_heads;
  const int replicas = static_cast<int>(shards.group_ranks(shards.group_of(rank)).size());
  if (group % replicas != 0) {
    return Status::InvalidArgument(fmt::format(
        "TP {}: the {} query heads of a KV head cannot be split between its {} replica ranks", size,
        group, replicas));
  }
  const int per_replica = group / replicas;
  t.q_heads.begin = kv.begin * group + shards.replica_index(rank) * per_replica;
  t.q_heads.end = t.q_heads.begin + kv.size() * group / replicas;
  t.hidden = ColumnShare(config.hidden_size, rank, size);
  t.intermediate = ColumnShare(config.intermediate_size, rank, size);
  t.expert_intermediate = ColumnShare(config.moe.expert_intermediate, rank, size);
  t.shared_intermediate =
      ColumnShare(config.moe.expert_intermediate * config.moe.shared_experts, rank, size);
  t.vocab = ColumnShare(config.vocab_size, rank, size);
  return t;
}

}  // namespace pdserve
