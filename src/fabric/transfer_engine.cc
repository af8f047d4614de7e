#include "fabric/transfer_engine.h"

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <rdma/fabric.h>

#include "common/byte_codec.h"
#include "common/check.h"
#include "common/logging.h"
#include "fabric/domain.h"
#include "fabric/fi_handles.h"

namespace pdserve::fabric {
namespace {

constexpr uint32_t kMessageMagic = 0x4d445046;  // "FPDM"
constexpr uint16_t kMessageVersion = 1;
// Waits on progress threads for setup work (registration, AV updates, peer removal).
constexpr auto kControlTimeout = std::chrono::seconds(10);

// The internal::kMessageHeaderBytes in front of every control message: magic (u32), version
// (u16), reserved (u16, 0), the sender's instance (u64).
struct MessageHeader {
  uint32_t magic = 0;
  uint16_t version = 0;
  uint64_t instance = 0;
};

// The header for a message from `instance`, then `payload`.
std::string EncodeMessage(uint64_t instance, std::span<const std::byte> payload) {
  ByteWriter w;
  w.U32(kMessageMagic);
  w.U16(kMessageVersion);
  w.U16(0);
  w.U64(instance);
  PD_CHECK(w.size() == internal::kMessageHeaderBytes);
  w.Raw(std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()));
  return w.Take();
}

// The header in front of `bytes`; false if they are too short to hold one.
bool DecodeMessageHeader(std::span<const std::byte> bytes, MessageHeader* header) {
  ByteReader r(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  uint16_t reserved = 0;
  return r.U32("magic", &header->magic).ok() && r.U16("version", &header->version).ok() &&
         r.U16("reserved", &reserved).ok() && r.U64("instance", &header->instance).ok();
}

uint64_t RandomInstance() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return v == 0 ? 1 : v;
}

// Whether [offset + index * stride, + length) lies inside [0, limit), without overflow.
bool PageInBounds(uint64_t offset, uint64_t stride, uint32_t index, uint64_t length,
                  uint64_t limit) {
  unsigned __int128 end = static_cast<unsigned __int128>(offset) +
                          static_cast<unsigned __int128>(stride) * index + length;
  return end <= limit;
}

Result<InfoPtr> QueryProvider(const FabricConfig& config, bool want_source) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) return Status::ResourceExhausted("fi_allocinfo failed");
  hints->caps = FI_MSG | FI_RMA | (want_source ? FI_SOURCE : 0);
  hints->mode = FI_CONTEXT | FI_CONTEXT2;  // every operation context is an fi_context2
  hints->ep_attr->type = FI_EP_RDM;
  // The registration modes the engine knows how to handle; the provider keeps those it needs.
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->cq_data_size = 4;  // 32-bit immediates
  hints->fabric_attr->prov_name =
      strdup(std::string(LibfabricProviderString(config.provider)).c_str());
  const char* node = config.node.empty() ? nullptr : config.node.c_str();
  fi_info* info = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 17), node, nullptr, node != nullptr ? FI_SOURCE : 0,
                      hints.get(), &info);
  if (rc != 0) {
    return FabricError(
        fmt::format("fi_getinfo(provider {}{}{})", LibfabricProviderString(config.provider),
                    node != nullptr ? ", node " : "", node != nullptr ? node : ""),
        rc);
  }
  return InfoPtr(info);
}

// The best fi_info for a domain name: IPv4 before other address formats (link-local IPv6
// addresses need scopes that peers do not share).
const fi_info* InfoForDomain(const fi_info* list, const std::string& name) {
  const fi_info* best = nullptr;
  for (const fi_info* i = list; i != nullptr; i = i->next) {
    if (i->domain_attr->name == nullptr || name != i->domain_attr->name) continue;
    if (best == nullptr ||
        (i->addr_format == FI_SOCKADDR_IN && best->addr_format != FI_SOCKADDR_IN)) {
      best = i;
    }
  }
  return best;
}

}  // namespace

namespace internal {

// Routes domain events into the engine (keeps DomainEvents out of the public header).
class TransferEngineEvents final : public DomainEvents {
 public:
  explicit TransferEngineEvents(TransferEngine* engine) : engine_(engine) {}
  void OnImmediate(PeerId from, uint32_t imm, bool from_removed_peer) override {
    engine_->HandleImmediate(from, imm, from_removed_peer);
  }
  void OnMessage(std::span<const std::byte> bytes) override { engine_->HandleMessage(bytes); }
  void OnPeerError(PeerId peer, const Status& status) override {
    engine_->HandlePeerError(peer, status);
  }
  TimePoint OnTick(int domain_index, TimePoint now) override {
    return engine_->HandleTick(domain_index, now);
  }

