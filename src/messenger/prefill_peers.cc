#include "messenger/prefill_peers.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/logging.h"
#include "messenger/cluster_proof.h"

namespace pdserve::messenger {

PrefillPeers::PrefillPeers(MessengerCore* core, Engine* engine, PrefillPeerHooks hooks)
    : core_(core),
      engine_(engine),
      hooks_(std::move(hooks)),
      reply_address_(core->fabric().address().Serialize()) {}

PrefillPeers::~PrefillPeers() = default;  // each peer's `resolving` waits for its thread

bool PrefillPeers::Add(PrefillPeerSpec spec) {
  {
    MutexLock lock(&names_mu_);
    if (!names_.insert(spec.name).second) return false;
  }
  core_->Post([this, spec = std::move(spec)]() mutable {
    for (auto& p : peers_) {
      if (p->retired && p->spec.name == spec.name) {
        // It left and joins again (perhaps a new process at the same address): resolved anew.
        p->retired = false;
        p->spec = std::move(spec);
        p->failed_attempts = 0;
        p->retry_at = TimePoint{};
        Tick();
        return;
      }
    }
    peers_.push_back(std::make_unique<PrefillPeer>());
    peers_.back()->spec = std::move(spec);
    Tick();  // connect at once
  });
  return true;
}

bool PrefillPeers::Retire(const std::string& name) {
  {
    MutexLock lock(&names_mu_);
    if (names_.erase(name) == 0) return false;
  }
  core_->Post([this, name] {
    for (auto& p : peers_) {
      if (p->retired || p->spec.name != name) continue;
      p->retired = true;
      p->last_error = "left the membership";
      if (p->ready()) {
        // Chosen no more; what it prefills now still lands (a node stopped with SIGTERM leaves
        // first, then drains). Its heartbeats go on: when they stop it is removed as any peer,
        // and not resolved again.
        PD_LOG_INFO("prefill peer {} left the membership: no new requests", name);
      } else if (p->handshaking()) {
        Remove(*p, Status::Unavailable("prefill peer " + name + " left the membership"));
      }
      hooks_.changed();  // requests queued for it decide now
    }
  });
  return true;
}

bool PrefillPeers::Knows(const std::string& name) const {
  MutexLock lock(&names_mu_);
  return names_.count(name) != 0;
}

PrefillPeer* PrefillPeers::Find(fabric::PeerId id) {
  if (id == fabric::kUnknownPeer) return nullptr;
  for (auto& p : peers_) {
    if (p->id == id && p->state != PrefillPeer::State::kDisconnected) return p.get();
  }
  return nullptr;
}

void PrefillPeers::Handle(PrefillPeer& peer, const Message& message) {
  peer.last_heard = Clock::now();
  if (const auto* ack = std::get_if<HelloAck>(&message)) {
    if (peer.state == PrefillPeer::State::kHelloSent) HandleHelloAck(peer, *ack);
  } else if (const auto* refused = std::get_if<HandshakeRefused>(&message)) {
    Refused(peer, Status::FailedPrecondition("prefill peer " + peer.spec.name +
                                             " refused the handshake: " + refused->reason));
  } else if (const auto* report = std::get_if<LoadReport>(&message)) {
    peer.reported_tokens = static_cast<int64_t>(report->outstanding_prefill_tokens);
    peer.reported_rate = static_cast<double>(report->prefill_rate_milli) / 1000.0;
    peer.sent_since_report = 0;
    // P's first LoadReport confirms the handshake (it sends none before accepting HelloFinish).
    if (peer.state == PrefillPeer::State::kFinishSent) Ready(peer);
  }
}

std::chrono::milliseconds PrefillPeers::ReconnectBackoff(const PrefillPeer& peer) const {
  // One heartbeat interval, doubled per failed attempt up to kMaxReconnectBackoff (or the
  // interval, if longer): a peer that answers again is found within about a second, and one
  // that stays down costs an HTTP attempt a second.
  const auto first = core_->options().heartbeat_interval;
  const auto cap = std::max(first, kMaxReconnectBackoff);
  auto backoff = first;
  for (int i = 0; i < peer.failed_attempts && backoff < cap; ++i) backoff *= 2;
  return std::min(backoff, cap);
}

void PrefillPeers::StartResolve(PrefillPeer& peer) {
  // Resolution asks the peer's HTTP API and may take seconds (a hung node accepts the
  // connection and never answers): never on the loop, whose heartbeats keep the other peers
  // alive.
  std::weak_ptr<ControlLoop> weak_loop = core_->weak_loop();
  PrefillPeer* p = &peer;  // peers_ never shrinks: the pointer lives as long as this table
  peer.resolving =
      std::async(std::launch::async, [this, p, weak_loop, resolve = peer.spec.resolve] {
        Result<fabric::TransferEngineAddress> address = resolve();
        if (auto loop = weak_loop.lock()) {
          loop->Post([this, p, address = std::move(address)]() mutable {
            p->resolving = {};  // its thread has nothing left to do but return
            if (p->state == PrefillPeer::State::kDisconnected && !p->retired) {
              Connect(*p, std::move(address));
            }
          });
        }
      });
}

void PrefillPeers::Connect(PrefillPeer& peer, Result<fabric::TransferEngineAddress> address) {
  Status s = address.status();
  if (s.code() == StatusCode::kPermissionDenied) {
    Refused(peer, s);  // told before any handshake: it does not share the cluster secret
    peer.retry_at = Clock::now() + core_->options().handshake_timeout / 3;
    return;
  }
  // A removed instance is added again as a new fabric peer: its old id, views and keys stay
  // revoked, and the slots its transfers used moved on to new generations (SlotTable), so
  // nothing of the old epoch can count in the new one.
  Result<fabric::PeerId> id =
      s.ok() ? core_->fabric().AddPeer(*address) : Result<fabric::PeerId>(s);
  Result<Nonce> nonce = MakeNonce();
  if (!id.ok() || !nonce.ok()) {
    PD_LOG_DEBUG("prefill peer {} not reachable: {}", peer.spec.name,
                 (!id.ok() ? id.status() : nonce.status()).ToString());
    ++peer.failed_attempts;
    peer.retry_at = Clock::now() + ReconnectBackoff(peer);
    hooks_.changed();  // a request that waited for its first attempt decides now
    return;
  }
  peer.id = *id;
  if (address->instance != peer.instance) peer.refusal = Status::Ok();  // a new process
  peer.instance = address->instance;
  peer.own_nonce = *nonce;
  peer.state = PrefillPeer::State::kHelloSent;
  peer.state_since = peer.last_heard = Clock::now();
  Send(
      peer,
      Hello{.incarnation = core_->incarnation(), .nonce = *nonce, .reply_address = reply_address_});
}

void PrefillPeers::HandleHelloAck(PrefillPeer& peer, const HelloAck& ack) {
  if (ack.hello_nonce != peer.own_nonce) {
    // The answer to a Hello this node gave up on (timed out, then sent another): P answers
    // the newer one too. Judging this one against the newer nonce would fail its proof and
    // shut a healthy, merely slow peer out until it restarts.
    PD_LOG_INFO("prefill peer {}: late answer to an earlier hello ignored", peer.spec.name);
    return;
  }
  const MessengerOptions& options = core_->options();
  Status s = VerifyClusterProof(options.cluster_key, peer.own_nonce, ack.nonce,
                                core_->incarnation(), ack.incarnation, ack.proof);
  if (s.ok()) s = CheckPeerCompatible(ack.node, core_->local());
  Result<TransferPlan> plan = TransferPlan::Create(ack.node.kv, core_->local().kv);
  if (s.ok() && !plan.ok()) s = plan.status();
  if (!s.ok()) {
    // Before any memory descriptor of ours left: a peer without the secret learns nothing.
    Send(peer, HandshakeRefused{s.message()});
    Refused(peer, s.WithContext("handshake with prefill peer " + peer.spec.name + " refused"));
    return;
  }
  Result<NodeInfo> node = RegisterFor(peer);
  if (!node.ok()) {
    Remove(peer, node.status().WithContext("registering the KV cache for " + peer.spec.name));
    return;
  }
  peer.incarnation = ack.incarnation;
  peer.plan = std::make_shared<const TransferPlan>(std::move(plan).value());
  peer.state = PrefillPeer::State::kFinishSent;
  peer.state_since = Clock::now();
  Send(peer, HelloFinish{.proof = MakeClusterProof(options.cluster_key, peer.own_nonce, ack.nonce,
                                                   core_->incarnation()),
                         .node = std::move(node).value()});
}

Result<NodeInfo> PrefillPeers::RegisterFor(PrefillPeer& peer) {
  // Per peer instance, views of the caches and registrations (keys) of those views alone.
  // Removing the peer revokes the views and closes the keys (Remove): a late write of the
  // removed instance — a hung node that resumes — then fails at the key, and the rest of a
  // write whose key was checked before (tcp receives the payload afterwards, at its own pace)
  // lands in throwaway memory. Whatever was made stays in peer.views, which Remove retires,
  // even if a later rank fails.
  PD_RETURN_IF_ERROR(peer.views.Open(*engine_, core_->fabric()));
  NodeInfo node = core_->local();
  for (int r = 0; r < engine_->tp_size(); ++r) {
    PD_ASSIGN_OR_RETURN(fabric::MemoryDescriptor descriptor,
                        core_->fabric().Describe(peer.views.regions()[r]));
    node.rank_memory[r] = descriptor.Serialize();
  }
  return node;
}

void PrefillPeers::Ready(PrefillPeer& peer) {
  peer.state = PrefillPeer::State::kReady;
  peer.failed_attempts = 0;
  ++peer.epoch;
  if (peer.instance == peer.removed_instance) {
    // The same process, removed (it stalled, or the link was cut) and now answering again.
    ++readmissions_;
    PD_LOG_INFO("prefill peer {} taken back (incarnation {:x}, epoch {})", peer.spec.name,
                peer.incarnation, peer.epoch);
  } else {
    PD_LOG_INFO("prefill peer {} ready (incarnation {:x})", peer.spec.name, peer.incarnation);
  }
  hooks_.ready(peer);
}

void PrefillPeers::Refused(PrefillPeer& peer, const Status& why) {
  const bool connected = peer.state != PrefillPeer::State::kDisconnected;
  if (!connected && !peer.refusal.ok()) return;  // refused already: nothing new to say
  PD_LOG_ERROR("{}; not used until it restarts", why.ToString());
  peer.refusal = why;
  peer.last_error = why.ToString();
  if (connected) {
    Remove(peer, why);
  } else {
    hooks_.changed();  // requests that waited for this one's first attempt
  }
}

void PrefillPeers::Remove(PrefillPeer& peer, const Status& why) {
  if (peer.state == PrefillPeer::State::kDisconnected) return;
  PD_LOG_WARN("prefill peer {} removed: {}", peer.spec.name, why.ToString());
  peer.last_error = why.ToString();
  // After this nothing from the old incarnation counts or reaches us, and none of its writes
  // can land in the cache: its views are revoked (what still arrives of a write goes to
  // throwaway memory) and its keys closed (later writes fail). Only then may its requests'
  // pages be released (hooks_.removed).
  if (Status s = core_->fabric().RemovePeer(peer.id); !s.ok()) PD_LOG_WARN("{}", s.ToString());
  core_->RetireViews(peer.views, /*revoke=*/true, peer.spec.name);
  if (peer.state == PrefillPeer::State::kReady) {
    peer.removed_instance = peer.instance;
  } else {
    ++peer.failed_attempts;  // its handshake failed
  }
  peer.state = PrefillPeer::State::kDisconnected;
  peer.plan.reset();
  // Removal is for safety, not for ever: the peer is resolved and handshaken again after the
  // back-off, as a new epoch (Connect).
  peer.retry_at = Clock::now() + ReconnectBackoff(peer);
  hooks_.removed(peer, why);
}

void PrefillPeers::Tick() {
  const MessengerOptions& options = core_->options();
  const TimePoint now = Clock::now();
  if (last_tick_ != TimePoint{} && now - last_tick_ > options.peer_timeout) {
    // This node itself stood still (SIGSTOP, a swap storm, a throttled VM) past the peer
    // timeout: its peers, hearing no heartbeat, have removed it. Start new epochs with all of
    // them now rather than after a heartbeat timeout of its own.
    const auto stalled = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_tick_);
    for (auto& p : peers_) {
      Remove(*p, Status::Unavailable(fmt::format(
                     "this decode node stalled for {} ms; handshaking again", stalled.count())));
    }
  }
  last_tick_ = now;
  for (auto& p : peers_) {
    PrefillPeer& peer = *p;
    switch (peer.state) {
      case PrefillPeer::State::kDisconnected:
        if (!peer.retired && !peer.resolving.valid() && now >= peer.retry_at) StartResolve(peer);
        break;
      case PrefillPeer::State::kHelloSent:
      case PrefillPeer::State::kFinishSent:
        if (now - peer.state_since > options.handshake_timeout) {
          Remove(peer, Status::DeadlineExceeded("no answer to the handshake"));
        }
        break;
      case PrefillPeer::State::kReady:
        if (now - peer.last_heard > options.peer_timeout) {
          Remove(peer, Status::DeadlineExceeded(fmt::format("no heartbeat answer for {} ms",
                                                            options.peer_timeout.count())));
        } else {
          Send(peer, Heartbeat{++peer.heartbeat});
        }
        break;
    }
  }
}

std::vector<PrefillPeerStatus> PrefillPeers::Statuses() const {
  std::vector<PrefillPeerStatus> out;
  for (const auto& p : peers_) {
    out.push_back({.name = p->spec.name,
                   .state = p->retired                                      ? "left"
                            : p->ready()                                    ? "ready"
                            : p->state == PrefillPeer::State::kDisconnected ? "disconnected"
                                                                            : "handshaking",
                   .last_error = p->last_error,
                   .epoch = p->epoch,
                   .refused = !p->refusal.ok(),
                   .queued_tokens = p->queued_tokens(),
                   .prefill_tokens_per_second = p->reported_rate});
  }
  return out;
}

}  // namespace pdserve::messenger
