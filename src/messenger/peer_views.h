// PeerViews: every rank's KV cache as views of one peer's own (common/revocable_mapping.h),
// each registered with the fabric engine for that peer alone. A messenger gives a peer nothing
// else: a decode node's keys name its views for that prefill node, and a prefill node's writes
// to a decode node read its views for that node. Retire() after RemovePeer revokes them, so
// whatever the transport still moves for the peer — the rest of a tcp write arriving at the
// decode node, a write the prefill node's provider is still sending — touches throwaway memory,
// never pages released and reused since (docs/messenger.md, "States").
//
// Thread-compatible: used from the messenger's control loop.
#pragma once

#include <string_view>
#include <vector>

#include "common/revocable_mapping.h"
#include "common/status.h"
#include "engine/engine.h"
#include "fabric/transfer_engine.h"

namespace pdserve::messenger {

class PeerViews {
 public:
  // Maps and registers every rank's cache of `engine`, in rank order. On an error what was
  // made so far stays, and Retire releases it. Refused while open (Retire first).
  Status Open(Engine& engine, fabric::TransferEngine& fabric);
  // One registered region per rank (rank order).
  const std::vector<fabric::RegionId>& regions() const { return regions_; }
  // Revokes the views (unless `revoke` is false: nothing of the peer can be in flight), closes
  // the registrations and moves the views to `graveyard`, which must outlive `fabric` (a
  // provider may go on using the addresses until the engine is gone). `peer` names the peer
  // in error logs. Afterwards the object is empty.
  void Retire(fabric::TransferEngine& fabric, bool revoke, std::vector<RevocableMapping>* graveyard,
              std::string_view peer);

 private:
  std::vector<RevocableMapping> views_;
  std::vector<fabric::RegionId> regions_;
};

}  // namespace pdserve::messenger
