#include "messenger/decode_messenger.h"

#include <algorithm>
#include <future>
#include <limits>

#include <fmt/format.h>

#include "common/logging.h"
#include "messenger/immediate.h"
#include "messenger/node_info.h"
#include "messenger/peer_views.h"
#include "messenger/send_control.h"

namespace pdserve::messenger {

struct DecodeMessenger::Peer {
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
  std::shared_ptr<const TransferPlan> plan;
  TimePoint state_since;
  TimePoint last_heard;
  TimePoint retry_at;
  uint64_t heartbeat = 0;
  int64_t reported_tokens = 0;  // from its last LoadReport
  int64_t own_tokens = 0;       // prefill tokens this node has in flight there
  // spec.resolve() running on a thread of its own; its answer is posted to the loop.
  std::future<void> resolving;
};

struct DecodeMessenger::Request {
  // kLocal: no prefill peer was usable and this node's engine prefills the prompt itself.
  enum class State : uint8_t { kAwaitingPages, kQueued, kInFlight, kLanded, kCancelling, kLocal };
  std::string id;  // engine id
  std::string peer_override;
  std::vector<int32_t> prefix;  // tokens [0, n-1)
  std::vector<PageId> pages;    // pages holding the prefix
  State state = State::kAwaitingPages;
  Peer* peer = nullptr;
  uint64_t request_id = 0;  // of the current transfer
  uint32_t slot = 0;
  uint32_t immediate = 0;
  bool has_slot = false;
  bool engine_finished = false;
  // Its peer failed it (lost, or a write failed): once no write can land, it goes to another
  // peer, is prefilled here, or fails with `lost_because`.
  bool redispatch = false;
  bool failed = false;  // FailRequest ran: the engine's final output finishes it
  int retries = 0;
  std::vector<Peer*> failed_peers;
  Status lost_because;
  Deadline deadline = Deadline::Never();  // for the KV to land
  TimePoint cancel_sent;
  TimePoint prefill_sent;  // of the current transfer
};

std::vector<double> TransferLatencyBounds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}

Result<std::unique_ptr<DecodeMessenger>> DecodeMessenger::Create(
    Engine* engine, MessengerOptions options, std::vector<PrefillPeerSpec> peers) {
  if (engine == nullptr) return Status::InvalidArgument("decode messenger needs an engine");
  if (options.cluster_key.empty()) {
    return Status::InvalidArgument("the messenger needs a cluster key");
  }
  std::unique_ptr<DecodeMessenger> m(
      new DecodeMessenger(engine, std::move(options), std::move(peers)));
  PD_RETURN_IF_ERROR(m->Init());
  return m;
}

DecodeMessenger::DecodeMessenger(Engine* engine, MessengerOptions options,
                                 std::vector<PrefillPeerSpec> peers)
    : engine_(engine), options_(std::move(options)), incarnation_(NewIncarnation()) {
  for (PrefillPeerSpec& spec : peers) {
    MutexLock lock(&names_mu_);
    if (!peer_names_.insert(spec.name).second) continue;  // named twice: one peer
    peers_.push_back(std::make_unique<Peer>());
    peers_.back()->spec = std::move(spec);
  }
}

Status DecodeMessenger::AddPeer(PrefillPeerSpec spec) {
  if (spec.name.empty() || !spec.resolve) {
    return Status::InvalidArgument("a prefill peer needs a name and a way to resolve it");
  }
  {
    MutexLock lock(&names_mu_);
    if (!peer_names_.insert(spec.name).second) return Status::Ok();
  }
  PD_LOG_INFO("prefill peer {} joined", spec.name);
  loop_->Post([this, spec = std::move(spec)]() mutable {
    peers_.push_back(std::make_unique<Peer>());
    peers_.back()->spec = std::move(spec);
    Tick();  // connect at once
  });
  return Status::Ok();
}

Status DecodeMessenger::Init() {
  loop_ = std::make_shared<ControlLoop>(options_.heartbeat_interval, [this] { Tick(); });
  fabric::TransferEngineHandlers handlers;
  handlers.on_message = [this](fabric::PeerId from, uint64_t, std::span<const std::byte> payload) {
    OnMessage(from, payload);
  };
  // Every expectation is registered before its PrefillRequest leaves, so an immediate nobody
  // expects belongs to an abandoned transfer: drop it.
  handlers.on_unmatched_immediate = [](fabric::PeerId, uint32_t) { return true; };
  handlers.on_peer_error = [this](fabric::PeerId id, const Status& error) {
    loop_->Post([this, id, error] {
      if (Peer* p = FindPeer(id)) PeerDead(*p, error);
    });
  };
  PD_ASSIGN_OR_RETURN(fabric_, fabric::TransferEngine::Create(options_.fabric, handlers));
  // The caches are registered once per prefill peer (RegisterFor), not here.
  std::vector<KvLayout> layouts;
  for (int r = 0; r < engine_->tp_size(); ++r) layouts.push_back(engine_->kv_cache(r).layout());
  PD_ASSIGN_OR_RETURN(local_, MakeLocalNodeInfo(engine_->model().config().num_kv_heads, layouts,
                                                std::vector<std::string>(layouts.size()),
                                                options_.model_fingerprint, options_.kernel_path));
  reply_address_ = fabric_->address().Serialize();
  loop_->Start();
  loop_->Post([this] { Tick(); });  // connect at once
  return Status::Ok();
}

