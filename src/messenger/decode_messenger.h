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
// a removed peer are retried on another ready peer (MessengerOptions::max_retries) or fail with an
// error naming the peer and the cause.
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

// What the decode node knows of one prefill peer (served as /internal/messenger/peers).
struct PrefillPeerStatus {
  std::string name;
  std::string state;       // "disconnected", "handshaking" or "ready"
  std::string last_error;  // why it was last removed or refused ("" if never)
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

 private:
  struct Peer;
  struct Request;
  DecodeMessenger(Engine* engine, MessengerOptions options, std::vector<PrefillPeerSpec> peers);
  Status Init();
  void OnMessage(fabric::PeerId from, std::span<const std::byte> payload);
  void Handle(fabric::PeerId from, Message message);
  void Connect(Peer& peer, Result<fabric::TransferEngineAddress> address);
  void HandleHelloAck(Peer& peer, const HelloAck& ack);
  // Registers every rank's KV cache for `peer` alone; returns the NodeInfo (one descriptor per
  // rank) to send it.
  Result<NodeInfo> RegisterFor(Peer& peer);
  void PeerDead(Peer& peer, const Status& why);
  // The handshake with `peer` was refused, by either side, for `why`.
  void PeerRefused(Peer& peer, const Status& why);
  // Fails `req` at once if every peer it may use refused the handshake; false otherwise.
  bool FailIfAllRefused(Request& req);
  void OnPagesAllocated(const std::string& id, std::vector<PageId> pages);
  void Dispatch(Request& req);
  // Whether `req` may move to another prefill peer: retries left and another peer ready.
  bool CanRetry(const Request& req) const;
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
