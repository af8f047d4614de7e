#include "messenger/peer_views.h"

#include <utility>

#include "common/logging.h"
#include "kv/kv_cache.h"

namespace pdserve::messenger {

Status PeerViews::Open(Engine& engine, fabric::TransferEngine& fabric) {
  if (!views_.empty() || !regions_.empty()) {
    return Status::FailedPrecondition("the peer's views are open already");
  }
  for (int r = 0; r < engine.tp_size(); ++r) {
    KvCache& cache = engine.kv_cache(r);
    PD_ASSIGN_OR_RETURN(RevocableMapping view,
                        RevocableMapping::Map(cache.fd(), cache.size_bytes()));
    views_.push_back(std::move(view));
    PD_ASSIGN_OR_RETURN(fabric::RegionId region,
                        fabric.RegisterMemory(views_.back().data(), cache.size_bytes()));
    regions_.push_back(region);
  }
  return Status::Ok();
}

void PeerViews::Retire(fabric::TransferEngine& fabric, bool revoke,
                       std::vector<RevocableMapping>* graveyard, std::string_view peer) {
  for (RevocableMapping& view : views_) {
    if (Status s = revoke ? view.Revoke() : Status::Ok(); !s.ok()) {
      // Short of the kernel refusing a mapping this cannot happen; the keys close below anyway.
      PD_LOG_ERROR("peer {}: revoking its view of the KV cache: {}", peer, s.ToString());
    }
    graveyard->push_back(std::move(view));
  }
  views_.clear();
  for (fabric::RegionId region : regions_) {
    if (Status s = fabric.DeregisterMemory(region); !s.ok()) {
      PD_LOG_ERROR("peer {}: closing its registration of the KV cache: {}", peer, s.ToString());
    }
  }
  regions_.clear();
}

}  // namespace pdserve::messenger