 private:
  TransferEngine* const engine_;
};

}  // namespace internal

struct TransferEngine::Region {
  std::byte* base = nullptr;
  size_t length = 0;
  std::vector<internal::MemoryKeys> keys;  // per domain
};

struct TransferEngine::Peer {
  TransferEngineAddress address;
  bool removed = false;
  Status error;
};

TransferEngine::TransferEngine(const FabricConfig& config, TransferEngineHandlers handlers)
    : config_(config),
      handlers_(std::move(handlers)),
      events_(std::make_unique<internal::TransferEngineEvents>(this)),
      counters_(config.max_early_immediate_values) {}

Result<std::unique_ptr<TransferEngine>> TransferEngine::Create(const FabricConfig& config,
                                                               TransferEngineHandlers handlers) {
  PD_RETURN_IF_ERROR(ValidateConfig(config));
  std::unique_ptr<TransferEngine> engine(new TransferEngine(config, std::move(handlers)));
  PD_RETURN_IF_ERROR(engine->OpenDomains());
  engine->timer_ = std::thread(&TransferEngine::RunTimer, engine.get());
  return engine;
}

Status TransferEngine::OpenDomains() {
  Result<InfoPtr> info = QueryProvider(config_, /*want_source=*/true);
  if (!info.ok()) {
    // Without FI_SOURCE, immediates cannot be attributed to peers; still usable.
    PD_LOG_WARN("fabric: provider {} without FI_SOURCE ({}); retrying",
                ProviderName(config_.provider), info.status().ToString());
    info = QueryProvider(config_, /*want_source=*/false);
  }
  PD_RETURN_IF_ERROR(info.status());
  std::vector<std::string> available;
  for (const fi_info* i = info->get(); i != nullptr; i = i->next) {
    std::string name = i->domain_attr->name != nullptr ? i->domain_attr->name : "";
    if (std::find(available.begin(), available.end(), name) == available.end()) {
      available.push_back(name);
    }
  }
  if (Result<Topology> t = Topology::LoadSystem(); t.ok()) {
    topology_ = std::move(*t);
  } else {
    PD_LOG_WARN("fabric: no hwloc topology ({}); progress threads stay unpinned",
                t.status().ToString());
  }
  std::vector<DomainPlacement> placements;
  if (topology_) {
    PD_ASSIGN_OR_RETURN(placements,
                        topology_->PlaceDomains(available, config_.num_domains,
                                                config_.memory_numa_node, config_.nics));
  } else {
    PD_ASSIGN_OR_RETURN(placements,
                        Topology().PlaceDomains(available, config_.num_domains, -1, config_.nics));
  }
  address_.provider = config_.provider;
  address_.instance = RandomInstance();
  for (int d = 0; d < config_.num_domains; ++d) {
    DomainPlacement& p = placements[static_cast<size_t>(d)];
    const fi_info* chosen = InfoForDomain(info->get(), p.nic);
    PD_ASSIGN_OR_RETURN(auto domain, internal::Domain::Open(chosen, d, config_, events_.get()));
    std::vector<int> cpus =
        config_.progress_cpus.empty() ? p.cpus : config_.progress_cpus[static_cast<size_t>(d)];
    if (!config_.pin_progress_threads) cpus.clear();
    address_.endpoints.push_back(domain->endpoint_name());
    PD_RETURN_IF_ERROR(domain->Start(topology_ ? &*topology_ : nullptr, std::move(cpus)));
    domains_.push_back(std::move(domain));
  }
  PD_LOG_DEBUG("fabric: {} domain(s) on {} ready", domains_.size(), ProviderName(config_.provider));
  return Status::Ok();
}

TransferEngine::~TransferEngine() {
  {
    MutexLock lock(&timer_mu_);
    timer_stop_ = true;
  }
  timer_cv_.NotifyAll();
  if (timer_.joinable()) timer_.join();
  domains_.clear();  // each aborts its transfers (Cancelled) and joins its thread
  std::vector<ImmediateCounters::Fired> fired;
  counters_.CancelAll(Status::Cancelled("fabric engine is shutting down"), &fired);
  for (auto& f : fired) f.Run();
}

// ---------------------------------------------------------------------------------------------
// Memory