DecodeMessenger::~DecodeMessenger() {
  if (loop_) loop_->Stop();
  fabric_.reset();
}

Status DecodeMessenger::Submit(EngineRequest request, const std::string& prefill_peer) {
  if (!prefill_peer.empty()) {
    MutexLock lock(&names_mu_);
    if (peer_names_.count(prefill_peer) == 0) {
      return Status::InvalidArgument("unknown prefill peer '" + prefill_peer + "'");
    }
  }
  if (request.prompt.empty()) return Status::InvalidArgument("empty prompt");
  if (prefill_peer.empty() && request.prompt.size() <= static_cast<size_t>(std::max(
                                                           0, options_.local_prefill_max_tokens))) {
    request.kind = RequestKind::kGenerate;
    Status s = engine_->Submit(std::move(request));
    if (s.ok()) {
      loop_->Post([this] {
        ++counters_.local_prefills;
        PublishStats();
      });
    }
    return s;
  }
  auto req = std::make_shared<Request>();
  req->id = request.id;
  req->peer_override = prefill_peer;
  req->prefix.assign(request.prompt.begin(), request.prompt.end() - 1);
  request.kind = RequestKind::kRemotePrefill;
  std::weak_ptr<ControlLoop> weak_loop = loop_;
  request.on_pages_allocated = [this, weak_loop, id = request.id](const std::vector<PageId>& p) {
    if (auto loop = weak_loop.lock()) loop->Post([this, id, p] { OnPagesAllocated(id, p); });
  };
  request.on_output = [this, weak_loop, id = request.id,
                       user = std::move(request.on_output)](const RequestOutput& out) {
    if (!out.finished) return user(out);
    RequestOutput final_out = out;
    if (auto loop = weak_loop.lock()) {
      {
        MutexLock lock(&failures_mu_);
        auto it = failures_.find(id);
        if (it != failures_.end()) {
          final_out.finish_reason = FinishReason::kError;
          final_out.status = it->second;
          failures_.erase(it);
        }
      }
      loop->Post([this, id] { OnEngineFinished(id); });
    }
    user(final_out);
  };
  // Registered before the engine can call back (the loop runs closures in order).
  loop_->Post([this, req] {
    const std::string key = req->id;  // *req is moved from below
    requests_[key] = std::make_unique<Request>(std::move(*req));
    ++counters_.requests_total;
    PublishStats();
  });
  const std::string id = request.id;
  Status s = engine_->Submit(std::move(request));
  if (!s.ok()) loop_->Post([this, id] { requests_.erase(id); });
  return s;
}

void DecodeMessenger::OnMessage(fabric::PeerId from, std::span<const std::byte> payload) {
  Result<Message> message = DecodeMessage(
      std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()));
  if (!message.ok()) {
    PD_LOG_WARN("dropped a malformed message from peer {}: {}", from, message.status().ToString());
    return;
  }
  loop_->Post(
      [this, from, m = std::move(message).value()]() mutable { Handle(from, std::move(m)); });
}

DecodeMessenger::Peer* DecodeMessenger::FindPeer(fabric::PeerId id) {
  if (id == fabric::kUnknownPeer) return nullptr;
  for (auto& p : peers_) {
    if (p->id == id && p->state != Peer::State::kDisconnected) return p.get();
  }
  return nullptr;
}

void DecodeMessenger::Handle(fabric::PeerId from, Message message) {
  Peer* peer = FindPeer(from);
  if (peer == nullptr) return;
  peer->last_heard = Clock::now();
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, HelloAck>) {
          if (peer->state == Peer::State::kHelloSent) HandleHelloAck(*peer, m);
        } else if constexpr (std::is_same_v<T, HandshakeRefused>) {
          PeerRefused(*peer, Status::FailedPrecondition("prefill peer " + peer->spec.name +
                                                        " refused the handshake: " + m.reason));
        } else if constexpr (std::is_same_v<T, LoadReport>) {
          peer->reported_tokens = static_cast<int64_t>(m.outstanding_prefill_tokens);
          if (peer->state == Peer::State::kFinishSent) PeerReady(*peer);
        } else if constexpr (std::is_same_v<T, WriteFailed>) {
          OnWriteFailed(m.request_id, m.reason);
        } else if constexpr (std::is_same_v<T, CancelAck>) {
          OnCancelAck(m.request_id);
        }
      },
      message);
}

