// TransferEngine: one per node. Moves bytes between registered memory of engines in other
// processes (or hosts) over libfabric RDM endpoints: paged and single RMA writes with 32-bit
// immediates, immediate-only writes, receiver-side immediate counters, and small two-sided
// control messages on the same endpoints. See docs/fabric.md.
//
// Thread-safety: every public method may be called from any thread, except that AddPeer,
// RemovePeer, RegisterMemory, DeregisterMemory and the destructor must not be called from an
// engine callback (they wait for the progress threads, on which callbacks run; AddPeer and
// RemovePeer refuse with FailedPrecondition). Callbacks (completions, expectations, handlers) run
// on progress threads: keep them short, never block in them; posting from them is fine.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "fabric/config.h"
#include "fabric/descriptors.h"
#include "fabric/immediate_counters.h"
#include "fabric/topology.h"
#include "fabric/transfer.h"

namespace pdserve::fabric {

namespace internal {
class Domain;
class TransferEngineEvents;
}  // namespace internal

enum class MemoryKind : uint8_t {
  kHost,
  kDevice,  // extension point: FI_HMEM registration (not implemented yet)
};

struct TransferEngineHandlers {
  // A control message. `from` is kUnknownPeer when the sender has not been added (e.g. its
  // first handshake message) or was removed (it may be handshaking again: a stalled peer that
  // came back); `sender_instance` is TransferEngineAddress::instance of the sender.
  std::function<void(PeerId from, uint64_t sender_instance, std::span<const std::byte> payload)>
      on_message;
  // An immediate that no expectation is waiting for. Return true to consume it; false to have
  // it remembered for a later Expect. Unset: every such immediate is remembered.
  std::function<bool(PeerId from, uint32_t imm)> on_unmatched_immediate;
  // The first error of a peer (an operation to it failed); see PeerError.
  std::function<void(PeerId peer, const Status& error)> on_peer_error;
};

struct TransferEngineStats {
  uint64_t messages_dropped = 0;  // malformed
};

class TransferEngine {
 public:
  static Result<std::unique_ptr<TransferEngine>> Create(const FabricConfig& config,
                                                        TransferEngineHandlers handlers = {});
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;
  // Ends every outstanding transfer and expectation with Cancelled, then closes the fabric.
  ~TransferEngine();

  const TransferEngineAddress& address() const { return address_; }
  int num_domains() const { return static_cast<int>(domains_.size()); }
  const FabricConfig& config() const { return config_; }

  // Registers [base, base + length) with every domain. The memory must stay valid until
  // DeregisterMemory (or engine destruction) and until no transfer uses it.
  Result<RegionId> RegisterMemory(void* base, size_t length, MemoryKind kind = MemoryKind::kHost);
  Status DeregisterMemory(RegionId region);
  // The descriptor a remote engine needs to write into `region`.
  Result<MemoryDescriptor> Describe(RegionId region) const;

  // Adds (or finds, for an instance already added) a peer by its address. A removed instance
  // may be added again: it gets a new PeerId (the old one stays removed).
  Result<PeerId> AddPeer(const TransferEngineAddress& address);
  // Ends the peer's unfinished transfers with Cancelled before returning; afterwards no
  // callback concerns it, and what it sends reaches handlers only as from kUnknownPeer (its
  // immediates count only for an expectation waiting for them; HandleImmediate).
  Status RemovePeer(PeerId peer);
  // Ok, or the first error of an operation to `peer`; NotFound for an unknown peer.
  Status PeerError(PeerId peer) const;

  // Posting validates synchronously (bad arguments, unknown region or peer: an error and no
  // completion); once Ok is returned the completion runs exactly once.
  Status PostPagedWrite(const PagedWrite& write, Completion completion);
  Status PostWrite(const SingleWrite& write, Completion completion);
  // A write without payload that only delivers `imm` to the peer (aimed at `dst`).
  Status PostImmediate(PeerId peer, const MemoryDescriptor& dst, uint32_t imm,
                       Completion completion, std::optional<Deadline> deadline = std::nullopt);
  // Sends a control message of at most config().max_message_bytes.
  Status Send(PeerId peer, std::span<const std::byte> payload, Completion completion,
              std::optional<Deadline> deadline = std::nullopt);

  // Receiver side; see ImmediateCounters for the semantics. Callbacks run on the progress
  // thread that counted the last arrival, or on the engine's timer thread (deadline passed,
  // or already satisfied when registered); never inside Expect. The timer thread does not
  // depend on any provider call returning, so a deadline fires even if a provider hangs.
  Status Expect(uint32_t imm, uint32_t count, Deadline deadline,
                ImmediateCounters::Callback callback);
  bool RemoveExpectation(uint32_t imm);
  uint32_t EarlyArrivals(uint32_t imm) const;

  TransferEngineStats stats() const;

 private:
  friend class internal::TransferEngineEvents;
  struct Region;
  struct Peer;

  TransferEngine(const FabricConfig& config, TransferEngineHandlers handlers);
  Status OpenDomains();
  Result<Deadline> TransferDeadline(const std::optional<Deadline>& deadline) const;
  // Returns the live peer or an error.
  Result<const Peer*> LivePeer(PeerId peer) const REQUIRES_SHARED(peers_mu_);
  void HandleImmediate(PeerId from, uint32_t imm, bool from_removed_peer);
  void HandleMessage(std::span<const std::byte> bytes);
  void HandlePeerError(PeerId peer, const Status& error);
  TimePoint HandleTick(int domain_index, TimePoint now);
  void RunTimer() EXCLUDES(timer_mu_);
  void KickTimer() EXCLUDES(timer_mu_);
  // Removes peer `id` from the first `count` domains (undo of a partial AddPeer).
  void ForgetPeerInDomains(PeerId id, size_t count);

  const FabricConfig config_;
  const TransferEngineHandlers handlers_;
  TransferEngineAddress address_;
  std::optional<Topology> topology_;
  std::unique_ptr<internal::TransferEngineEvents> events_;
  ImmediateCounters counters_;
  std::vector<std::unique_ptr<internal::Domain>> domains_;

  // Fires expectations whose deadline passed (and those ready at Expect).
  Mutex timer_mu_;
  CondVar timer_cv_;
  bool timer_stop_ GUARDED_BY(timer_mu_) = false;
  bool timer_kick_ GUARDED_BY(timer_mu_) = false;
  std::thread timer_;

  mutable SharedMutex regions_mu_;
  std::unordered_map<RegionId, Region> regions_ GUARDED_BY(regions_mu_);
  RegionId next_region_ GUARDED_BY(regions_mu_) = 1;

  Mutex add_peer_mu_ ACQUIRED_BEFORE(peers_mu_);  // serialises AddPeer; never on progress threads
  mutable SharedMutex peers_mu_;
  std::unordered_map<PeerId, Peer> peers_ GUARDED_BY(peers_mu_);
  std::unordered_map<uint64_t, PeerId> live_instances_ GUARDED_BY(peers_mu_);
  PeerId next_peer_ GUARDED_BY(peers_mu_) = 1;
  std::atomic<uint64_t> messages_dropped_{0};
};

}  // namespace pdserve::fabric