Result<RegionId> TransferEngine::RegisterMemory(void* base, size_t length, MemoryKind kind) {
  if (kind != MemoryKind::kHost) {
    return Status::Unimplemented("device memory registration (FI_HMEM) is not implemented yet");
  }
  if (base == nullptr || length == 0) {
    return Status::InvalidArgument("cannot register an empty memory region");
  }
  if (internal::Domain::OnProgressThread()) {
    return Status::FailedPrecondition("RegisterMemory may not be called from a fabric callback");
  }
  RegionId id = 0;
  {
    WriterMutexLock lock(&regions_mu_);
    id = next_region_++;
  }
  // No engine lock is held while waiting on progress threads: their callbacks may post, and
  // posting takes the locks shared.
  Region region{static_cast<std::byte*>(base), length, {}};
  for (auto& domain : domains_) {
    auto keys = std::make_shared<internal::MemoryKeys>();
    internal::Domain* d = domain.get();
    Status s = d->RunSync(
        [d, keys, id, base, length]() -> Status {
          PD_ASSIGN_OR_RETURN(*keys, d->RegisterMemory(id, base, length));
          return Status::Ok();
        },
        Deadline::After(kControlTimeout));
    if (!s.ok()) {
      for (size_t i = 0; i < region.keys.size(); ++i) {
        internal::Domain* undo = domains_[i].get();
        (void)undo->RunSync(
            [undo, id] {
              undo->DeregisterMemory(id);
              return Status::Ok();
            },
            Deadline::After(kControlTimeout));
      }
      return s.WithContext(fmt::format("registering {} bytes", length));
    }
    region.keys.push_back(*keys);
  }
  WriterMutexLock lock(&regions_mu_);
  regions_.emplace(id, std::move(region));
  return id;
}

Status TransferEngine::DeregisterMemory(RegionId id) {
  if (internal::Domain::OnProgressThread()) {
    return Status::FailedPrecondition("DeregisterMemory may not be called from a fabric callback");
  }
  {
    WriterMutexLock lock(&regions_mu_);
    if (regions_.erase(id) == 0) {
      return Status::NotFound(fmt::format("memory region {} is not registered", id));
    }
  }
  Status result;
  for (auto& domain : domains_) {
    internal::Domain* d = domain.get();
    Status s = d->RunSync(
        [d, id] {
          d->DeregisterMemory(id);
          return Status::Ok();
        },
        Deadline::After(kControlTimeout));
    if (result.ok()) result = s;
  }
  return result;
}

Result<MemoryDescriptor> TransferEngine::Describe(RegionId id) const {
  ReaderMutexLock lock(&regions_mu_);
  auto it = regions_.find(id);
  if (it == regions_.end()) {
    return Status::NotFound(fmt::format("memory region {} is not registered", id));
  }
  MemoryDescriptor d;
  d.length = it->second.length;
  for (const auto& k : it->second.keys) d.domains.push_back(k.remote);
  return d;
}

// ---------------------------------------------------------------------------------------------
// Peers

Result<PeerId> TransferEngine::AddPeer(const TransferEngineAddress& address) {
  if (address.provider != config_.provider) {
    return Status::InvalidArgument(fmt::format("peer uses provider {}, this engine {}",
                                               ProviderName(address.provider),
                                               ProviderName(config_.provider)));
  }
  if (address.endpoints.empty()) return Status::InvalidArgument("peer address has no endpoints");
  if (internal::Domain::OnProgressThread()) {
    return Status::FailedPrecondition("AddPeer may not be called from a fabric callback");
  }
  // One AddPeer at a time, so that two adds of one instance cannot race in the domains.
  MutexLock add_lock(&add_peer_mu_);
  PeerId id = kUnknownPeer;
  {
    WriterMutexLock lock(&peers_mu_);
    if (auto it = live_instances_.find(address.instance); it != live_instances_.end()) {
      return it->second;
    }
    id = next_peer_++;
  }
  // Domains learn the peer first, without holding peers_mu_ (progress-thread callbacks take
  // it); only then does the engine accept posts to it.
  for (size_t d = 0; d < domains_.size(); ++d) {
    internal::Domain* domain = domains_[d].get();
    auto endpoints = address.endpoints;
    const size_t target = d % endpoints.size();
    Status s = domain->RunSync(
        [domain, id, endpoints, target] { return domain->AddPeer(id, endpoints, target); },
        Deadline::After(kControlTimeout));
    if (!s.ok()) {
      ForgetPeerInDomains(id, d);
      return s;
    }
  }
  WriterMutexLock lock(&peers_mu_);
  peers_.emplace(id, Peer{address, false, Status::Ok()});
  live_instances_[address.instance] = id;
  return id;
}