std::chrono::milliseconds DecodeMessenger::ReconnectBackoff(const Peer& peer) const {
  // One heartbeat interval, doubled per failed attempt up to kMaxReconnectBackoff (or the
  // interval, if longer): a peer that answers again is found within about a second, and one
  // that stays down costs an HTTP attempt a second.
  const auto first = options_.heartbeat_interval;
  const auto cap = std::max(first, kMaxReconnectBackoff);
  auto backoff = first;
  for (int i = 0; i < peer.failed_attempts && backoff < cap; ++i) backoff *= 2;
  return std::min(backoff, cap);
}

void DecodeMessenger::StartResolve(Peer& peer) {
  std::weak_ptr<ControlLoop> weak_loop = loop_;
  Peer* p = &peer;  // peers_ never shrinks: the pointer lives as long as the messenger
  peer.resolving =
      std::async(std::launch::async, [this, p, weak_loop, resolve = peer.spec.resolve] {
        Result<fabric::TransferEngineAddress> address = resolve();
        if (auto loop = weak_loop.lock()) {
          loop->Post([this, p, address = std::move(address)]() mutable {
            p->resolving = {};  // its thread has nothing left to do but return
            if (p->state == Peer::State::kDisconnected) Connect(*p, std::move(address));
          });
        }
      });
}

void DecodeMessenger::Connect(Peer& peer, Result<fabric::TransferEngineAddress> address) {
  Status s = address.status();
  if (s.code() == StatusCode::kPermissionDenied) {
    PeerRefused(peer, s);  // told before any handshake: it does not share the cluster secret
    peer.retry_at = Clock::now() + options_.handshake_timeout / 3;
    return;
  }
  // A removed instance is added again as a new fabric peer: its old id, views and keys stay
  // revoked, and the slots its transfers used moved on to new generations (FreeSlot), so
  // nothing of the old epoch can count in the new one.
  Result<fabric::PeerId> id = s.ok() ? fabric_->AddPeer(*address) : Result<fabric::PeerId>(s);
  Result<Nonce> nonce = MakeNonce();
  if (!id.ok() || !nonce.ok()) {
    PD_LOG_DEBUG("prefill peer {} not reachable: {}", peer.spec.name,
                 (!id.ok() ? id.status() : nonce.status()).ToString());
    ++peer.failed_attempts;
    peer.retry_at = Clock::now() + ReconnectBackoff(peer);
    RedispatchQueued();  // a request that waited for its first attempt decides now
    return;
  }
  peer.id = *id;
  if (address->instance != peer.instance) peer.refusal = Status::Ok();  // a new process
  peer.instance = address->instance;
  peer.own_nonce = *nonce;
  peer.state = Peer::State::kHelloSent;
  peer.state_since = peer.last_heard = Clock::now();
  SendTo(peer,
         Hello{.incarnation = incarnation_, .nonce = *nonce, .reply_address = reply_address_});
}

void DecodeMessenger::HandleHelloAck(Peer& peer, const HelloAck& ack) {
  if (ack.hello_nonce != peer.own_nonce) {
    // The answer to a Hello this node gave up on (timed out, then sent another): P answers
    // the newer one too. Judging this one against the newer nonce would fail its proof and
    // shut a healthy, merely slow peer out until it restarts.
    PD_LOG_INFO("prefill peer {}: late answer to an earlier hello ignored", peer.spec.name);
    return;
  }
  Status s = VerifyClusterProof(options_.cluster_key, peer.own_nonce, ack.nonce, incarnation_,
                                ack.incarnation, ack.proof);
  if (s.ok()) s = CheckPeerCompatible(ack.node, local_);
  Result<TransferPlan> plan = TransferPlan::Create(ack.node.kv, local_.kv);
  if (s.ok() && !plan.ok()) s = plan.status();
  if (!s.ok()) {
    // Before any memory descriptor of ours left: a peer without the secret learns nothing.
    SendTo(peer, HandshakeRefused{s.message()});
    PeerRefused(peer, s.WithContext("handshake with prefill peer " + peer.spec.name + " refused"));
    return;
  }
  Result<NodeInfo> node = RegisterFor(peer);
  if (!node.ok()) {
    PeerDead(peer, node.status().WithContext("registering the KV cache for " + peer.spec.name));
    return;
  }
  peer.incarnation = ack.incarnation;
  peer.plan = std::make_shared<const TransferPlan>(std::move(plan).value());
  peer.state = Peer::State::kFinishSent;
  peer.state_since = Clock::now();
  SendTo(peer, HelloFinish{.proof = MakeClusterProof(options_.cluster_key, peer.own_nonce,
                                                     ack.nonce, incarnation_),
                           .node = std::move(node).value()});
}

