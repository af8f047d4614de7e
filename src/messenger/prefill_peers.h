// PrefillPeers: the decode node's table of prefill peers and each one's connection: resolution
// over HTTP (a thread of its own per peer), the handshake, heartbeats, removal, and
// re-admission as a new epoch after a back-off (docs/messenger.md, "Epochs"). What the peers
// are used for — the transfers — is DecodeMessenger's, which learns of every change through
// PrefillPeerHooks.
//
// Threads: everything on the messenger core's control loop, except Add (any thread), Knows
// (any thread) and the destructor (the owner's, after the loop stopped; it waits for the
// resolution threads, which the resolve functions' timeouts bound).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "engine/engine.h"
#include "fabric/transfer_engine.h"
#include "kv/transfer_plan.h"
#include "messenger/messenger_core.h"
#include "messenger/peer_views.h"
#include "messenger/protocol.h"

namespace pdserve::messenger {

struct PrefillPeerSpec {
  std::string name;  // how requests name it (e.g. the prefill node's URL)
  // Where it is now; asked again whenever the peer is (re)connected, so a restarted prefill
  // node (new fabric address, new incarnation) is found.
  std::function<Result<fabric::TransferEngineAddress>()> resolve;
};

// How long a removed or unreachable prefill peer waits, at most, between connection attempts
// (the first waits one heartbeat interval, each failed one doubles it).
inline constexpr std::chrono::milliseconds kMaxReconnectBackoff{1000};

// What the decode node knows of one prefill peer (served as /internal/messenger/peers).
struct PrefillPeerStatus {
  std::string name;
  std::string state;       // "disconnected", "handshaking" or "ready"
  std::string last_error;  // why it was last removed or refused ("" if never)
  int epoch = 0;           // handshakes completed with it (a re-admission starts a new one)
  // Its handshake was refused (wrong cluster key, another model): requests that only it could
  // take fail at once with the reason, until a restarted process (new instance) is accepted.
  bool refused = false;
  // Its queue as this node counts it (PrefillPeer::queued_tokens) and its reported prefill
  // rate (tokens/s; 0: not measured yet): what admission estimates the KV wait from.
  int64_t queued_tokens = 0;
  double prefill_tokens_per_second = 0;
};

struct PrefillPeer {
  enum class State : uint8_t { kDisconnected, kHelloSent, kFinishSent, kReady };
  PrefillPeerSpec spec;
  State state = State::kDisconnected;
  // The fabric's id for the current epoch: every handshake, including one with an instance
  // removed before (a stalled peer that came back), adds the peer anew.
  fabric::PeerId id = fabric::kUnknownPeer;
  uint64_t instance = 0;
  uint64_t removed_instance = 0;  // the last instance removed; handshaking it again re-admits it
  int epoch = 0;                  // handshakes completed with this peer
  int failed_attempts = 0;        // connection attempts failed since it was last ready
  Status refusal;                 // why its current instance's handshake was refused
  // Every rank's cache as views of this instance's own, registered for it alone (empty: none).
  PeerViews views;
  std::string last_error;
  uint64_t incarnation = 0;
  Nonce own_nonce{};
  std::shared_ptr<const TransferPlan> plan;  // P's layout -> this node's (ready peers)
  TimePoint state_since;
  TimePoint last_heard;
  TimePoint retry_at;
  uint64_t heartbeat = 0;
  // It left the membership (its etcd key went away): used by no new request and, once
  // disconnected, not resolved again, until it joins again (Add with its name).
  bool retired = false;
  int64_t reported_tokens = 0;  // from its last LoadReport
  double reported_rate = 0;     // its measured prefill rate (tokens/s), same; 0: none yet
  int64_t own_tokens = 0;       // prefill tokens the decode node has in flight there
  // Prompt tokens the decode node sent it since its last LoadReport (which did not count
  // them yet, unless they overtook it).
  int64_t sent_since_report = 0;
  // spec.resolve() running on a thread of its own; its answer is posted to the loop.
  std::future<void> resolving;

