// DecodeMessenger: the decode node's side of the KV messenger (DESIGN.md §3). It handshakes with
// every configured prefill peer, and for each request: submits it to the engine as
// kRemotePrefill; once the engine has allocated its pages, picks a prefill peer (the request's
// override, else the one with the fewest outstanding prefill tokens), registers the number of
// writes it expects (TransferPlan::ExpectedWrites of P's and D's layouts for the request's pages
// and replica seed: the writes of every route between P's and D's ranks, whatever their tensor
// parallelism) for the request's transfer slot BEFORE
// sending the PrefillRequest, and admits the request when that count has landed. A prompt of
// one token has nothing to transfer and is admitted at once.
//
// Who frees D's pages: the engine, for admitted requests; this messenger (ReleaseHeldPages) for
// requests that end before their KV landed, and only once no write can still land in them —
// after P's CancelAck, or after P was removed (missed heartbeats, endpoint error) and the
// memory registrations that P's writes name were closed (one per prefill peer instance and
// tensor-parallel rank: every rank's cache is a write target). Requests of
// a removed peer are retried on another ready peer (MessengerOptions::max_retries), prefilled
// by this node (MessengerOptions::local_prefill_fallback) or failed with an error naming the
// peer and the cause — at once: no request waits for a failure already certain.
//
// Removal is for safety, not for ever: a removed peer is resolved again after a back-off and,
// if the same process answers (it stalled, or the link was cut), handshaken as a new epoch —
// a new fabric peer, new views and keys, the old ones staying revoked.
//
// Threads: Create/destructor from the owner's thread (the engine must outlive the messenger and
// its loop must be stopped first). Submit/stats/events from any thread. The peers' `resolve`
// functions run on threads of their own, one at a time per peer (give them a timeout: the
// destructor waits for them).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/histogram.h"
#include "common/mutex.h"
#include "common/revocable_mapping.h"
#include "common/status.h"
#include "engine/engine.h"
#include "fabric/transfer_engine.h"
#include "messenger/control_loop.h"
#include "messenger/event_log.h"
#include "messenger/messenger_options.h"
#include "messenger/protocol.h"

namespace pdserve::messenger {

struct PrefillPeerSpec {
  std::string name;  // how requests name it (e.g. the prefill node's URL)
  // Where it is now; asked again whenever the peer is (re)connected, so a restarted prefill
  // node (new fabric address, new incarnation) is found.
  std::function<Result<fabric::TransferEngineAddress>()> resolve;
};

// Upper bounds (seconds) of the transfer latency histogram: PrefillRequest sent -> every
// expected write landed, so it spans P's whole prefill (TTFT-like).
std::vector<double> TransferLatencyBounds();

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
};

struct DecodeMessengerStats {
  int peers_ready = 0;
  int requests_in_flight = 0;   // submitted through the messenger, not yet finished
  int requests_waiting_kv = 0;  // queued for a prefill peer, or their KV in flight
  int slots_in_use = 0;
  int64_t requests_total = 0;  // prefilled by a prefill peer
  int64_t local_prefills = 0;  // prefilled by this node (local_prefill_max_tokens)
  // Prefilled by this node because no prefill peer was usable (local_prefill_fallback).
  int64_t fallback_prefills = 0;
  int64_t peers_readmitted = 0;  // removed peers (the same process) handshaken again
  int64_t requests_retried = 0;
  int64_t requests_failed = 0;
  int64_t requests_cancelled = 0;
  int64_t requests_expired = 0;  // KV not landed (or no peer) by the deadline
  // Transfers whose every write landed: their writes, and their bytes (from the plan: D sees
  // only the immediates of one-sided writes, never their lengths).
  int64_t writes_received = 0;
  int64_t bytes_received = 0;
  Histogram transfer_latency_seconds{TransferLatencyBounds()};
  std::string last_peer_error;
  std::vector<PrefillPeerStatus> peers;
};

class DecodeMessenger {
 public:
  static Result<std::unique_ptr<DecodeMessenger>> Create(Engine* engine, MessengerOptions options,
                                                         std::vector<PrefillPeerSpec> peers);
  ~DecodeMessenger();
  DecodeMessenger(const DecodeMessenger&) = delete;
  DecodeMessenger& operator=(const DecodeMessenger&) = delete;