void DecodeMessenger::PeerReady(Peer& peer) {
  peer.state = Peer::State::kReady;
  peer.failed_attempts = 0;
  ++peer.epoch;
  if (peer.instance == peer.removed_instance) {
    // The same process, removed (it stalled, or the link was cut) and now answering again.
    ++counters_.peers_readmitted;
    PD_LOG_INFO("prefill peer {} taken back (incarnation {:x}, epoch {})", peer.spec.name,
                peer.incarnation, peer.epoch);
  } else {
    PD_LOG_INFO("prefill peer {} ready (incarnation {:x})", peer.spec.name, peer.incarnation);
  }
  PublishStats();
  RedispatchQueued();
}

void DecodeMessenger::RedispatchQueued() {
  std::vector<Request*> queued;
  for (auto& [id, req] : requests_) {
    if (req->state == Request::State::kQueued && !req->engine_finished && !req->failed) {
      queued.push_back(req.get());
    }
  }
  for (Request* req : queued) Dispatch(*req);
}

Result<NodeInfo> DecodeMessenger::RegisterFor(Peer& peer) {
  // Per peer instance, views of the caches and registrations (keys) of those views alone.
  // Removing the peer revokes the views and closes the keys (PeerDead): a late write of the
  // removed instance — a hung node that resumes — then fails at the key, and the rest of a
  // write whose key was checked before (tcp receives the payload afterwards, at its own pace)
  // lands in throwaway memory. Whatever was made stays in peer.views, which PeerDead retires,
  // even if a later rank fails.
  PD_RETURN_IF_ERROR(peer.views.Open(*engine_, *fabric_));
  NodeInfo node = local_;
  for (int r = 0; r < engine_->tp_size(); ++r) {
    PD_ASSIGN_OR_RETURN(fabric::MemoryDescriptor descriptor,
                        fabric_->Describe(peer.views.regions()[r]));
    node.rank_memory[r] = descriptor.Serialize();
  }
  return node;
}

void DecodeMessenger::PeerRefused(Peer& peer, const Status& why) {
  const bool connected = peer.state != Peer::State::kDisconnected;
  if (!connected && !peer.refusal.ok()) return;  // refused already: nothing new to say
  PD_LOG_ERROR("{}; not used until it restarts", why.ToString());
  peer.refusal = why;
  peer.last_error = why.ToString();
  if (connected) {
    PeerDead(peer, why);  // which also decides for the requests waiting for a peer
  } else {
    RedispatchQueued();  // those that waited for this one's handshake
  }
}

void DecodeMessenger::PeerDead(Peer& peer, const Status& why) {
  if (peer.state == Peer::State::kDisconnected) return;
  PD_LOG_WARN("prefill peer {} removed: {}", peer.spec.name, why.ToString());
  counters_.last_peer_error = why.ToString();
  peer.last_error = why.ToString();
  // After this nothing from the old incarnation counts or reaches us, and none of its writes
  // can land in the cache: its views are revoked (what still arrives of a write goes to
  // throwaway memory) and its keys closed (later writes fail). Only then may its requests'
  // pages be released.
  if (Status s = fabric_->RemovePeer(peer.id); !s.ok()) PD_LOG_WARN("{}", s.ToString());
  peer.views.Retire(*fabric_, /*revoke=*/true, &retired_views_, peer.spec.name);
  if (peer.state == Peer::State::kReady) {
    peer.removed_instance = peer.instance;
  } else {
    ++peer.failed_attempts;  // its handshake failed
  }
  peer.state = Peer::State::kDisconnected;
  peer.plan.reset();
  peer.own_tokens = 0;
  // Removal is for safety, not for ever: the peer is resolved and handshaken again after the
  // back-off, as a new epoch (Connect).
  peer.retry_at = Clock::now() + ReconnectBackoff(peer);
  std::vector<Request*> affected;
  for (auto& [id, req] : requests_) {
    if (req->peer == &peer) affected.push_back(req.get());
  }
  for (Request* req : affected) {
    if (req->state == Request::State::kInFlight || req->state == Request::State::kCancelling) {
      fabric_->RemoveExpectation(req->immediate);
      req->failed_peers.push_back(&peer);
      if (req->state == Request::State::kInFlight) {
        req->redispatch = true;
        req->lost_because = Status::Unavailable(
            fmt::format("prefill peer {} lost: {}", peer.spec.name, why.message()));
      }
      Quiesced(*req);  // the peer is removed: none of its writes can land
    }
  }
  RedispatchQueued();  // those that waited for this peer's handshake decide now
  PublishStats();
}

