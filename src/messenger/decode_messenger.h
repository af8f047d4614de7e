// DecodeMessenger: the decode node's side of the KV messenger (DESIGN.md §3). It handshakes with
// every configured prefill peer, and for each request: submits it to the engine as
// kRemotePrefill; once the engine has allocated its pages, picks a prefill peer (the request's
// override, else the one whose queue would finish the prompt first: its outstanding prefill
// tokens plus the prompt's tokens it is not thought to hold cached), registers the number of
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
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/histogram.h"
#include "common/mutex.h"
#include "common/prefix_index.h"
#include "common/status.h"
#include "engine/engine.h"
#include "messenger/event_log.h"
#include "messenger/messenger_core.h"
#include "messenger/messenger_options.h"
#include "messenger/prefill_peers.h"
#include "messenger/protocol.h"
#include "messenger/slot_table.h"

namespace pdserve::messenger {

// Upper bounds (seconds) of the transfer latency histogram: PrefillRequest sent -> every
// expected write landed, so it spans P's whole prefill (TTFT-like).
std::vector<double> TransferLatencyBounds();

struct DecodeMessengerStats {
  int peers_ready = 0;
  int requests_in_flight = 0;   // submitted through the messenger, not yet finished
  int requests_waiting_kv = 0;  // queued for a prefill peer, or their KV in flight
  int slots_in_use = 0;
  int64_t requests_total = 0;  // prefilled by a prefill peer
  int64_t local_prefills = 0;  // prefilled by this node (local_prefill_max_tokens)
  // Prefilled by this node because no prefill peer was usable (local_prefill_fallback).
  int64_t fallback_prefills = 0;
  // Admission (docs/messenger.md): requests whose estimated KV wait exceeded the deadline,
  // prefilled here instead, or refused with 503 and Retry-After.
  int64_t admission_prefills = 0;
  int64_t admission_refusals = 0;
  int64_t peers_readmitted = 0;  // removed peers (the same process) handshaken again
  int64_t requests_retried = 0;
  int64_t requests_failed = 0;
  int64_t requests_cancelled = 0;
  int64_t requests_expired = 0;  // KV not landed (or no peer) by the deadline
  // Transfers whose every write landed: their writes, and their bytes (from the plan: D sees
  // only the immediates of one-sided writes, never their lengths).
  int64_t writes_received = 0;
  int64_t bytes_received = 0;
  // Pages of requests' prompts this node's prefix cache held, so no prefill node wrote them,
  // and their bytes (over this node's ranks: what the writes would have carried).
  int64_t pages_not_transferred = 0;
  int64_t bytes_not_transferred = 0;
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
  // InvalidArgument. Admission (options.admission) may prefill it here instead, or refuse it:
  // Unavailable, its message ending with common/retry_after.h's suffix. Other errors are the
  // engine's Submit errors.
  Status Submit(EngineRequest request, const std::string& prefill_peer = "");
  // A prefill peer joins while the node runs (a prefill node started with --decode-peer): it is
  // handshaken like the ones given at creation. A name already known is Ok and changes
  // nothing (joins repeat every few seconds). Any thread.
  Status AddPeer(PrefillPeerSpec peer);
  // A prefill peer left the membership (its etcd key went away): chosen for no new request;
  // what it prefills now still lands; once disconnected (heartbeats stopped) it is not
  // resolved again, until AddPeer names it again. An unknown name is NotFound. Any thread.
  Status RemovePeer(const std::string& name);
  DecodeMessengerStats stats() const;
  // kPrefillSent and kKvLanded of every transfer (its transfer id is the one P's log shows).
  const EventLog& events() const { return core_->events(); }
  // True once `n` peers are ready, false if the deadline passes first.
  bool WaitForPeers(int n, Deadline deadline) const;
  // Why this node cannot serve as a decode node should ("" if it can): no prefill peer is
  // ready. Requests are then prefilled here (or refused, without local_prefill_fallback).
  std::string Degraded() const;