  bool ready() const { return state == State::kReady; }
  // Prompt tokens queued there, as far as the decode node knows (admission's estimate).
  int64_t queued_tokens() const {
    return std::max(reported_tokens + sent_since_report, own_tokens);
  }
  bool handshaking() const { return state == State::kHelloSent || state == State::kFinishSent; }
  // Never ready nor failed yet: its first connection attempt is under way (a node starting
  // up, or a peer that just joined).
  bool first_attempt() const {
    return !retired && state == State::kDisconnected && epoch == 0 && failed_attempts == 0 &&
           refusal.ok();
  }
};

struct PrefillPeerHooks {
  // The peer's handshake finished: a new epoch.
  std::function<void(PrefillPeer& peer)> ready;
  // The peer was removed (its fabric peer removed, its views revoked and keys closed): nothing
  // of that epoch can land any more.
  std::function<void(PrefillPeer& peer, const Status& why)> removed;
  // Anything else that may decide a waiting request: a connection attempt failed, a refusal.
  std::function<void()> changed;
};

class PrefillPeers {
 public:
  PrefillPeers(MessengerCore* core, Engine* engine, PrefillPeerHooks hooks);
  ~PrefillPeers();
  PrefillPeers(const PrefillPeers&) = delete;
  PrefillPeers& operator=(const PrefillPeers&) = delete;

  // A new peer (false: the name is known already; nothing changes). It is connected at the
  // next Tick. A peer that left (Retire) joins again under its old entry. Any thread.
  bool Add(PrefillPeerSpec spec);
  // The peer left the cluster's membership: chosen for no new request, and once disconnected
  // (at once if handshaking; a ready one when its heartbeats stop, its requests in flight
  // finishing meanwhile) never resolved again, until Add names it again. False if the name is
  // not known. Any thread.
  bool Retire(const std::string& name);
  bool Knows(const std::string& name) const;  // any thread

  // Loop thread from here on.
  std::vector<std::unique_ptr<PrefillPeer>>& all() { return peers_; }
  const std::vector<std::unique_ptr<PrefillPeer>>& all() const { return peers_; }
  // The connected peer with this fabric id, or null.
  PrefillPeer* Find(fabric::PeerId id);
  // A control message of the handshake or a heartbeat answer, from `peer`.
  void Handle(PrefillPeer& peer, const Message& message);
  // Removes the peer (for safety: its writes can land no more) and schedules its re-admission.
  void Remove(PrefillPeer& peer, const Status& why);
  // Resolution, handshake deadlines, heartbeats and their deadlines; also this node's own stall.
  void Tick();
  void Send(PrefillPeer& peer, const Message& message) { core_->Send(peer.id, message); }
  std::vector<PrefillPeerStatus> Statuses() const;
  int64_t readmissions() const { return readmissions_; }

 private:
  void StartResolve(PrefillPeer& peer);
  void Connect(PrefillPeer& peer, Result<fabric::TransferEngineAddress> address);
  std::chrono::milliseconds ReconnectBackoff(const PrefillPeer& peer) const;
  void HandleHelloAck(PrefillPeer& peer, const HelloAck& ack);
  // Registers every rank's KV cache for `peer` alone; returns the NodeInfo (one descriptor per
  // rank) to send it.
  Result<NodeInfo> RegisterFor(PrefillPeer& peer);
  void Ready(PrefillPeer& peer);
  // The handshake with `peer` was refused, by either side, for `why`.
  void Refused(PrefillPeer& peer, const Status& why);

  MessengerCore* const core_;
  Engine* const engine_;
  const PrefillPeerHooks hooks_;
  const std::string reply_address_;
  std::vector<std::unique_ptr<PrefillPeer>> peers_;  // never shrinks: pointers stay valid
  int64_t readmissions_ = 0;
  TimePoint last_tick_{};

  // Every peer's name (peers_ is the loop's; Add and Knows check names on other threads).
  mutable Mutex names_mu_;
  std::set<std::string> names_ GUARDED_BY(names_mu_);
};

}  // namespace pdserve::messenger