  // Submits `request` with its prompt prefilled remotely (kind is set to kRemotePrefill), or,
  // for a prompt of at most options.local_prefill_max_tokens tokens and no `prefill_peer`, as
  // an ordinary request of the engine (prefilled here).
  // `prefill_peer`: a peer name to use for this request ("" = least loaded); an unknown name is
  // InvalidArgument. Other errors are the engine's Submit errors.
  Status Submit(EngineRequest request, const std::string& prefill_peer = "");
  // A prefill peer joins while the node runs (a prefill node started with --decode-peer): it is
  // handshaken like the ones given at creation. A name already known is Ok and changes
  // nothing (joins repeat every few seconds). Any thread.
  Status AddPeer(PrefillPeerSpec peer);
  DecodeMessengerStats stats() const;
  // kPrefillSent and kKvLanded of every transfer (its request id is the one P's log shows).
  const EventLog& events() const { return events_; }
  // True once `n` peers are ready, false if the deadline passes first.
  bool WaitForPeers(int n, Deadline deadline) const;
  // Why this node cannot serve as a decode node should ("" if it can): no prefill peer is
  // ready. Requests are then prefilled here (or refused, without local_prefill_fallback).
  std::string Degraded() const;

 private:
  struct Peer;
  struct Request;
  DecodeMessenger(Engine* engine, MessengerOptions options, std::vector<PrefillPeerSpec> peers);
  Status Init();
  void OnMessage(fabric::PeerId from, std::span<const std::byte> payload);
  void Handle(fabric::PeerId from, Message message);
  // Resolves `peer` on a thread of its own; the answer is posted to the loop (Connect).
  void StartResolve(Peer& peer);
  void Connect(Peer& peer, Result<fabric::TransferEngineAddress> address);
  std::chrono::milliseconds ReconnectBackoff(const Peer& peer) const;
  void HandleHelloAck(Peer& peer, const HelloAck& ack);
  // The handshake finished (P accepted HelloFinish): a new epoch; queued requests go.
  void PeerReady(Peer& peer);
  // Registers every rank's KV cache for `peer` alone; returns the NodeInfo (one descriptor per
  // rank) to send it.
  Result<NodeInfo> RegisterFor(Peer& peer);
  void PeerDead(Peer& peer, const Status& why);
  // The handshake with `peer` was refused, by either side, for `why`.
  void PeerRefused(Peer& peer, const Status& why);
  void OnPagesAllocated(const std::string& id, std::vector<PageId> pages);
  // Sends `req` to the least loaded ready peer it may use; with none, queues it while one it
  // may use is handshaking or on its first connection attempt, else NoUsablePeer.
  void Dispatch(Request& req);
  // `peer` was never ready nor failed: its first connection attempt is under way.
  bool FirstAttempt(const Peer& peer) const;
  // Whether `req` may go to `peer` (its override; retries left; not a peer that failed it).
  bool MayUse(const Request& req, const Peer& peer) const;
  // No peer can take `req`, nor will one soon: prefill it here, or fail it now.
  void NoUsablePeer(Request& req);
  // Dispatches again every queued request (a peer's handshake ended, either way).
  void RedispatchQueued();
  void OnLanded(const std::string& id, uint32_t imm, const Status& status, uint32_t arrived,
                TimePoint at);
  void OnWriteFailed(uint64_t request_id, const std::string& reason);
  void OnCancelAck(uint64_t request_id);
  void OnEngineFinished(const std::string& id);
  // The KV of `req` will not land from its peer: ask P to stop; then retry or fail.
  void Abandon(Request& req, const Status& why, bool retry);
  // No write of `req`'s current transfer can land any more.
  void Quiesced(Request& req);
  void FailRequest(Request& req, const Status& why);
  void Finish(const std::string& id);
  void FreeSlot(Request& req);
  void Tick();
  void SendTo(Peer& peer, const Message& message);
  Peer* FindPeer(fabric::PeerId id);
  void PublishStats();

  Engine* const engine_;
  const MessengerOptions options_;
  const uint64_t incarnation_;
  EventLog events_;
  NodeInfo local_;
  std::string reply_address_;
  std::shared_ptr<ControlLoop> loop_;
  std::unique_ptr<fabric::TransferEngine> fabric_;

  // Control-loop state.
  std::vector<std::unique_ptr<Peer>> peers_;
  std::map<std::string, std::unique_ptr<Request>> requests_;  // by engine id
  std::map<uint64_t, std::string> by_request_id_;             // transfer request id -> engine id
  uint64_t next_request_id_ = 1;
  std::vector<uint32_t> free_slots_;
  std::vector<uint32_t> slot_generation_;  // by slot
  DecodeMessengerStats counters_;
  TimePoint last_tick_{};
  // Removed peers' revoked views: a provider may still write into them until fabric_ is gone.
  std::vector<RevocableMapping> retired_views_;

  // Every peer's name (peers_ is the control loop's; Submit checks names on other threads).
  mutable Mutex names_mu_;
  std::set<std::string> peer_names_ GUARDED_BY(names_mu_);

  // Failures the engine's final output must carry (engine.Cancel alone says "cancelled").
  Mutex failures_mu_;
  std::map<std::string, Status> failures_ GUARDED_BY(failures_mu_);

  mutable Mutex stats_mu_;
  mutable CondVar stats_cv_;
  DecodeMessengerStats stats_ GUARDED_BY(stats_mu_);
};

}  // namespace pdserve::messenger