void DecodeMessenger::OnPagesAllocated(const std::string& id, std::vector<PageId> pages) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& req = *it->second;
  const int page_tokens = engine_->kv_layout().page_tokens;
  const size_t kv_pages =
      (req.prefix.size() + static_cast<size_t>(page_tokens) - 1) / static_cast<size_t>(page_tokens);
  pages.resize(std::min(pages.size(), kv_pages));
  req.pages = std::move(pages);
  req.deadline = Deadline::After(options_.prefill_timeout);
  if (req.prefix.empty()) {  // a one-token prompt: nothing to transfer
    req.state = Request::State::kLanded;
    engine_->Admit(id);
    return;
  }
  Dispatch(req);
}

bool DecodeMessenger::FirstAttempt(const Peer& peer) const {
  // Never ready nor failed yet: a node starting up, or a peer that just joined.
  return peer.state == Peer::State::kDisconnected && peer.epoch == 0 && peer.failed_attempts == 0 &&
         peer.refusal.ok();
}

bool DecodeMessenger::MayUse(const Request& req, const Peer& peer) const {
  // A request pinned to a peer (X-Prefill-Peer) is never moved, nor sent there twice.
  if (!req.peer_override.empty()) {
    return peer.spec.name == req.peer_override && req.failed_peers.empty();
  }
  // A request moves to another peer at most max_retries times, and never back to one that
  // failed it.
  if (req.retries >= options_.max_retries && !req.failed_peers.empty()) return false;
  return std::find(req.failed_peers.begin(), req.failed_peers.end(), &peer) ==
         req.failed_peers.end();
}

void DecodeMessenger::Dispatch(Request& req) {
  Peer* best = nullptr;
  bool pending = false;  // a peer it may use will be ready or known unusable soon
  for (auto& p : peers_) {
    if (!MayUse(req, *p)) continue;
    pending |= p->state == Peer::State::kHelloSent || p->state == Peer::State::kFinishSent ||
               FirstAttempt(*p);
    if (p->state != Peer::State::kReady) continue;
    if (best == nullptr ||
        p->own_tokens + p->reported_tokens < best->own_tokens + best->reported_tokens) {
      best = p.get();
    }
  }
  if (best == nullptr) {
    if (pending) {
      // Its answer (or its handshake timeout, or a failed first attempt) comes soon and decides
      // again (PeerReady, PeerDead, Connect); the deadline still bounds the wait.
      PD_LOG_DEBUG("request {}: a prefill peer is connecting; queued", req.id);
      req.state = Request::State::kQueued;
      return;
    }
    return NoUsablePeer(req);
  }
  if (!req.failed_peers.empty()) {
    ++req.retries;
    ++counters_.requests_retried;
  }
  if (free_slots_.empty()) {
    const uint32_t slot = static_cast<uint32_t>(slot_generation_.size());
    if (slot >= kMaxTransferSlots) {
      req.state = Request::State::kQueued;  // failed: released when the engine finishes it
      req.deadline = Deadline::Never();
      return FailRequest(req, Status::ResourceExhausted("no free transfer slot"));
    }
    slot_generation_.push_back(0);
    free_slots_.push_back(slot);
  }
  req.slot = free_slots_.back();
  free_slots_.pop_back();
  req.has_slot = true;
  const TransferTag tag{.slot = req.slot, .generation = slot_generation_[req.slot]};
  req.immediate = EncodeImmediate(tag);
  req.request_id = next_request_id_++;
  req.peer = best;
  by_request_id_[req.request_id] = req.id;
  const uint64_t seed = req.request_id;
  const uint64_t expected = best->plan->ExpectedWrites(req.pages.size(), seed);
  std::weak_ptr<ControlLoop> weak_loop = loop_;
  auto on_landed = [this, weak_loop, id = req.id, imm = req.immediate, request_id = req.request_id](
                       const Status& st, uint32_t arrived) {
    // Timed here, on the progress thread that counted the last write, not after the hop.
    const TimePoint at = Clock::now();
    if (st.ok()) events_.Record(EventKind::kKvLanded, 0, -1, request_id, arrived);
    if (auto loop = weak_loop.lock()) {
      loop->Post([this, id, imm, st, arrived, at] { OnLanded(id, imm, st, arrived, at); });
    }
  };
  // The immediate counter is 32 bits: the writes (pages x layers x routes between the ranks)
  // of a prompt past that cannot be counted.
  Status s = expected <= std::numeric_limits<uint32_t>::max()
                 ? fabric_->Expect(req.immediate, static_cast<uint32_t>(expected), req.deadline,
                                   std::move(on_landed))
                 : Status::InvalidArgument(fmt::format(
                       "{} KV writes expected: more than the immediate counter holds", expected));
  if (!s.ok()) {  // nothing was sent: nothing can land
    by_request_id_.erase(req.request_id);
    FreeSlot(req);
    req.peer = nullptr;
    req.state = Request::State::kQueued;
    req.deadline = Deadline::Never();
    return FailRequest(req, s.WithContext("registering the expected KV writes"));
  }
  req.state = Request::State::kInFlight;
  PD_LOG_DEBUG("request {}: {} tokens to {} as transfer {} (slot {}, {} writes expected)", req.id,
               req.prefix.size(), best->spec.name, req.request_id, req.slot, expected);
  best->own_tokens += static_cast<int64_t>(req.prefix.size());
  const auto remaining =
      std::chrono::duration_cast<std::chrono::milliseconds>(req.deadline.Remaining()).count();
  SendTo(*best,
         PrefillRequest{.request_id = req.request_id,
                        .token_ids = req.prefix,
                        .destination_pages = req.pages,
                        .transfer_slot = tag.slot,
                        .generation = tag.generation,
                        .deadline_ms = static_cast<uint32_t>(std::max<int64_t>(1, remaining)),
                        .replica_seed = seed,
                        .context_buffer = std::nullopt});
  req.prefill_sent = Clock::now();
  events_.Record(EventKind::kPrefillSent, 0, -1, req.request_id,
                 static_cast<int64_t>(req.prefix.size()));
  PublishStats();
}

