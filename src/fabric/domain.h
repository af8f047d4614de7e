// One libfabric domain with its endpoint, CQ, AV and the progress thread that owns them
// (FI_THREAD_DOMAIN: only that thread touches them after Start). Internal to the engine.
//
// Thread-safety: Submit*, RunSync and Wake may be called from any thread; everything else
// runs on the progress thread. Events go out through DomainEvents, also on that thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "fabric/config.h"
#include "fabric/fi_handles.h"
#include "fabric/topology.h"
#include "fabric/transfer.h"

namespace pdserve::fabric::internal {

// Every control message starts with this header (magic, version, sender instance).
inline constexpr size_t kMessageHeaderBytes = 16;

// One transfer as seen by every domain it was striped over.
class TransferState {
 public:
  TransferState(Completion completion, PeerId peer, int batches)
      : completion_(std::move(completion)), peer_(peer), batches_left_(batches) {}
  PeerId peer() const { return peer_; }
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  // One domain's share ended with `status`; the last share finishes the transfer.
  void BatchDone(const Status& status);
  // Ends the transfer now (abort paths). Returns false if it had already ended.
  bool Finish(const Status& status);

 private:
  Completion completion_;
  const PeerId peer_;
  std::atomic<int> batches_left_;
  std::atomic<bool> finished_{false};
  Mutex mu_;
  Status first_error_ GUARDED_BY(mu_);
};

struct WriteOp {
  const void* src = nullptr;
  void* desc = nullptr;  // local MR descriptor (needed with FI_MR_LOCAL)
  uint64_t length = 0;
  uint64_t remote_addr = 0;
  uint64_t key = 0;
  uint64_t data = 0;
  bool has_data = false;
};

// What the engine hands a domain to post: writes or one message, for one peer.
struct BatchRequest {
  std::shared_ptr<TransferState> transfer;
  PeerId peer = kUnknownPeer;
  Deadline deadline = Deadline::Never();
  std::vector<WriteOp> writes;
  std::string message;  // non-empty: a send (header already prepended), writes empty
};

// Callbacks from a domain's progress thread into the engine.
class DomainEvents {
 public:
  virtual ~DomainEvents() = default;
  // `from_removed_peer`: the provider attributes the arrival to a peer that was removed.
  virtual void OnImmediate(PeerId from, uint32_t imm, bool from_removed_peer) = 0;
  virtual void OnMessage(std::span<const std::byte> bytes) = 0;
  virtual void OnPeerError(PeerId peer, const Status& status) = 0;
  // Periodic tick (about every millisecond while awake); returns the next time it wants.
  virtual TimePoint OnTick(int domain_index, TimePoint now) = 0;
};

struct MemoryKeys {
  void* desc = nullptr;
  RemoteKey remote;
};

class Domain {
 public:
  // Opens fabric, domain, AV, CQ and endpoint from `info` (one entry of fi_getinfo).
  static Result<std::unique_ptr<Domain>> Open(const fi_info* info, int index,
                                              const FabricConfig& config, DomainEvents* events);
  Domain(const Domain&) = delete;
  Domain& operator=(const Domain&) = delete;
  ~Domain();  // stops the thread (aborting what is pending) and closes every handle

  // Starts the progress thread, bound to `cpus` through `topology` (empty: unbound).
  Status Start(const Topology* topology, std::vector<int> cpus);
  int index() const { return index_; }
  const std::string& endpoint_name() const { return endpoint_name_; }

  void Submit(BatchRequest request);
  // Runs `task` on the progress thread and waits for it (inline if called from it).
  Status RunSync(const std::function<Status()>& task, Deadline deadline);
  void Wake();

  // --- progress thread only (through RunSync) ---
  Result<MemoryKeys> RegisterMemory(uint64_t id, void* base, size_t length);
  void DeregisterMemory(uint64_t id);
  // Inserts `endpoints` into the AV, mapping them to `peer`; sends go to endpoints[target].
  Status AddPeer(PeerId peer, const std::vector<std::string>& endpoints, size_t target);
  // Forgets the peer and ends its transfers with `status` before returning.
  void RemovePeer(PeerId peer, const Status& status);

