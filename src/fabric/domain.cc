#include "fabric/domain.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "common/check.h"
#include "common/logging.h"

namespace pdserve::fabric::internal {
namespace {

thread_local const Domain* tls_progress_domain = nullptr;

// Keys we choose when the provider does not (no FI_MR_PROV_KEY). User regions use their
// engine-wide id (small numbers); the message buffers use one far above them.
constexpr uint64_t kMessageBufferKey = 0xfffff000u;
constexpr size_t kSendSlots = 16;
constexpr int kPostBudget = 64;  // posts per loop round before polling the CQ again
constexpr int kCqBatch = 64;     // completions read per fi_cq_read call
constexpr int kCqReadsPerRound = 4;
constexpr auto kTickPeriod = std::chrono::milliseconds(1);
constexpr auto kBusySleepCap = std::chrono::microseconds(20);
constexpr int kBackoffDoublingsMax = 16;

uint64_t MrAccess() {
  return FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// TransferState

void TransferState::BatchDone(const Status& status) {
  if (!status.ok()) {
    MutexLock lock(&mu_);
    if (first_error_.ok()) first_error_ = status;
  }
  if (batches_left_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  Status final_status;
  {
    MutexLock lock(&mu_);
    final_status = first_error_;
  }
  Finish(final_status);
}

bool TransferState::Finish(const Status& status) {
  if (finished_.exchange(true, std::memory_order_acq_rel)) return false;
  // Callback first: a caller waiting on the counter then also sees the callback's effects.
  if (completion_.callback) completion_.callback(status);
  if (completion_.counter != nullptr) completion_.counter->Record(status);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Domain internals

struct Domain::OpContext {
  fi_context2 fi;  // first member: libfabric hands &fi back as op_context
  enum class Kind : uint8_t { kWrite, kSend, kRecv } kind = Kind::kWrite;
  Batch* batch = nullptr;
  size_t slot = 0;  // message slot of a send or receive
};

struct Domain::Batch {
  BatchRequest request;
  std::list<Batch>::iterator self;
  size_t next = 0;   // next operation to post
  size_t total = 0;  // operations in the batch
  uint32_t outstanding = 0;
  bool stopped = false;   // post nothing more (error, abort, transfer ended elsewhere)
  bool reported = false;  // the transfer has been told about this batch
  bool queued = false;    // in post_queue_
  size_t send_slot = SIZE_MAX;
  Status error;
};

Domain::Domain(int index, const FabricConfig& config, DomainEvents* events)
    : index_(index), config_(config), events_(events) {}

Result<std::unique_ptr<Domain>> Domain::Open(const fi_info* info, int index,
                                             const FabricConfig& config, DomainEvents* events) {
  std::unique_ptr<Domain> d(new Domain(index, config, events));
  PD_RETURN_IF_ERROR(d->OpenHandles(info));
  PD_RETURN_IF_ERROR(d->SetUpMessageBuffers());
  return d;
}

Status Domain::OpenHandles(const fi_info* info) {
  const uint64_t mr_mode = info->domain_attr->mr_mode;
  virt_addr_ = (mr_mode & FI_MR_VIRT_ADDR) != 0;
  prov_key_ = (mr_mode & FI_MR_PROV_KEY) != 0;
  mr_local_ = (mr_mode & FI_MR_LOCAL) != 0;
  mr_endpoint_ = (mr_mode & FI_MR_ENDPOINT) != 0;
  has_source_ = (info->caps & FI_SOURCE) != 0;

  fid_fabric* fabric = nullptr;
  long rc = fi_fabric(info->fabric_attr, &fabric, nullptr);
  if (rc != 0) return FabricError("fi_fabric", rc);
  fabric_.reset(fabric);
  fid_domain* domain = nullptr;
  rc = fi_domain(fabric_.get(), const_cast<fi_info*>(info), &domain, nullptr);
  if (rc != 0) return FabricError("fi_domain", rc);
  domain_.reset(domain);

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  fid_av* av = nullptr;
  rc = fi_av_open(domain_.get(), &av_attr, &av, nullptr);
  if (rc != 0) return FabricError("fi_av_open", rc);
  av_.reset(av);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.wait_obj = FI_WAIT_NONE;  // the progress thread polls (manual progress)
  cq_attr.size = info->tx_attr->size + info->rx_attr->size + config_.receive_buffers;
  fid_cq* cq = nullptr;
  rc = fi_cq_open(domain_.get(), &cq_attr, &cq, nullptr);
  if (rc != 0) return FabricError("fi_cq_open", rc);
  cq_.reset(cq);

  PD_ASSIGN_OR_RETURN(
      EnabledEndpoint endpoint,
      OpenEnabledEndpoint(domain_.get(), const_cast<fi_info*>(info), av_.get(), cq_.get()));
  ep_ = std::move(endpoint.ep);
  endpoint_name_ = std::move(endpoint.name);
  return Status::Ok();
}

Status Domain::SetUpMessageBuffers() {
  slot_bytes_ = (config_.max_message_bytes + kMessageHeaderBytes + 63) / 64 * 64;
  const size_t slots = static_cast<size_t>(config_.receive_buffers) + kSendSlots;
  message_memory_bytes_ = slot_bytes_ * slots;
  message_memory_ = std::make_unique_for_overwrite<std::byte[]>(message_memory_bytes_);
  PD_ASSIGN_OR_RETURN(MemoryKeys keys, RegisterMemory(kMessageBufferKey, message_memory_.get(),
                                                      message_memory_bytes_));
  message_desc_ = keys.desc;
  recv_ops_.resize(static_cast<size_t>(config_.receive_buffers));
  for (size_t i = 0; i < kSendSlots; ++i) {
    free_send_slots_.push_back(static_cast<size_t>(config_.receive_buffers) + i);
  }
  return Status::Ok();
}

Domain::~Domain() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    stopping_.store(true, std::memory_order_release);
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
  // The endpoint goes first so that no provider operation can still reference an MR,
  // the CQ or an operation context; then everything bound to the domain, then the domain.
  ep_.reset();
  mrs_.clear();
  av_.reset();
  cq_.reset();
  domain_.reset();
  fabric_.reset();
}

Status Domain::Start(const Topology* topology, std::vector<int> cpus) {
  PD_CHECK(!thread_.joinable());
  thread_ = std::thread(&Domain::Run, this, topology, std::move(cpus));
  return Status::Ok();
}

bool Domain::OnProgressThread() { return tls_progress_domain != nullptr; }

void Domain::Submit(BatchRequest request) {
  {
    MutexLock lock(&mu_);
    if (!stop_) {
      commands_.emplace_back(std::move(request));
      has_commands_.store(true, std::memory_order_release);
      if (sleeping_) cv_.NotifyOne();
      return;
    }
  }
  request.transfer->Finish(Status::Cancelled("fabric engine is shutting down"));
}

void Domain::Wake() {
  MutexLock lock(&mu_);
  if (sleeping_) cv_.NotifyOne();
}

Status Domain::RunSync(const std::function<Status()>& task, Deadline deadline) {
  if (tls_progress_domain == this || !thread_.joinable()) return task();
  struct SyncState {
    Mutex mu;
    CondVar cv;
    bool done GUARDED_BY(mu) = false;
    Status status GUARDED_BY(mu);
  };
  auto state = std::make_shared<SyncState>();
  {
    MutexLock lock(&mu_);
    if (stop_) return Status::Cancelled("fabric engine is shutting down");
    commands_.emplace_back(std::function<void()>([state, task] {
      Status s = task();
      MutexLock inner(&state->mu);
      state->status = std::move(s);
      state->done = true;
      state->cv.NotifyAll();
    }));
    has_commands_.store(true, std::memory_order_release);
    if (sleeping_) cv_.NotifyOne();
  }
  MutexLock lock(&state->mu);
  while (!state->done) {
    if (state->cv.WaitUntil(&state->mu, deadline.at()) == std::cv_status::timeout && !state->done) {
      return Status::DeadlineExceeded(
          fmt::format("fabric domain {} progress thread did not answer in time", index_));
    }
  }
  return state->status;
}

// ---------------------------------------------------------------------------------------------
// Progress-thread operations reached through RunSync

Result<MemoryKeys> Domain::RegisterMemory(uint64_t id, void* base, size_t length) {
  // A device-memory (FI_HMEM) path would go here: fi_mr_regattr with iface/device set from
  // the region's memory kind, and FI_HMEM requested in the hints.
  fid_mr* mr = nullptr;
  long rc = fi_mr_reg(domain_.get(), base, length, MrAccess(), 0, id, 0, &mr, nullptr);
  if (rc != 0) return FabricError("fi_mr_reg", rc);
  FidPtr<fid_mr> owner(mr);
  if (mr_endpoint_) {
    if ((rc = fi_mr_bind(mr, &ep_->fid, 0)) != 0) return FabricError("fi_mr_bind", rc);
    if ((rc = fi_mr_enable(mr)) != 0) return FabricError("fi_mr_enable", rc);
  }
  MemoryKeys keys;
  keys.desc = fi_mr_desc(mr);
  keys.remote.key = fi_mr_key(mr);
  if (keys.remote.key == FI_KEY_NOTAVAIL) {
    return Status::Unimplemented("provider needs raw MR keys (FI_MR_RAW), which are unsupported");
  }
  keys.remote.base = virt_addr_ ? reinterpret_cast<uint64_t>(base) : 0;
  mrs_[id] = std::move(owner);
  return keys;
}

void Domain::DeregisterMemory(uint64_t id) { mrs_.erase(id); }

Status Domain::AddPeer(PeerId peer, const std::vector<std::string>& endpoints, size_t target) {
  PD_CHECK(target < endpoints.size());
  std::vector<fi_addr_t> addrs(endpoints.size(), FI_ADDR_NOTAVAIL);
  for (size_t i = 0; i < endpoints.size(); ++i) {
    int n = fi_av_insert(av_.get(), endpoints[i].data(), 1, &addrs[i], 0, nullptr);
    if (n != 1) {
      return Status::InvalidArgument(fmt::format(
          "fabric domain {} cannot insert peer endpoint {} into its address vector", index_, i));
    }
  }
  if (peers_.size() <= peer) peers_.resize(peer + 1);
  peers_[peer] = PeerRoute{addrs[target], true};
  for (fi_addr_t a : addrs) source_to_peer_[a] = peer;
  return Status::Ok();
}

void Domain::RemovePeer(PeerId peer, const Status& status) {
  if (peer < peers_.size()) peers_[peer].active = false;
  // The AV entries stay, so that late arrivals from the peer are still recognised (and
  // dropped) rather than reported as coming from an unknown sender.
  for (auto it = batches_.begin(); it != batches_.end();) {
    auto next = std::next(it);
    if (it->request.peer == peer) AbortBatch(*it, status);
    it = next;
  }
}

// ---------------------------------------------------------------------------------------------
// The progress loop

void Domain::Run(const Topology* topology, std::vector<int> cpus) {
  tls_progress_domain = this;
  if (topology != nullptr) {
    if (Status s = topology->BindCurrentThread(cpus); !s.ok()) {
      PD_LOG_WARN("fabric domain {}: progress thread left unpinned: {}", index_, s.ToString());
    }
  }
  for (size_t slot = 0; slot < recv_ops_.size(); ++slot) RepostReceive(slot);
  next_tick_ = Clock::now();
  while (true) {
    bool work = DrainCommands();
    if (stopping_.load(std::memory_order_acquire)) break;
    work |= PostReady();
    work |= PollCompletions();
    work |= RetryReceives();
    TimePoint now = Clock::now();
    if (now >= next_tick_) {
      SweepDeadlines(now);
      next_tick_ = std::min(now + kTickPeriod, events_->OnTick(index_, now));
    }
    if (work) {
      idle_rounds_ = 0;
      sleep_doublings_ = 0;
    } else {
      IdleWait(outstanding_ > 0 || !post_queue_.empty());
    }
  }
  DrainCommands();
  AbortAll(Status::Cancelled("fabric engine is shutting down"));
  tls_progress_domain = nullptr;
}

bool Domain::DrainCommands() {
  // Checked without the lock: the loop runs this every round, commands are rare.
  if (!has_commands_.load(std::memory_order_acquire)) return false;
  std::vector<Command> commands;
  {
    MutexLock lock(&mu_);
    has_commands_.store(false, std::memory_order_relaxed);
    commands.swap(commands_);
  }
  for (Command& c : commands) {
    if (auto* request = std::get_if<BatchRequest>(&c)) {
      Accept(std::move(*request));
    } else {
      std::get<std::function<void()>>(c)();
    }
  }
  return !commands.empty();
}

void Domain::Accept(BatchRequest request) {
  Batch& b = batches_.emplace_back();
  b.self = std::prev(batches_.end());
  b.total = request.message.empty() ? request.writes.size() : 1;
  b.request = std::move(request);
  if (b.request.peer >= peers_.size() || !peers_[b.request.peer].active) {
    // Removed between the engine's check and now: the removal already told its callers.
    AbortBatch(b, Status::Cancelled(fmt::format("peer {} was removed", b.request.peer)));
    return;
  }
  b.queued = true;
  post_queue_.push_back(&b);
}

bool Domain::PostReady() {
  bool any = false;
  int budget = kPostBudget;
  // EAGAIN may concern one peer only (tcp: its connection is not up, or the peer is dead and
  // the provider keeps retrying): that peer's batches wait for the next round, in order, but
  // must not hold back every other peer's (a dead prefill node would stop the heartbeats to
  // the live ones). When the provider's queue is full, every peer gets EAGAIN once per round.
  std::vector<PeerId> blocked;
  for (auto it = post_queue_.begin(); it != post_queue_.end() && budget > 0;) {
    Batch* b = *it;
    if (std::find(blocked.begin(), blocked.end(), b->request.peer) != blocked.end()) {
      ++it;
      continue;
    }
    const int r = PostOne(*b);
    if (r == 1) {
      any = true;
      --budget;
      continue;
    }
    if (r == 0) {  // reap completions first; try the other peers meanwhile
      blocked.push_back(b->request.peer);
      ++it;
      continue;
    }
    it = post_queue_.erase(it);
    b->queued = false;
    EndBatchIfDone(*b);
    any = true;
  }
  return any;
}

int Domain::PostOne(Batch& b) {
  if (b.stopped || b.next >= b.total) return -1;
  if (b.request.transfer->finished()) {  // ended by another domain's abort
    b.stopped = true;
    return -1;
  }
  const PeerRoute& route = peers_[b.request.peer];
  const bool is_send = !b.request.message.empty();
  if (is_send && b.send_slot == SIZE_MAX) {
    if (free_send_slots_.empty()) return 0;
    b.send_slot = free_send_slots_.back();
    free_send_slots_.pop_back();
    std::memcpy(message_memory_.get() + b.send_slot * slot_bytes_, b.request.message.data(),
                b.request.message.size());
  }
  OpContext* op = AllocateOp();
  op->batch = &b;
  ssize_t rc;
  if (is_send) {
    op->kind = OpContext::Kind::kSend;
    op->slot = b.send_slot;
    rc = fi_send(ep_.get(), message_memory_.get() + b.send_slot * slot_bytes_,
                 b.request.message.size(), message_desc_, route.target, &op->fi);
  } else {
    op->kind = OpContext::Kind::kWrite;
    const WriteOp& w = b.request.writes[b.next];
    rc = w.has_data ? fi_writedata(ep_.get(), w.src, w.length, w.desc, w.data, route.target,
                                   w.remote_addr, w.key, &op->fi)
                    : fi_write(ep_.get(), w.src, w.length, w.desc, route.target, w.remote_addr,
                               w.key, &op->fi);
  }
  if (rc == -FI_EAGAIN) {
    ReleaseOp(op);
    return 0;
  }
  if (rc != 0) {
    ReleaseOp(op);
    Status s = FabricError(is_send ? "fi_send" : "fi_writedata", rc)
                   .WithContext(fmt::format("to peer {}", b.request.peer));
    if (b.error.ok()) b.error = s;
    b.stopped = true;
    events_->OnPeerError(b.request.peer, s);
    return -1;
  }
  ++b.next;
  ++b.outstanding;
  ++outstanding_;
  return 1;
}

bool Domain::PollCompletions() {
  bool any = false;
  // Several reads per round while the CQ is full keeps per-round overhead off each op.
  for (int round = 0; round < kCqReadsPerRound; ++round) {
    const int got = ReadCompletions();
    if (got == 0) break;
    any = true;
    if (got < kCqBatch) break;
  }
  return any;
}

int Domain::ReadCompletions() {
  fi_cq_data_entry entries[kCqBatch];
  fi_addr_t sources[kCqBatch];
  ssize_t n = has_source_ ? fi_cq_readfrom(cq_.get(), entries, kCqBatch, sources)
                          : fi_cq_read(cq_.get(), entries, kCqBatch);
  if (n == -FI_EAGAIN) return 0;
  if (n == -FI_EAVAIL) {
    HandleError();
    return 1;
  }
  if (n < 0) {
    PD_LOG_ERROR("fabric domain {}: fi_cq_read failed: {}", index_,
                 fi_strerror(static_cast<int>(-n)));
    return 0;
  }
  for (ssize_t i = 0; i < n; ++i) {
    HandleCompletion(entries[i], has_source_ ? sources[i] : FI_ADDR_NOTAVAIL);
  }
  return static_cast<int>(n);
}

void Domain::HandleCompletion(const fi_cq_data_entry& entry, fi_addr_t source) {
  if ((entry.flags & FI_RECV) != 0) {
    auto* op = reinterpret_cast<OpContext*>(entry.op_context);
    const std::byte* data = message_memory_.get() + op->slot * slot_bytes_;
    events_->OnMessage(std::span<const std::byte>(data, entry.len));
    RepostReceive(op->slot);
    return;
  }
  if ((entry.flags & FI_REMOTE_CQ_DATA) != 0) {
    PeerId from = kUnknownPeer;
    bool from_removed_peer = false;
    if (has_source_ && source != FI_ADDR_NOTAVAIL) {
      auto it = source_to_peer_.find(source);
      if (it != source_to_peer_.end()) {
        from_removed_peer = !peers_[it->second].active;
        if (!from_removed_peer) from = it->second;
      }
    }
    events_->OnImmediate(from, static_cast<uint32_t>(entry.data), from_removed_peer);
    return;
  }
  if (entry.op_context != nullptr) {
    OpFinished(reinterpret_cast<OpContext*>(entry.op_context), Status::Ok());
  }
}

void Domain::HandleError() {
  fi_cq_err_entry err{};
  if (fi_cq_readerr(cq_.get(), &err, 0) != 1) return;
  char buf[256];
  const char* detail = fi_cq_strerror(cq_.get(), err.prov_errno, err.err_data, buf, sizeof buf);
  auto* op = reinterpret_cast<OpContext*>(err.op_context);
  if (op == nullptr) {
    PD_LOG_WARN("fabric domain {}: completion error without context: {} ({})", index_,
                fi_strerror(err.err), detail != nullptr ? detail : "");
    return;
  }
  if (op->kind == OpContext::Kind::kRecv) {
    if (err.err != FI_ECANCELED) {
      PD_LOG_WARN("fabric domain {}: receive failed: {} ({})", index_, fi_strerror(err.err),
                  detail != nullptr ? detail : "");
      RepostReceive(op->slot);
    }
    return;
  }
  Status s = Status::Unavailable(fmt::format(
      "{} to peer {} failed: {} ({})", op->kind == OpContext::Kind::kSend ? "send" : "write",
      op->batch->request.peer, fi_strerror(err.err), detail != nullptr ? detail : ""));
  OpFinished(op, s);
}

void Domain::OpFinished(OpContext* op, const Status& status) {
  Batch& b = *op->batch;
  if (op->kind == OpContext::Kind::kSend) {
    free_send_slots_.push_back(op->slot);
    b.send_slot = SIZE_MAX;
  }
  ReleaseOp(op);
  --b.outstanding;
  --outstanding_;
  if (!status.ok()) {
    if (b.error.ok()) b.error = status;
    b.stopped = true;
    const PeerId peer = b.request.peer;
    if (peer < peers_.size() && peers_[peer].active) events_->OnPeerError(peer, status);
  }
  EndBatchIfDone(b);
}

void Domain::EndBatchIfDone(Batch& b) {
  if (b.outstanding > 0 || b.queued) return;
  if (!b.stopped && b.next < b.total) return;
  if (!b.reported) {
    b.reported = true;
    b.request.transfer->BatchDone(b.error);
  }
  batches_.erase(b.self);
}

void Domain::AbortBatch(Batch& b, const Status& status) {
  b.stopped = true;
  if (!b.reported) {
    b.reported = true;
    b.request.transfer->Finish(status);
    b.request.transfer->BatchDone(status);  // keeps the share count right; fires nothing
  }
  EndBatchIfDone(b);
}

void Domain::SweepDeadlines(TimePoint now) {
  for (auto it = batches_.begin(); it != batches_.end();) {
    auto next = std::next(it);
    if (!it->reported && it->request.deadline.at() <= now) {
      Status s = Status::DeadlineExceeded(
          fmt::format("transfer to peer {} did not complete before its deadline "
                      "({} of {} operations posted, {} outstanding)",
                      it->request.peer, it->next, it->total, it->outstanding));
      // A peer that does not complete writes is suspect (e.g. a dead shm peer never answers).
      const PeerId peer = it->request.peer;
      if (peer < peers_.size() && peers_[peer].active) events_->OnPeerError(peer, s);
      AbortBatch(*it, s);
    }
    it = next;
  }
}

void Domain::AbortAll(const Status& status) {
  for (auto it = batches_.begin(); it != batches_.end();) {
    auto next = std::next(it);
    it->queued = false;
    AbortBatch(*it, status);
    it = next;
  }
  post_queue_.clear();
}

void Domain::IdleWait(bool busy) {
  // Progress is manual: a receiver that sleeps stalls its senders (shm needs the receiver to
  // move data). So after recent work the thread keeps polling, yielding the CPU to whatever
  // else is runnable, for config_.idle_spin; only then does it back off into short sleeps.
  const TimePoint now = Clock::now();
  if (idle_rounds_ == 0) last_work_ = now;
  ++idle_rounds_;
  if (now - last_work_ < config_.idle_spin) {
    sched_yield();
    return;
  }
  ++sleep_doublings_;
  const int doublings = std::min(sleep_doublings_, kBackoffDoublingsMax);
  std::chrono::microseconds sleep{1 << doublings};
  sleep = std::min<std::chrono::microseconds>(sleep, busy ? kBusySleepCap : config_.idle_poll_max);
  MutexLock lock(&mu_);
  if (!commands_.empty() || stop_) return;
  sleeping_ = true;
  cv_.WaitFor(&mu_, sleep);
  sleeping_ = false;
}

Status Domain::PostReceive(size_t slot) {
  OpContext& op = recv_ops_[slot];
  op.kind = OpContext::Kind::kRecv;
  op.slot = slot;
  op.batch = nullptr;
  ssize_t rc = fi_recv(ep_.get(), message_memory_.get() + slot * slot_bytes_, slot_bytes_,
                       message_desc_, FI_ADDR_UNSPEC, &op.fi);
  if (rc == -FI_EAGAIN) return Status::InProgress();
  if (rc != 0) return FabricError("fi_recv", rc);
  return Status::Ok();
}

void Domain::RepostReceive(size_t slot) {
  Status s = PostReceive(slot);
  if (s.in_progress()) {
    unposted_receives_.push_back(slot);  // provider busy: retried by the progress loop
  } else if (!s.ok()) {
    PD_LOG_ERROR("fabric domain {}: receive buffer lost: {}", index_, s.ToString());
  }
}

bool Domain::RetryReceives() {
  if (unposted_receives_.empty()) return false;
  std::vector<size_t> slots;
  slots.swap(unposted_receives_);
  for (size_t slot : slots) RepostReceive(slot);
  return unposted_receives_.size() < slots.size();
}

Domain::OpContext* Domain::AllocateOp() {
  if (free_ops_.empty()) {
    // A deque never moves its elements, so contexts handed to libfabric stay valid.
    op_storage_.emplace_back();
    return &op_storage_.back();
  }
  OpContext* op = free_ops_.back();
  free_ops_.pop_back();
  return op;
}

void Domain::ReleaseOp(OpContext* op) {
  op->batch = nullptr;
  free_ops_.push_back(op);
}

}  // namespace pdserve::fabric::internal