void TransferEngine::ForgetPeerInDomains(PeerId id, size_t count) {
  for (size_t d = 0; d < count; ++d) {
    internal::Domain* domain = domains_[d].get();
    (void)domain->RunSync(
        [domain, id] {
          domain->RemovePeer(id, Status::Cancelled("peer add failed"));
          return Status::Ok();
        },
        Deadline::After(kControlTimeout));
  }
}

Status TransferEngine::RemovePeer(PeerId id) {
  if (internal::Domain::OnProgressThread()) {
    return Status::FailedPrecondition("RemovePeer may not be called from a fabric callback");
  }
  {
    // Exclusive: posts hold the shared lock while submitting, so every submission to this
    // peer is queued before the removal task below and ends inside it.
    WriterMutexLock lock(&peers_mu_);
    auto it = peers_.find(id);
    if (it == peers_.end()) return Status::NotFound(fmt::format("peer {} is unknown", id));
    if (it->second.removed) return Status::Ok();
    it->second.removed = true;
    live_instances_.erase(it->second.address.instance);
  }
  Status result;
  const Status cancelled = Status::Cancelled(fmt::format("peer {} was removed", id));
  for (auto& domain : domains_) {
    internal::Domain* d = domain.get();
    Status s = d->RunSync(
        [d, id, cancelled] {
          d->RemovePeer(id, cancelled);
          return Status::Ok();
        },
        Deadline::After(kControlTimeout));
    if (result.ok()) result = s;
  }
  return result;
}

Status TransferEngine::PeerError(PeerId id) const {
  ReaderMutexLock lock(&peers_mu_);
  auto it = peers_.find(id);
  if (it == peers_.end()) return Status::NotFound(fmt::format("peer {} is unknown", id));
  return it->second.error;
}

Result<const TransferEngine::Peer*> TransferEngine::LivePeer(PeerId id) const {
  auto it = peers_.find(id);
  if (it == peers_.end() || it->second.removed) {
    return Status::NotFound(fmt::format("peer {} is unknown or removed", id));
  }
  return &it->second;
}

// ---------------------------------------------------------------------------------------------
// Posting

Result<Deadline> TransferEngine::TransferDeadline(const std::optional<Deadline>& deadline) const {
  if (deadline.has_value()) return *deadline;
  return Deadline::After(config_.default_transfer_timeout);
}

Status TransferEngine::PostPagedWrite(const PagedWrite& w, Completion completion) {
  if (w.src_pages.empty() || w.src_pages.size() != w.dst_pages.size()) {
    return Status::InvalidArgument(
        fmt::format("paged write needs equal, non-empty page lists "
                    "(got {} source and {} destination pages)",
                    w.src_pages.size(), w.dst_pages.size()));
  }
  if (w.length == 0) return Status::InvalidArgument("paged write has zero bytes per page");
  if (w.dst == nullptr) return Status::InvalidArgument("paged write has no destination");
  PD_ASSIGN_OR_RETURN(Deadline deadline, TransferDeadline(w.deadline));

  ReaderMutexLock regions_lock(&regions_mu_);
  auto rit = regions_.find(w.src_region);
  if (rit == regions_.end()) {
    return Status::NotFound(fmt::format("memory region {} is not registered", w.src_region));
  }
  const Region& region = rit->second;
  for (size_t i = 0; i < w.src_pages.size(); ++i) {
    if (!PageInBounds(w.src_offset, w.src_stride, w.src_pages[i], w.length, region.length)) {
      return Status::OutOfRange(fmt::format("source page {} (entry {}) lies outside region {}",
                                            w.src_pages[i], i, w.src_region));
    }
    if (!PageInBounds(w.dst_offset, w.dst_stride, w.dst_pages[i], w.length, w.dst->length)) {
      return Status::OutOfRange(fmt::format(
          "destination page {} (entry {}) lies outside the destination region", w.dst_pages[i], i));
    }
  }

  ReaderMutexLock peers_lock(&peers_mu_);
  PD_ASSIGN_OR_RETURN(const Peer* peer, LivePeer(w.peer));
  const size_t remote_domains = peer->address.endpoints.size();
  if (w.dst->domains.size() != remote_domains) {
    return Status::InvalidArgument(
        fmt::format("destination descriptor has {} domains but peer {} has {} endpoints",
                    w.dst->domains.size(), w.peer, remote_domains));
  }
  const size_t stripes = std::min(domains_.size(), w.src_pages.size());
  std::vector<internal::BatchRequest> batches(stripes);
  auto transfer = std::make_shared<internal::TransferState>(std::move(completion), w.peer,
                                                            static_cast<int>(stripes));
  for (size_t d = 0; d < stripes; ++d) {
    batches[d].transfer = transfer;
    batches[d].peer = w.peer;
    batches[d].deadline = deadline;
    batches[d].writes.reserve(w.src_pages.size() / stripes + 1);
  }
  for (size_t i = 0; i < w.src_pages.size(); ++i) {
    const size_t d = i % stripes;
    const RemoteKey& remote = w.dst->domains[d % remote_domains];
    internal::WriteOp op;
    op.src = region.base + w.src_offset + static_cast<uint64_t>(w.src_pages[i]) * w.src_stride;
    op.desc = region.keys[d].desc;
    op.length = w.length;
    op.remote_addr =
        remote.base + w.dst_offset + static_cast<uint64_t>(w.dst_pages[i]) * w.dst_stride;
    op.key = remote.key;
    op.has_data = w.immediate.has_value();
    op.data = w.immediate.value_or(0);
    batches[d].writes.push_back(op);
  }
  for (size_t d = 0; d < stripes; ++d) domains_[d]->Submit(std::move(batches[d]));
  return Status::Ok();
}

