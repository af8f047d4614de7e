#include "messenger/node_info.h"

#include <random>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/model_identity.h"
#include "kv/shard_layout.h"
#include "kv/transfer_plan.h"

namespace pdserve::messenger {

Result<NodeInfo> MakeLocalNodeInfo(int total_kv_heads, std::span<const KvLayout> rank_layouts,
                                   std::vector<std::string> rank_memory,
                                   std::string model_fingerprint, std::string kernel_path) {
  const int ranks = static_cast<int>(rank_layouts.size());
  if (rank_memory.size() != rank_layouts.size()) {
    return Status::InvalidArgument(
        fmt::format("{} rank layouts but {} memory descriptors", ranks, rank_memory.size()));
  }
  NodeInfo info;
  info.kernel_path = std::move(kernel_path);
  info.model_fingerprint = std::move(model_fingerprint);
  PD_ASSIGN_OR_RETURN(info.kv.shards, KvShardLayout::ForTensorParallel(total_kv_heads, ranks));
  for (int r = 0; r < ranks; ++r) {
    const KvLayout& layout = rank_layouts[r];
    if (layout.num_kv_heads != info.kv.shards.heads(r).size()) {
      return Status::InvalidArgument(fmt::format(
          "rank {} cache holds {} KV heads but its shard of {} heads over {} ranks "
          "is {}",
          r, layout.num_kv_heads, total_kv_heads, ranks, info.kv.shards.heads(r).size()));
    }
  }
  info.kv.ranks.assign(rank_layouts.begin(), rank_layouts.end());
  info.rank_memory = std::move(rank_memory);
  return info;
}

namespace {

void AddModelDifferences(const std::string& prefill, const std::string& decode,
                         std::vector<std::string>* problems) {
  if (prefill == decode) return;
  Result<ModelIdentity> p = ModelIdentity::Parse(prefill);
  Result<ModelIdentity> d = ModelIdentity::Parse(decode);
  if (p.ok() && d.ok()) {
    for (std::string& difference : ModelIdentity::Compare(*p, "prefill", *d, "decode")) {
      problems->push_back(std::move(difference));
    }
    return;
  }
  // Not both identities (a peer of another build or another kind of fingerprint): whole.
  problems->push_back(
      fmt::format("model differs: prefill fingerprint '{}', decode '{}'", prefill, decode));
}

}  // namespace

Status CheckPeerCompatible(const NodeInfo& prefill, const NodeInfo& decode) {
  std::vector<std::string> problems;
  AddModelDifferences(prefill.model_fingerprint, decode.model_fingerprint, &problems);
  if (prefill.kernel_path != decode.kernel_path) {
    problems.push_back(fmt::format("kernel path differs: prefill '{}', decode '{}'",
                                   prefill.kernel_path, decode.kernel_path));
  }
  // TransferPlan::Create checks heads, layers, head_dim, page size and dtype on every rank and
  // names the first mismatch with both values.
  Result<TransferPlan> plan = TransferPlan::Create(prefill.kv, decode.kv);
  if (!plan.ok()) problems.push_back("KV layout differs: " + plan.status().message());
  if (problems.empty()) return Status::Ok();
  std::string message = problems[0];
  for (size_t i = 1; i < problems.size(); ++i) message += "; " + problems[i];
  return Status::FailedPrecondition(message);
}

uint64_t NewIncarnation() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) ^ rd();
  return v;
}

std::string PublishedAddress(const fabric::TransferEngineAddress& address) {
  return fabric::HexEncode(address.Serialize());
}

Result<fabric::TransferEngineAddress> ParsePublishedAddress(std::string_view hex) {
  PD_ASSIGN_OR_RETURN(std::string bytes, fabric::HexDecode(hex));
  return fabric::TransferEngineAddress::Parse(bytes);
}

}  // namespace pdserve::messenger