void DecodeMessenger::NoUsablePeer(Request& req) {
  // No request waits for a failure already certain: prefill here, or fail now.
  if (req.peer_override.empty() && options_.local_prefill_fallback) {
    PD_LOG_INFO("request {}: no usable prefill peer; prefilled here ({} tokens)", req.id,
                req.prefix.size() + 1);
    req.state = Request::State::kLocal;
    req.deadline = Deadline::Never();
    ++counters_.fallback_prefills;
    engine_->PrefillLocally(req.id);
    PublishStats();
    return;
  }
  req.state = Request::State::kQueued;  // failed: the engine's final output finishes it
  req.deadline = Deadline::Never();
  if (!req.lost_because.ok()) return FailRequest(req, req.lost_because);
  std::string reasons;
  for (const auto& p : peers_) {
    if (!req.peer_override.empty() && p->spec.name != req.peer_override) continue;
    if (!reasons.empty()) reasons += "; ";
    if (!p->refusal.ok()) {
      reasons += p->refusal.message();  // names the peer
      continue;
    }
    reasons += fmt::format("{}: {}", p->spec.name,
                           !p->last_error.empty()            ? p->last_error
                           : p->state == Peer::State::kReady ? "failed this request"
                                                             : "not connected");
  }
  FailRequest(req,
              Status::Unavailable("no usable prefill peer: " +
                                  (reasons.empty() ? std::string("none has joined") : reasons)));
}

void DecodeMessenger::OnLanded(const std::string& id, uint32_t imm, const Status& status,
                               uint32_t arrived, TimePoint at) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& req = *it->second;
  if (req.state != Request::State::kInFlight || req.immediate != imm) return;  // stale
  PD_LOG_DEBUG("request {}: KV landed: {} ({} writes)", id, status.ToString(), arrived);
  if (status.ok()) {
    counters_.writes_received += arrived;
    counters_.bytes_received +=
        static_cast<int64_t>(req.peer->plan->ExpectedBytes(req.pages.size(), req.request_id));
    counters_.transfer_latency_seconds.Observe(
        std::chrono::duration<double>(at - req.prefill_sent).count());
    // Every write P will send has landed: the slot can be reused.
    req.peer->own_tokens -= static_cast<int64_t>(req.prefix.size());
    FreeSlot(req);
    req.state = Request::State::kLanded;
    engine_->Admit(id);
    PublishStats();
    return;
  }
  ++counters_.requests_expired;
  Abandon(req,
          Status::DeadlineExceeded(fmt::format(
              "KV of the prompt from prefill peer {} did not land in time ({} writes arrived)",
              req.peer->spec.name, arrived)),
          /*retry=*/false);
}

