// PrefillMessenger: the prefill node's side of the KV messenger (DESIGN.md §3). It answers decode
// nodes' handshakes, runs their PrefillRequests as kPrefillOnly engine requests (tokens
// [0, n-1)), streams each layer's final pages into the decode node's memory as the forward pass
// goes (LayerStreamer), and releases its source pages once every write has completed locally.
// It never samples. Cancel from D stops the request and is acknowledged once none of its
// writes can still land; a write that fails is reported to D at once (WriteFailed); a decode
// peer that stops sending heartbeats is removed with everything it asked for.
//
// Threads: Create/destructor from the owner's thread, before Engine::Start (it installs the
// step observer) and before the engine is destroyed; the engine's loop must be stopped before
// the messenger is destroyed. All state lives on the messenger's control loop; stats(),
// address() and events() are safe from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "engine/engine.h"
#include "fabric/transfer_engine.h"
#include "messenger/admission.h"
#include "messenger/event_log.h"
#include "messenger/layer_streamer.h"
#include "messenger/messenger_core.h"
#include "messenger/messenger_options.h"
#include "messenger/peer_views.h"
#include "messenger/protocol.h"

namespace pdserve::messenger {

struct PrefillMessengerStats {
  int peers_ready = 0;
  int requests_in_flight = 0;  // PrefillRequests not yet finished (pages held or streaming)
  int64_t outstanding_prefill_tokens = 0;
  // Measured prefill rate (PrefillRateMeter), as LoadReport tells the decode nodes; 0: none.
  double prefill_tokens_per_second = 0;
  int64_t requests_total = 0;
  int64_t peers_readmitted = 0;  // removed decode peers (the same process) handshaken again
  int64_t requests_failed = 0;
  int64_t requests_cancelled = 0;
  int64_t requests_expired = 0;  // passed their deadline here
  int64_t writes_sent = 0;       // KV writes completed successfully
  int64_t bytes_sent = 0;        // their bytes
  // The same by the source rank whose cache each write read (one entry per rank of this node).
  std::vector<int64_t> writes_sent_by_rank;
  std::vector<int64_t> bytes_sent_by_rank;
};

class PrefillMessenger {
 public:
  static Result<std::unique_ptr<PrefillMessenger>> Create(Engine* engine, MessengerOptions options);
  ~PrefillMessenger();
  PrefillMessenger(const PrefillMessenger&) = delete;
  PrefillMessenger& operator=(const PrefillMessenger&) = delete;

  // What a decode node needs to reach this one (serve publishes it over HTTP).
  const fabric::TransferEngineAddress& address() const { return core_->fabric().address(); }
  uint64_t incarnation() const { return core_->incarnation(); }
  PrefillMessengerStats stats() const;
  const EventLog& events() const { return core_->events(); }
  // Streaming on or off for PrefillRequests that arrive from now on (MessengerOptions::
  // kv_streaming); for benchmarks that compare both on one node. Any thread.
  void SetKvStreaming(bool on) { kv_streaming_.store(on); }

 private:
  struct DecodePeer {
    uint64_t instance = 0;
    uint64_t incarnation = 0;
    Nonce own_nonce{};
    Nonce peer_nonce{};
    bool ready = false;
    // Its cache regions, one per decode rank (rank order).
    std::shared_ptr<const std::vector<fabric::MemoryDescriptor>> dst;
    // This node's caches as views of this peer's own, the source of every write to it; `src`
    // is their regions, which the peer's jobs carry.
    PeerViews views;
    std::shared_ptr<const std::vector<fabric::RegionId>> src;
    std::shared_ptr<const TransferPlan> plan;
    TimePoint last_heard;
  };
  struct JobState {
    std::shared_ptr<StreamJob> job;
    int64_t num_tokens = 0;
    bool engine_finished = false;
    bool cancelled = false;  // by D: acknowledge when quiescent
    bool peer_gone = false;  // nobody to talk to any more
    bool failure_reported = false;
    // D's context buffer (PrefillRequest::context_buffer): written once the prefill finished.
    std::optional<ContextBuffer> context;
    bool context_pending = false;  // its write is posted and not completed
  };

  PrefillMessenger(Engine* engine, MessengerOptions options);
  Status Init();
  void Handle(fabric::PeerId from, uint64_t instance, Message message);
  void HandleHello(uint64_t instance, const Hello& hello);
  void HandleHelloFinish(fabric::PeerId from, const HelloFinish& finish);
  void HandlePrefill(fabric::PeerId from, PrefillRequest request);
  void HandleCancel(fabric::PeerId from, const Cancel& cancel);
  void OnEngineOutput(const std::string& engine_id, const RequestOutput& out);
  // Posts the write of the finished prefill's context (RequestOutput::mtp_hidden) into D's
  // context buffer, with the transfer's immediate.
  Status WriteContext(JobState& state, const RequestOutput& out);
  void OnContextWritten(const std::string& engine_id, const Status& status);
  // Settles a job: reports failures, releases pages and acknowledges when nothing can land.
  void CheckJob(const std::string& engine_id);
  void FailJob(JobState& state, const Status& why);
  // Forgets the peer and ends its requests; `remove` also removes it from the fabric (its
  // instance may come back with a new Hello: a new epoch, as a new fabric peer).
  void DropPeer(fabric::PeerId peer, const Status& why, bool remove = true);
  void Tick();
  void SendTo(fabric::PeerId peer, const Message& message);
  LoadReport Load() const;  // this node's queue and measured rate
  void PublishStats();

  Engine* const engine_;
  const MessengerOptions options_;
  std::unique_ptr<MessengerCore> core_;
  std::unique_ptr<LayerStreamer> streamer_;
  std::atomic<bool> kv_streaming_;

  // Control-loop state.
  std::map<fabric::PeerId, DecodePeer> peers_;
  std::map<std::string, JobState> jobs_;  // by engine id
  static constexpr size_t kRemovedInstancesKept = 1024;
  std::set<uint64_t> removed_instances_;  // handshaken decode peers removed since
  PrefillMessengerStats counters_;
  PrefillRateMeter rate_;

  mutable Mutex stats_mu_;
  PrefillMessengerStats stats_ GUARDED_BY(stats_mu_);  // published by the control loop
};

}  // namespace pdserve::messenger
