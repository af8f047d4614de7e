// The local node's handshake description (NodeInfo) and the check a node applies to its
// peer's: same protocol assumptions, model, kernel path and a KV layout the transfer plan
// accepts. Pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "fabric/descriptors.h"
#include "kv/layout.h"
#include "messenger/protocol.h"

namespace pdserve::messenger {

// A node of rank_layouts.size() tensor-parallel ranks over a model of `total_kv_heads` KV heads
// (the model config's, not one rank's share): the shards are the usual split
// (KvShardLayout::ForTensorParallel) and rank r's cache layout must hold exactly the heads its
// shard gives it (InvalidArgument otherwise, naming the rank). `rank_memory[r]` is the
// serialised fabric::MemoryDescriptor of rank r's cache region ("" where the cache is never a
// write target, i.e. on a prefill node); one per rank.
Result<NodeInfo> MakeLocalNodeInfo(int total_kv_heads, std::span<const KvLayout> rank_layouts,
                                   std::vector<std::string> rank_memory,
                                   std::string model_fingerprint, std::string kernel_path);

// Ok, or FailedPrecondition whose message names every difference with both values. Model
// fingerprints that are both ModelIdentity strings (common/model_identity.h) are compared field
// by field, so the message says whether the config (architecture, shape) differs or only the
// weights (another checkpoint, same config); any other differing strings are named whole.
// `prefill` and `decode` are the two sides of the pair, whichever one is local.
Status CheckPeerCompatible(const NodeInfo& prefill, const NodeInfo& decode);

// A fresh random incarnation id (never 0).
uint64_t NewIncarnation();

// A transfer engine's address as a prefill node publishes it over HTTP
// (/internal/messenger/fabric_address): the hex of its encoding; and back (errors say what is
// malformed).
std::string PublishedAddress(const fabric::TransferEngineAddress& address);
Result<fabric::TransferEngineAddress> ParsePublishedAddress(std::string_view hex);

}  // namespace pdserve::messenger