void DecodeMessenger::OnWriteFailed(uint64_t request_id, const std::string& reason) {
  auto idx = by_request_id_.find(request_id);
  if (idx == by_request_id_.end()) return;
  auto it = requests_.find(idx->second);
  if (it == requests_.end()) return;
  Request& req = *it->second;
  if (req.state != Request::State::kInFlight || req.request_id != request_id) return;
  Abandon(req, Status::Unavailable("prefill peer " + req.peer->spec.name + ": " + reason),
          /*retry=*/true);
}

void DecodeMessenger::Abandon(Request& req, const Status& why, bool retry) {
  fabric_->RemoveExpectation(req.immediate);
  req.peer->own_tokens -= static_cast<int64_t>(req.prefix.size());
  req.failed_peers.push_back(req.peer);
  if (retry) {
    req.redispatch = true;  // once P acknowledges the cancel (Quiesced)
    req.lost_because = Status::Unavailable(why.message());
  } else {
    FailRequest(req, why);
  }
  // Pages stay held until P says none of its writes can still land.
  req.state = Request::State::kCancelling;
  req.cancel_sent = Clock::now();
  SendTo(*req.peer, Cancel{req.request_id});
  PublishStats();
}

void DecodeMessenger::OnCancelAck(uint64_t request_id) {
  auto idx = by_request_id_.find(request_id);
  if (idx == by_request_id_.end()) return;
  auto it = requests_.find(idx->second);
  if (it == requests_.end()) return;
  Request& req = *it->second;
  if (req.state == Request::State::kCancelling && req.request_id == request_id) Quiesced(req);
}

void DecodeMessenger::Quiesced(Request& req) {
  by_request_id_.erase(req.request_id);
  FreeSlot(req);
  req.peer = nullptr;
  if (req.engine_finished) {
    engine_->ReleaseHeldPages(req.id);
    requests_.erase(req.id);
    PublishStats();
    return;
  }
  if (req.redispatch) {
    req.redispatch = false;
    Dispatch(req);  // another peer, this node's engine, or a failure naming the cause
    return;
  }
  // Failed: the engine's final output (kCancelled, rewritten to the error) finishes it.
  req.state = Request::State::kQueued;
  req.deadline = Deadline::Never();
}

void DecodeMessenger::FailRequest(Request& req, const Status& why) {
  PD_LOG_WARN("request {} failed: {}", req.id, why.ToString());
  ++counters_.requests_failed;
  req.failed = true;
  {
    MutexLock lock(&failures_mu_);
    failures_[req.id] = why;
  }
  req.redispatch = false;
  engine_->Cancel(req.id);
}

void DecodeMessenger::OnEngineFinished(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& req = *it->second;
  req.engine_finished = true;
  {
    MutexLock lock(&failures_mu_);
    failures_.erase(id);
  }
  switch (req.state) {
    case Request::State::kInFlight:  // client gone (or shutdown) while the KV streams
      ++counters_.requests_cancelled;
      fabric_->RemoveExpectation(req.immediate);
      req.peer->own_tokens -= static_cast<int64_t>(req.prefix.size());
      req.state = Request::State::kCancelling;
      req.cancel_sent = Clock::now();
      SendTo(*req.peer, Cancel{req.request_id});
      return;
    case Request::State::kCancelling:
      return;  // released on CancelAck or the peer's removal
    default:
      // Nothing can land: admitted (the engine freed or frees its pages), queued or never
      // allocated. ReleaseHeldPages is a no-op when the engine holds nothing.
      engine_->ReleaseHeldPages(id);
      requests_.erase(it);
      PublishStats();
  }
}

void DecodeMessenger::FreeSlot(Request& req) {
  if (!req.has_slot) return;
  slot_generation_[req.slot] = NextGeneration(slot_generation_[req.slot]);
  free_slots_.push_back(req.slot);
  req.has_slot = false;
}