  // True if the calling thread is some domain's progress thread (callbacks run there).
  static bool OnProgressThread();

 private:
  struct OpContext;
  struct Batch;
  using Command = std::variant<BatchRequest, std::function<void()>>;

  Domain(int index, const FabricConfig& config, DomainEvents* events);
  Status OpenHandles(const fi_info* info);
  Status SetUpMessageBuffers();
  void Run(const Topology* topology, std::vector<int> cpus);
  bool DrainCommands();
  void Accept(BatchRequest request);
  bool PostReady();
  // Posts the batch's next operation: 1 posted, 0 provider busy (EAGAIN), -1 batch ended.
  int PostOne(Batch& batch);
  bool PollCompletions();
  // One fi_cq_read; returns the entries handled (an error entry counts as one).
  int ReadCompletions();
  void HandleCompletion(const struct fi_cq_data_entry& entry, fi_addr_t source);
  void HandleError();
  void OpFinished(OpContext* op, const Status& status);
  void EndBatchIfDone(Batch& batch);
  void AbortBatch(Batch& batch, const Status& status);
  void SweepDeadlines(TimePoint now);
  void IdleWait(bool busy);
  Status PostReceive(size_t slot);
  void RepostReceive(size_t slot);
  bool RetryReceives();
  OpContext* AllocateOp();
  void ReleaseOp(OpContext* op);
  void AbortAll(const Status& status);

  const int index_;
  const FabricConfig config_;
  DomainEvents* const events_;
  std::string endpoint_name_;
  bool virt_addr_ = false;
  bool prov_key_ = false;
  bool mr_local_ = false;
  bool mr_endpoint_ = false;
  bool has_source_ = false;

  // Handles, closed in reverse of this order by ~Domain.
  FidPtr<fid_fabric> fabric_;
  FidPtr<fid_domain> domain_;
  FidPtr<fid_av> av_;
  FidPtr<fid_cq> cq_;
  FidPtr<fid_ep> ep_;
  std::unordered_map<uint64_t, FidPtr<fid_mr>> mrs_;

  // Message buffers (registered once): receive slots then send slots.
  std::unique_ptr<std::byte[]> message_memory_;  // not zeroed: pages fault in on use
  size_t message_memory_bytes_ = 0;
  void* message_desc_ = nullptr;
  size_t slot_bytes_ = 0;
  std::vector<size_t> free_send_slots_;

  // Progress-thread state.
  std::list<Batch> batches_;
  std::deque<Batch*> post_queue_;
  std::deque<OpContext> op_storage_;
  std::vector<OpContext*> free_ops_;
  std::vector<OpContext> recv_ops_;
  std::vector<size_t> unposted_receives_;  // slots the provider refused (EAGAIN) for now
  struct PeerRoute {
    fi_addr_t target = FI_ADDR_UNSPEC;
    bool active = false;
  };
  std::vector<PeerRoute> peers_;                          // index = PeerId
  std::unordered_map<fi_addr_t, PeerId> source_to_peer_;  // AV address -> peer
  uint64_t outstanding_ = 0;
  TimePoint next_tick_{};
  int idle_rounds_ = 0;      // empty loop rounds since the last work
  int sleep_doublings_ = 0;  // back-off state once spinning has ended
  TimePoint last_work_{};

  // Shared with submitters.
  Mutex mu_;
  CondVar cv_;
  std::vector<Command> commands_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  bool sleeping_ GUARDED_BY(mu_) = false;
  std::atomic<bool> has_commands_{false};  // commands_ may be non-empty
  std::atomic<bool> stopping_{false};      // mirrors stop_ for the lock-free loop check
  std::thread thread_;
};

}  // namespace pdserve::fabric::internal