Status TransferEngine::PostWrite(const SingleWrite& w, Completion completion) {
  const uint32_t page = 0;
  PagedWrite paged;
  paged.src_region = w.src_region;
  paged.src_offset = w.src_offset;
  paged.src_pages = std::span<const uint32_t>(&page, 1);
  paged.peer = w.peer;
  paged.dst = w.dst;
  paged.dst_offset = w.dst_offset;
  paged.dst_pages = std::span<const uint32_t>(&page, 1);
  paged.length = w.length;
  paged.immediate = w.immediate;
  paged.deadline = w.deadline;
  return PostPagedWrite(paged, std::move(completion));
}

Status TransferEngine::PostImmediate(PeerId peer_id, const MemoryDescriptor& dst, uint32_t imm,
                                     Completion completion, std::optional<Deadline> deadline) {
  PD_ASSIGN_OR_RETURN(Deadline at, TransferDeadline(deadline));
  ReaderMutexLock lock(&peers_mu_);
  PD_ASSIGN_OR_RETURN(const Peer* peer, LivePeer(peer_id));
  if (dst.domains.size() != peer->address.endpoints.size()) {
    return Status::InvalidArgument("destination descriptor does not match the peer's domains");
  }
  internal::BatchRequest request;
  request.transfer = std::make_shared<internal::TransferState>(std::move(completion), peer_id, 1);
  request.peer = peer_id;
  request.deadline = at;
  internal::WriteOp op;  // zero bytes: only the immediate travels
  op.remote_addr = dst.domains[0].base;
  op.key = dst.domains[0].key;
  op.has_data = true;
  op.data = imm;
  request.writes.push_back(op);
  domains_[0]->Submit(std::move(request));
  return Status::Ok();
}