void DecodeMessenger::Tick() {
  const TimePoint now = Clock::now();
  if (last_tick_ != TimePoint{} && now - last_tick_ > options_.peer_timeout) {
    // This node itself stood still (SIGSTOP, a swap storm, a throttled VM) past the peer
    // timeout: its peers, hearing no heartbeat, have removed it. Start new epochs with all of
    // them now rather than after a heartbeat timeout of its own.
    const auto stalled = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_tick_);
    for (auto& p : peers_) {
      if (p->state != Peer::State::kDisconnected) {
        PeerDead(*p,
                 Status::Unavailable(fmt::format(
                     "this decode node stalled for {} ms; handshaking again", stalled.count())));
      }
    }
  }
  last_tick_ = now;
  for (auto& p : peers_) {
    Peer& peer = *p;
    switch (peer.state) {
      case Peer::State::kDisconnected:
        // Resolution asks the peer's HTTP API and may take seconds (a hung node accepts the
        // connection and never answers): never on this loop, whose heartbeats keep the other
        // peers alive.
        if (!peer.resolving.valid() && now >= peer.retry_at) StartResolve(peer);
        break;
      case Peer::State::kHelloSent:
      case Peer::State::kFinishSent:
        if (now - peer.state_since > options_.handshake_timeout) {
          PeerDead(peer, Status::DeadlineExceeded("no answer to the handshake"));
        }
        break;
      case Peer::State::kReady:
        if (now - peer.last_heard > options_.peer_timeout) {
          PeerDead(peer, Status::DeadlineExceeded(fmt::format("no heartbeat answer for {} ms",
                                                              options_.peer_timeout.count())));
        } else {
          SendTo(peer, Heartbeat{++peer.heartbeat});
        }
        break;
    }
  }
  std::vector<Request*> late_queued;
  std::vector<Request*> late_cancel;
  for (auto& [id, req] : requests_) {
    if (req->state == Request::State::kQueued && !req->engine_finished && req->deadline.Passed()) {
      late_queued.push_back(req.get());
    }
    // A peer that answers heartbeats is alive: it acknowledges a cancel at the end of its
    // current step, which on a loaded prefill node may take seconds (a 512-token chunk on one
    // core). Only a peer silent past peer_timeout (above) or one that never acknowledges within
    // a whole prefill deadline is removed: removing a live peer for a slow ack would take it
    // out of service until it restarts.
    if (req->state == Request::State::kCancelling && req->peer != nullptr &&
        now - req->cancel_sent > std::max(options_.peer_timeout, options_.prefill_timeout)) {
      late_cancel.push_back(req.get());
    }
  }
  for (Request* req : late_queued) {
    ++counters_.requests_expired;
    const std::string& cause = counters_.last_peer_error;
    FailRequest(*req, Status::Unavailable(
                          cause.empty() ? std::string("no prefill peer became available in time")
                                        : "no prefill peer became available in time (last peer "
                                          "error: " +
                                              cause + ")"));
    req->deadline = Deadline::Never();
  }
  for (Request* req : late_cancel) {
    // No acknowledgement: treat the peer as hung and remove it (which releases the pages).
    if (req->peer != nullptr && req->state == Request::State::kCancelling) {
      PeerDead(*req->peer, Status::DeadlineExceeded("no answer to a cancel"));
    }
  }
}

void DecodeMessenger::SendTo(Peer& peer, const Message& message) {
  SendControlMessage(*fabric_, peer.id, message, options_.peer_timeout);
}

void DecodeMessenger::PublishStats() {
  DecodeMessengerStats s = counters_;
  for (const auto& p : peers_) s.peers_ready += p->state == Peer::State::kReady;
  s.requests_in_flight = static_cast<int>(requests_.size());
  for (const auto& [id, req] : requests_) {
    s.requests_waiting_kv += !req->engine_finished && (req->state == Request::State::kQueued ||
                                                       req->state == Request::State::kInFlight);
  }
  s.slots_in_use = static_cast<int>(slot_generation_.size() - free_slots_.size());
  for (const auto& p : peers_) {
    s.peers.push_back({.name = p->spec.name,
                       .state = p->state == Peer::State::kReady          ? "ready"
                                : p->state == Peer::State::kDisconnected ? "disconnected"
                                                                         : "handshaking",
                       .last_error = p->last_error,
                       .epoch = p->epoch,
                       .refused = !p->refusal.ok()});
  }
  {
    MutexLock lock(&stats_mu_);
    stats_ = s;
  }
  stats_cv_.NotifyAll();
}

DecodeMessengerStats DecodeMessenger::stats() const {
  MutexLock lock(&stats_mu_);
  return stats_;
}

std::string DecodeMessenger::Degraded() const {
  const DecodeMessengerStats s = stats();
  if (s.peers_ready > 0) return "";
  if (s.peers.empty()) return "no prefill peer has joined";
  std::string out = "no usable prefill peer (";
  for (size_t i = 0; i < s.peers.size(); ++i) {
    const PrefillPeerStatus& p = s.peers[i];
    out += fmt::format("{}{}: {}{}", i == 0 ? "" : "; ", p.name, p.refused ? "refused" : p.state,
                       p.last_error.empty() ? "" : ", " + p.last_error);
  }
  return out + ")";
}

bool DecodeMessenger::WaitForPeers(int n, Deadline deadline) const {
  MutexLock lock(&stats_mu_);
  while (stats_.peers_ready < n) {
    if (stats_cv_.WaitUntil(&stats_mu_, deadline.at()) == std::cv_status::timeout) break;
  }
  return stats_.peers_ready >= n;
}

}  // namespace pdserve::messenger