 private:
  struct Request;
  DecodeMessenger(Engine* engine, MessengerOptions options);
  Status Init(std::vector<PrefillPeerSpec> peers);
  void Handle(fabric::PeerId from, Message message);
  // The peer table's hooks: an epoch began, or ended (every in-flight request of the peer is
  // decided: no write of it can land any more).
  void OnPeerReady(PrefillPeer& peer);
  void OnPeerRemoved(PrefillPeer& peer, const Status& why);
  void OnPagesAllocated(const std::string& id, std::vector<PageId> pages, int cached_pages);
  // Sends `req` to the least loaded ready peer it may use; with none, queues it while one it
  // may use is handshaking or on its first connection attempt, else NoUsablePeer.
  void Dispatch(Request& req);
  // Whether `req` may go to `peer` (its override; retries left; not a peer that failed it).
  bool MayUse(const Request& req, const PrefillPeer& peer) const;
  // No peer can take `req`, nor will one soon: prefill it here, or fail it now.
  void NoUsablePeer(Request& req);
  // Dispatches again every queued request (a peer's handshake ended, either way).
  void RedispatchQueued();
  void OnLanded(const std::string& id, uint32_t imm, const Status& status, uint32_t arrived,
                TimePoint at);
  void OnWriteFailed(uint64_t transfer_id, const std::string& reason);
  void OnCancelAck(uint64_t transfer_id);
  void OnEngineFinished(const std::string& id);
  // The KV of `req` will not land from its peer: ask P to stop; then redispatch or fail.
  void Abandon(Request& req, const Status& why, bool retry);
  // No write of `req`'s current transfer can land any more.
  void Quiesced(Request& req);
  void FailRequest(Request& req, const Status& why);
  void FreeSlot(Request& req);
  void Tick();
  void PublishStats();
  // The peers' loads as Submit's admission reads them (loop thread).
  void PublishLoads();
  // Admission in Submit (any thread): remote (Ok), prefilled here (`request` submitted as an
  // ordinary request: *submitted), or refused.
  Status Admit(EngineRequest& request, const std::string& prefill_peer, int64_t* unsent,
               bool* submitted);
  // The request's tokens admitted for a peer and not yet sent stop counting (loop thread).
  void ReleaseUnsent(Request& req);

  Engine* const engine_;
  const MessengerOptions options_;
  std::unique_ptr<MessengerCore> core_;
  std::unique_ptr<PrefillPeers> peers_;  // after core_: destroyed before it

  // Control-loop state: the transfers.
  std::map<std::string, std::unique_ptr<Request>> requests_;  // by engine id
  std::map<uint64_t, std::string> by_transfer_id_;            // transfer id -> engine id
  uint64_t next_transfer_id_ = 1;
  SlotTable slots_;
  // Which prompt pages each prefill peer was sent (an approximate view of its prefix cache,
  // each peer bounded by its page count), for the choice of peer.
  PrefixIndex peer_prefixes_{1};
  DecodeMessengerStats counters_;

  // Failures the engine's final output must carry (engine.Cancel alone says "cancelled").
  Mutex failures_mu_;
  std::map<std::string, Status> failures_ GUARDED_BY(failures_mu_);

  // What Submit's admission reads, published by the loop (PublishLoads), and what it adds.
  struct AdmissionPeer {
    std::string name;
    bool ready = false;
    int64_t queued_tokens = 0;
    double tokens_per_second = 0;
  };
  mutable Mutex admission_mu_;
  std::vector<AdmissionPeer> admission_peers_ GUARDED_BY(admission_mu_);
  // Prompt tokens admitted for a prefill peer and not yet sent (waiting for pages).
  int64_t unsent_tokens_ GUARDED_BY(admission_mu_) = 0;
  // Prompt tokens this node prefills by admission and has not finished prefilling.
  int64_t admission_local_tokens_ GUARDED_BY(admission_mu_) = 0;

  mutable Mutex stats_mu_;
  mutable CondVar stats_cv_;
  DecodeMessengerStats stats_ GUARDED_BY(stats_mu_);
};

}  // namespace pdserve::messenger
