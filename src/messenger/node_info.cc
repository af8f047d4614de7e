#include "messenger/node_info.h"

#include <random>

#include <fmt/format.h>

#include "kv/shard_layout.h"
#include "kv/transfer_plan.h"

namespace pdserve::messenger {

Result<NodeInfo> MakeLocalNodeInfo(const KvLayout& cache, std::string memory,
                                   std::string model_fingerprint, std::string kernel_path) {
  NodeInfo info;
  info.kernel_path = std::move(kernel_path);
  info.model_fingerprint = std::move(model_fingerprint);
  PD_ASSIGN_OR_RETURN(info.kv.shards,
                      KvShardLayout::ForTensorParallel(cache.num_kv_heads, /*tp_size=*/1));
  info.kv.ranks = {cache};
  info.rank_memory = {std::move(memory)};
  return info;
}

Status CheckPeerCompatible(const NodeInfo& prefill, const NodeInfo& decode) {
  if (prefill.model_fingerprint != decode.model_fingerprint) {
    return Status::FailedPrecondition(
        fmt::format("model differs: prefill fingerprint '{}', decode fingerprint '{}'",
                    prefill.model_fingerprint, decode.model_fingerprint));
  }
  if (prefill.kernel_path != decode.kernel_path) {
    return Status::FailedPrecondition(fmt::format("kernel path differs: prefill '{}', decode '{}'",
                                                  prefill.kernel_path, decode.kernel_path));
  }
  // TransferPlan::Create checks heads, layers, head_dim, page size and dtype on every rank and
  // names the first mismatch with both values.
  Result<TransferPlan> plan = TransferPlan::Create(prefill.kv, decode.kv);
  if (!plan.ok()) {
    return Status::FailedPrecondition("KV layout differs: " + plan.status().message());
  }
  return Status::Ok();
}

uint64_t NewIncarnation() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) ^ rd();
  return v;
}

}  // namespace pdserve::messenger