Status TransferEngine::Send(PeerId peer_id, std::span<const std::byte> payload,
                            Completion completion, std::optional<Deadline> deadline) {
  if (payload.size() > config_.max_message_bytes) {
    return Status::InvalidArgument(fmt::format("message of {} bytes exceeds the {} byte limit",
                                               payload.size(), config_.max_message_bytes));
  }
  PD_ASSIGN_OR_RETURN(Deadline at, TransferDeadline(deadline));
  internal::BatchRequest request;
  request.message = EncodeMessage(address_.instance, payload);
  ReaderMutexLock lock(&peers_mu_);
  PD_RETURN_IF_ERROR(LivePeer(peer_id).status());
  request.transfer = std::make_shared<internal::TransferState>(std::move(completion), peer_id, 1);
  request.peer = peer_id;
  request.deadline = at;
  // One domain for all messages keeps them in order on providers that order sends.
  domains_[0]->Submit(std::move(request));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Receiver side

Status TransferEngine::Expect(uint32_t imm, uint32_t count, Deadline deadline,
                              ImmediateCounters::Callback callback) {
  PD_RETURN_IF_ERROR(counters_.Expect(imm, count, deadline, std::move(callback)));
  KickTimer();  // it may be ready already, or due earlier than the timer's next wake-up
  return Status::Ok();
}

bool TransferEngine::RemoveExpectation(uint32_t imm) { return counters_.Remove(imm); }

uint32_t TransferEngine::EarlyArrivals(uint32_t imm) const { return counters_.EarlyArrivals(imm); }

TransferEngineStats TransferEngine::stats() const {
  TransferEngineStats s;
  s.messages_dropped = messages_dropped_.load();
  return s;
}

void TransferEngine::HandleImmediate(PeerId from, uint32_t imm, bool from_removed_peer) {
  std::vector<ImmediateCounters::Fired> fired;
  if (from_removed_peer) {
    // Counted only by an expectation waiting for it now, never remembered nor handed to a
    // handler: nothing of a removed peer is kept. Not dropped outright, because libfabric 1.17's
    // tcp provider was seen to attribute (FI_SOURCE) a live peer's writes to a removed peer's
    // address entry (a retried or restarted prefill then never completed); the immediate's own
    // contents (the messenger's slot and generation) tell a stale write from a current one.
    counters_.Arrive(imm, /*remember=*/false, &fired);
    for (auto& f : fired) f.Run();
    return;
  }
  const bool has_handler = static_cast<bool>(handlers_.on_unmatched_immediate);
  auto arrival = counters_.Arrive(imm, /*remember=*/!has_handler, &fired);
  if (arrival == ImmediateCounters::Arrival::kUnmatched && has_handler &&
      !handlers_.on_unmatched_immediate(from, imm)) {
    // Not consumed: remember it (or count it, if an Expect arrived meanwhile).
    counters_.Arrive(imm, /*remember=*/true, &fired);
  }
  for (auto& f : fired) f.Run();
}

void TransferEngine::HandleMessage(std::span<const std::byte> bytes) {
  MessageHeader header;
  if (!DecodeMessageHeader(bytes, &header)) {
    messages_dropped_.fetch_add(1);
    return;
  }
  if (header.magic != kMessageMagic || header.version != kMessageVersion) {
    PD_LOG_WARN("fabric: dropped a control message with bad magic/version");
    messages_dropped_.fetch_add(1);
    return;
  }
  // A removed peer is no peer: what it still sends arrives as from an unknown sender, never
  // under its old id, so only what a stranger may say (a new handshake) can come of it.
  PeerId from = kUnknownPeer;
  {
    ReaderMutexLock lock(&peers_mu_);
    if (auto it = live_instances_.find(header.instance); it != live_instances_.end()) {
      from = it->second;
    }
  }
  if (handlers_.on_message)
    handlers_.on_message(from, header.instance, bytes.subspan(internal::kMessageHeaderBytes));
}

void TransferEngine::HandlePeerError(PeerId id, const Status& error) {
  {
    WriterMutexLock lock(&peers_mu_);
    auto it = peers_.find(id);
    if (it == peers_.end() || it->second.removed || !it->second.error.ok()) return;
    it->second.error = error;
  }
  PD_LOG_WARN("fabric: peer {} failed: {}", id, error.ToString());
  if (handlers_.on_peer_error) handlers_.on_peer_error(id, error);
}

TimePoint TransferEngine::HandleTick(int, TimePoint) {
  return TimePoint::max();  // expectation deadlines live on the timer thread
}

void TransferEngine::KickTimer() {
  {
    MutexLock lock(&timer_mu_);
    timer_kick_ = true;
  }
  timer_cv_.NotifyOne();
}

void TransferEngine::RunTimer() {
  // Bounded sleeps even without a deadline pending, so nothing relies on a missed wake-up.
  constexpr auto kMaxSleep = std::chrono::milliseconds(100);
  timer_mu_.Lock();
  while (!timer_stop_) {
    timer_kick_ = false;
    timer_mu_.Unlock();
    std::vector<ImmediateCounters::Fired> fired;
    const TimePoint now = Clock::now();
    const TimePoint next = std::min(counters_.TakeDue(now, &fired), now + kMaxSleep);
    for (auto& f : fired) f.Run();
    timer_mu_.Lock();
    while (!timer_stop_ && !timer_kick_) {
      if (timer_cv_.WaitUntil(&timer_mu_, next) == std::cv_status::timeout) break;
    }
  }
  timer_mu_.Unlock();
}

}  // namespace pdserve::fabric
