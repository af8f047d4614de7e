#include "messenger/decode_messenger.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "common/logging.h"
#include "common/retry_after.h"
#include "messenger/immediate.h"

namespace pdserve::messenger {

struct DecodeMessenger::Request {
  // kLocal: no prefill peer was usable and this node's engine prefills the prompt itself.
  enum class State : uint8_t { kAwaitingPages, kQueued, kInFlight, kLanded, kCancelling, kLocal };
  std::string id;  // engine id
  std::string peer_override;
  std::vector<int32_t> prefix;  // tokens [0, n-1)
  // Chained hashes of the prefix's full pages, for the choice of peer by prefix (filled at the
  // first dispatch).
  std::vector<uint64_t> page_chain;
  std::vector<PageId> pages;  // pages holding the prefix
  // With the MTP KV layer, the page whose context slot receives the hidden state of position
  // n-2 (docs/messenger.md, "The context buffer"): the last, holding n-2 itself — always a
  // destination page of the request's own, never one shared from the prefix cache, which
  // stops short of it (PrefixCache::Acquire). Precondition: pages is not empty.
  PageId context_page() const { return pages.back(); }
  // The first cached_pages of `pages` came from this node's prefix cache: only the rest is
  // asked of a prefill node (PrefillRequest::cached_pages).
  int cached_pages = 0;
  State state = State::kAwaitingPages;
  PrefillPeer* peer = nullptr;
  uint64_t transfer_id = 0;  // of the current transfer
  uint32_t slot = 0;
  uint32_t immediate = 0;
  bool has_slot = false;
  bool engine_finished = false;
  // Its peer failed it (lost, or a write failed): once no write can land, it goes to another
  // peer, is prefilled here, or fails with `lost_because`.
  bool redispatch = false;
  bool failed = false;  // FailRequest ran: the engine's final output finishes it
  int retries = 0;
  // Prompt tokens admission counted for a peer until it is sent (DecodeMessenger::unsent_tokens_).
  int64_t unsent_tokens = 0;
  std::vector<PrefillPeer*> failed_peers;
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
  std::unique_ptr<DecodeMessenger> m(new DecodeMessenger(engine, std::move(options)));
  PD_RETURN_IF_ERROR(m->Init(std::move(peers)));
  return m;
}

DecodeMessenger::DecodeMessenger(Engine* engine, MessengerOptions options)
    : engine_(engine), options_(std::move(options)) {}

Status DecodeMessenger::Init(std::vector<PrefillPeerSpec> peers) {
  MessengerHandlers handlers;
  handlers.on_message = [this](fabric::PeerId from, uint64_t, Message m) {
    Handle(from, std::move(m));
  };
  handlers.on_peer_error = [this](fabric::PeerId id, const Status& error) {
    if (PrefillPeer* p = peers_->Find(id)) peers_->Remove(*p, error);
  };
  handlers.on_tick = [this] { Tick(); };
  // The caches are registered once per prefill peer (PrefillPeers::RegisterFor), not here.
  PD_ASSIGN_OR_RETURN(core_, MessengerCore::Create(engine_, options_, std::move(handlers)));
  peers_ = std::make_unique<PrefillPeers>(
      core_.get(), engine_,
      PrefillPeerHooks{
          .ready = [this](PrefillPeer& p) { OnPeerReady(p); },
          .removed = [this](PrefillPeer& p, const Status& why) { OnPeerRemoved(p, why); },
          .changed = [this] { RedispatchQueued(); }});
  for (PrefillPeerSpec& spec : peers) peers_->Add(std::move(spec));  // named twice: one peer
  core_->Start();
  return Status::Ok();
}

Status DecodeMessenger::AddPeer(PrefillPeerSpec spec) {
  if (spec.name.empty() || !spec.resolve) {
    return Status::InvalidArgument("a prefill peer needs a name and a way to resolve it");
  }
  const std::string name = spec.name;
  if (peers_->Add(std::move(spec))) PD_LOG_INFO("prefill peer {} joined", name);
  return Status::Ok();
}

Status DecodeMessenger::RemovePeer(const std::string& name) {
  if (!peers_->Retire(name)) return Status::NotFound("unknown prefill peer '" + name + "'");
  PD_LOG_INFO("prefill peer {} left", name);
  return Status::Ok();
}

DecodeMessenger::~DecodeMessenger() {
  // The loop first (nothing more runs), then the transfer engine, and only then the peers'
  // live views (a provider may use their registrations until the engine is closed).
  if (core_) core_->Shutdown();
  peers_.reset();
}

Status DecodeMessenger::Submit(EngineRequest request, const std::string& prefill_peer) {
  if (!prefill_peer.empty() && !peers_->Knows(prefill_peer)) {
    return Status::InvalidArgument("unknown prefill peer '" + prefill_peer + "'");
  }
  if (request.prompt.empty()) return Status::InvalidArgument("empty prompt");
  if (prefill_peer.empty() && request.prompt.size() <= static_cast<size_t>(std::max(
                                                           0, options_.local_prefill_max_tokens))) {
    request.kind = RequestKind::kGenerate;
    Status s = engine_->Submit(std::move(request));
    if (s.ok()) {
      core_->Post([this] {
        ++counters_.local_prefills;
        PublishStats();
      });
    }
    return s;
  }
  int64_t unsent = 0;
  bool submitted = false;
  if (Status s = Admit(request, prefill_peer, &unsent, &submitted); !s.ok() || submitted) return s;
  auto req = std::make_shared<Request>();
  req->id = request.id;
  req->peer_override = prefill_peer;
  req->unsent_tokens = unsent;
  req->prefix.assign(request.prompt.begin(), request.prompt.end() - 1);
  request.kind = RequestKind::kRemotePrefill;
  std::weak_ptr<ControlLoop> weak_loop = core_->weak_loop();
  request.on_pages_allocated = [this, weak_loop, id = request.id](const std::vector<PageId>& p,
                                                                  int cached) {
    if (auto loop = weak_loop.lock()) {
      loop->Post([this, id, p, cached] { OnPagesAllocated(id, p, cached); });
    }
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
  core_->Post([this, req] {
    const std::string key = req->id;  // *req is moved from below
    requests_[key] = std::make_unique<Request>(std::move(*req));
    ++counters_.requests_total;
    PublishStats();
  });
  const std::string id = request.id;
  Status s = engine_->Submit(std::move(request));
  if (!s.ok()) {
    core_->Post([this, id] {
      auto it = requests_.find(id);
      if (it == requests_.end()) return;
      ReleaseUnsent(*it->second);
      requests_.erase(it);
    });
  }
  return s;
}

Status DecodeMessenger::Admit(EngineRequest& request, const std::string& prefill_peer,
                              int64_t* unsent, bool* submitted) {
  if (options_.admission == AdmissionPolicy::kOff) return Status::Ok();
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  AdmissionInput in{.policy = options_.admission,
                    .prompt_tokens = prompt - 1,  // what P prefills: all but the last token
                    .deadline_s = std::chrono::duration<double>(options_.prefill_timeout).count(),
                    .peers = {},
                    .unsent_tokens = 0,
                    .may_prefill_here = prefill_peer.empty(),
                    .local_tokens = 0,
                    .local_max_tokens = options_.admission_local_max_tokens,
                    .pages_free = true};
  if (in.policy == AdmissionPolicy::kLocal && in.may_prefill_here) {
    // Room in pages: the prompt's, and one more for its first tokens.
    const EngineStats es = engine_->stats();
    const int64_t page_tokens = std::max(1, engine_->kv_layout().page_tokens);
    in.pages_free = es.pages_total - es.pages_used >= (prompt + page_tokens - 1) / page_tokens + 1;
  }
  AdmissionDecision decision;
  {
    MutexLock lock(&admission_mu_);
    for (const AdmissionPeer& p : admission_peers_) {
      if (!p.ready || (!prefill_peer.empty() && p.name != prefill_peer)) continue;
      in.peers.push_back({.name = p.name,
                          .queued_tokens = p.queued_tokens,
                          .tokens_per_second = p.tokens_per_second});
    }
    in.unsent_tokens = unsent_tokens_;
    in.local_tokens = admission_local_tokens_;
    decision = DecideAdmission(in);
    switch (decision.action) {
      case AdmissionDecision::Action::kRemote:
        unsent_tokens_ += in.prompt_tokens;
        *unsent = in.prompt_tokens;
        return Status::Ok();
      case AdmissionDecision::Action::kLocal:
        admission_local_tokens_ += in.prompt_tokens;
        break;
      case AdmissionDecision::Action::kRefuse:
        break;
    }
  }
  if (decision.action == AdmissionDecision::Action::kRefuse) {
    PD_LOG_INFO("request {} refused: {} (retry after {} s)", request.id, decision.reason,
                decision.retry_after_s);
    core_->Post([this] {
      ++counters_.admission_refusals;
      PublishStats();
    });
    return WithRetryAfter(Status::Unavailable("admission: " + decision.reason),
                          decision.retry_after_s);
  }
  // Prefilled here: its prompt tokens count against this node's room until its prefill ends
  // (its first output, or its end, whichever comes first).
  PD_LOG_INFO("request {}: {}", request.id, decision.reason);
  *submitted = true;
  auto released = std::make_shared<std::atomic<bool>>(false);
  auto release = [this, tokens = in.prompt_tokens, released] {
    if (released->exchange(true)) return;
    MutexLock lock(&admission_mu_);
    admission_local_tokens_ -= tokens;
  };
  request.kind = RequestKind::kGenerate;
  request.on_output = [release, user = std::move(request.on_output)](const RequestOutput& out) {
    release();
    user(out);
  };
  Status s = engine_->Submit(std::move(request));
  if (!s.ok()) {
    release();
    return s;
  }
  core_->Post([this] {
    ++counters_.admission_prefills;
    PublishStats();
  });
  return Status::Ok();
}

void DecodeMessenger::ReleaseUnsent(Request& req) {
  if (req.unsent_tokens == 0) return;
  MutexLock lock(&admission_mu_);
  unsent_tokens_ -= req.unsent_tokens;
  req.unsent_tokens = 0;
}

void DecodeMessenger::PublishLoads() {
  std::vector<AdmissionPeer> loads;
  for (const auto& p : peers_->all()) {
    loads.push_back({.name = p->spec.name,
                     .ready = p->ready(),
                     .queued_tokens = p->queued_tokens(),
                     .tokens_per_second = p->reported_rate});
  }
  MutexLock lock(&admission_mu_);
  admission_peers_ = std::move(loads);
}

void DecodeMessenger::Handle(fabric::PeerId from, Message message) {
  PrefillPeer* peer = peers_->Find(from);
  if (peer == nullptr) return;     // not (or no longer) a peer: nothing it says counts
  peers_->Handle(*peer, message);  // the handshake and heartbeat answers
  // Admission and /internal/messenger/peers read the new load at once.
  if (std::holds_alternative<LoadReport>(message)) PublishStats();
  if (const auto* failed = std::get_if<WriteFailed>(&message)) {
    OnWriteFailed(failed->transfer_id, failed->reason);
  } else if (const auto* ack = std::get_if<CancelAck>(&message)) {
    OnCancelAck(ack->transfer_id);
  }
}

void DecodeMessenger::OnPeerReady(PrefillPeer&) {
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

void DecodeMessenger::OnPeerRemoved(PrefillPeer& peer, const Status& why) {
  counters_.last_peer_error = why.ToString();
  peer_prefixes_.Forget(peer.spec.name);  // it may come back as a new process, cache empty
  peer.own_tokens = 0;
  std::vector<Request*> affected;
  for (auto& [id, req] : requests_) {
    if (req->peer == &peer) affected.push_back(req.get());
  }
  for (Request* req : affected) {
    if (req->state == Request::State::kInFlight || req->state == Request::State::kCancelling) {
      core_->fabric().RemoveExpectation(req->immediate);
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

void DecodeMessenger::OnPagesAllocated(const std::string& id, std::vector<PageId> pages,
                                       int cached_pages) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& req = *it->second;
  const int page_tokens = engine_->kv_layout().page_tokens;
  const size_t kv_pages =
      (req.prefix.size() + static_cast<size_t>(page_tokens) - 1) / static_cast<size_t>(page_tokens);
  pages.resize(std::min(pages.size(), kv_pages));
  req.pages = std::move(pages);
  req.cached_pages = std::min(cached_pages, static_cast<int>(req.pages.size()));
  req.deadline = Deadline::After(options_.prefill_timeout);
  if (req.cached_pages > 0) {
    // What P would have written into those pages, over every rank of this node.
    int64_t page_bytes = 0;
    for (int r = 0; r < engine_->tp_size(); ++r) {
      const KvLayout& layout = engine_->kv_cache(r).layout();
      page_bytes += static_cast<int64_t>(layout.block_bytes() * layout.num_layers);
    }
    counters_.bytes_not_transferred += page_bytes * req.cached_pages;
    counters_.pages_not_transferred += req.cached_pages;
  }
  if (static_cast<size_t>(req.cached_pages) == req.pages.size()) {
    // A one-token prompt, or every page of [0, n-1) cached here: nothing to transfer.
    ReleaseUnsent(req);
    req.state = Request::State::kLanded;
    engine_->Admit(id);
    PublishStats();
    return;
  }
  Dispatch(req);
}

bool DecodeMessenger::MayUse(const Request& req, const PrefillPeer& peer) const {
  if (peer.retired) return false;  // it left the membership
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
  ReleaseUnsent(req);  // from here on counted where it goes (its peer's queue), or nowhere
  const int page_tokens = engine_->kv_layout().page_tokens;
  if (req.page_chain.empty()) {
    req.page_chain =
        ChainBlockHashes(std::string_view(reinterpret_cast<const char*>(req.prefix.data()),
                                          req.prefix.size() * sizeof(int32_t)),
                         static_cast<size_t>(page_tokens) * sizeof(int32_t));
  }
  // The peer whose queue would finish this prompt's prefill first, in tokens: what it has
  // outstanding (its last report and this node's own in flight there) plus the part of the
  // prompt it is not thought to hold cached (peer_prefixes_). Ties: the first peer.
  PrefillPeer* best = nullptr;
  int64_t best_cost = 0;
  bool pending = false;  // a peer it may use will be ready or known unusable soon
  for (auto& p : peers_->all()) {
    if (!MayUse(req, *p)) continue;
    pending |= p->handshaking() || p->first_attempt();
    if (!p->ready()) continue;
    const int64_t cached =
        static_cast<int64_t>(peer_prefixes_.Match(p->spec.name, req.page_chain)) * page_tokens;
    const int64_t cost =
        p->own_tokens + p->reported_tokens + static_cast<int64_t>(req.prefix.size()) - cached;
    if (best == nullptr || cost < best_cost) {
      best = p.get();
      best_cost = cost;
    }
  }
  if (best == nullptr) {
    if (pending) {
      // Its answer (or its handshake timeout, or a failed first attempt) comes soon and decides
      // again (OnPeerReady, OnPeerRemoved, PrefillPeerHooks::changed); the deadline still bounds
      // the wait.
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
  Result<TransferTag> acquired = slots_.Acquire();
  if (!acquired.ok()) {
    req.state = Request::State::kQueued;  // failed: released when the engine finishes it
    req.deadline = Deadline::Never();
    return FailRequest(req, acquired.status());
  }
  const TransferTag tag = *acquired;
  req.slot = tag.slot;
  req.has_slot = true;
  req.immediate = EncodeImmediate(tag);
  req.transfer_id = next_transfer_id_++;
  req.peer = best;
  by_transfer_id_[req.transfer_id] = req.id;
  const uint64_t seed = req.transfer_id;
  // With the MTP KV layer, P also writes the hidden state D's first drafts start from into the
  // context slot of the request's last page (Request::context_page): one write more.
  const KvCache& cache = engine_->kv_cache(0);
  std::optional<std::string> context;
  if (cache.slot_bytes() > 0) {
    context = EncodeContextBuffer({.offset = cache.ContextSlotOffset(req.context_page()),
                                   .bytes = static_cast<uint32_t>(cache.slot_bytes())});
  }
  const size_t written_pages = req.pages.size() - static_cast<size_t>(req.cached_pages);
  const uint64_t expected =
      best->plan->ExpectedWrites(written_pages, seed) + (context.has_value() ? 1 : 0);
  std::weak_ptr<ControlLoop> weak_loop = core_->weak_loop();
  auto on_landed = [this, weak_loop, id = req.id, imm = req.immediate,
                    transfer_id = req.transfer_id](const Status& st, uint32_t arrived) {
    // Timed here, on the progress thread that counted the last write, not after the hop.
    const TimePoint at = Clock::now();
    if (st.ok()) core_->events().Record(EventKind::kKvLanded, 0, -1, transfer_id, arrived);
    if (auto loop = weak_loop.lock()) {
      loop->Post([this, id, imm, st, arrived, at] { OnLanded(id, imm, st, arrived, at); });
    }
  };
  // The immediate counter is 32 bits: the writes (pages x layers x routes between the ranks)
  // of a prompt past that cannot be counted.
  Status s = expected <= std::numeric_limits<uint32_t>::max()
                 ? core_->fabric().Expect(req.immediate, static_cast<uint32_t>(expected),
                                          req.deadline, std::move(on_landed))
                 : Status::InvalidArgument(fmt::format(
                       "{} KV writes expected: more than the immediate counter holds", expected));
  if (!s.ok()) {  // nothing was sent: nothing can land
    by_transfer_id_.erase(req.transfer_id);
    FreeSlot(req);
    req.peer = nullptr;
    req.state = Request::State::kQueued;
    req.deadline = Deadline::Never();
    return FailRequest(req, s.WithContext("registering the expected KV writes"));
  }
  req.state = Request::State::kInFlight;
  PD_LOG_DEBUG("request {}: {} tokens to {} as transfer {} (slot {}, {} writes expected)", req.id,
               req.prefix.size(), best->spec.name, req.transfer_id, req.slot, expected);
  // P will hold the prompt's pages (until its cache evicts them: bounded by its page count).
  peer_prefixes_.Record(best->spec.name, req.page_chain,
                        static_cast<size_t>(best->plan->source().ranks[0].num_pages));
  best->own_tokens += static_cast<int64_t>(req.prefix.size());
  best->sent_since_report += static_cast<int64_t>(req.prefix.size());
  const auto remaining =
      std::chrono::duration_cast<std::chrono::milliseconds>(req.deadline.Remaining()).count();
  // Stamped before it leaves: P may start on it before Send returns (seen on a loaded host),
  // and "sent" must not come after P's first step.
  req.prefill_sent = Clock::now();
  core_->events().Record(EventKind::kPrefillSent, 0, -1, req.transfer_id,
                         static_cast<int64_t>(req.prefix.size()));
  peers_->Send(*best,
               PrefillRequest{.transfer_id = req.transfer_id,
                              .token_ids = req.prefix,
                              .cached_pages = static_cast<uint32_t>(req.cached_pages),
                              .destination_pages = std::vector<PageId>(
                                  req.pages.begin() + req.cached_pages, req.pages.end()),
                              .transfer_slot = tag.slot,
                              .generation = tag.generation,
                              .deadline_ms = static_cast<uint32_t>(std::max<int64_t>(1, remaining)),
                              .replica_seed = seed,
                              .context_buffer = std::move(context)});
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
  for (const auto& p : peers_->all()) {
    if (!req.peer_override.empty() && p->spec.name != req.peer_override) continue;
    if (!reasons.empty()) reasons += "; ";
    if (!p->refusal.ok()) {
      reasons += p->refusal.message();  // names the peer
      continue;
    }
    reasons += fmt::format("{}: {}", p->spec.name,
                           !p->last_error.empty() ? p->last_error
                           : p->ready()           ? "failed this request"
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
    KvCache& cache = engine_->kv_cache(0);
    counters_.bytes_received += static_cast<int64_t>(
        req.peer->plan->ExpectedBytes(req.pages.size() - static_cast<size_t>(req.cached_pages),
                                      req.transfer_id) +
        cache.slot_bytes());
    counters_.transfer_latency_seconds.Observe(
        std::chrono::duration<double>(at - req.prefill_sent).count());
    // Every write P will send has landed: the slot can be reused.
    req.peer->own_tokens -= static_cast<int64_t>(req.prefix.size());
    FreeSlot(req);
    req.state = Request::State::kLanded;
    std::vector<float> context(cache.slot_bytes() / sizeof(float));
    if (!context.empty()) {
      std::memcpy(context.data(), cache.ContextSlot(req.context_page()), cache.slot_bytes());
    }
    engine_->Admit(id, std::move(context));
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

void DecodeMessenger::OnWriteFailed(uint64_t transfer_id, const std::string& reason) {
  auto idx = by_transfer_id_.find(transfer_id);
  if (idx == by_transfer_id_.end()) return;
  auto it = requests_.find(idx->second);
  if (it == requests_.end()) return;
  Request& req = *it->second;
  if (req.state != Request::State::kInFlight || req.transfer_id != transfer_id) return;
  Abandon(req, Status::Unavailable("prefill peer " + req.peer->spec.name + ": " + reason),
          /*retry=*/true);
}

void DecodeMessenger::Abandon(Request& req, const Status& why, bool retry) {
  core_->fabric().RemoveExpectation(req.immediate);
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
  peers_->Send(*req.peer, Cancel{req.transfer_id});
  PublishStats();
}

void DecodeMessenger::OnCancelAck(uint64_t transfer_id) {
  auto idx = by_transfer_id_.find(transfer_id);
  if (idx == by_transfer_id_.end()) return;
  auto it = requests_.find(idx->second);
  if (it == requests_.end()) return;
  Request& req = *it->second;
  if (req.state == Request::State::kCancelling && req.transfer_id == transfer_id) Quiesced(req);
}

void DecodeMessenger::Quiesced(Request& req) {
  by_transfer_id_.erase(req.transfer_id);
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
      core_->fabric().RemoveExpectation(req.immediate);
      req.peer->own_tokens -= static_cast<int64_t>(req.prefix.size());
      req.state = Request::State::kCancelling;
      req.cancel_sent = Clock::now();
      peers_->Send(*req.peer, Cancel{req.transfer_id});
      return;
    case Request::State::kCancelling:
      return;  // released on CancelAck or the peer's removal
    default:
      // Nothing can land: admitted (the engine freed or frees its pages), queued or never
      // allocated. ReleaseHeldPages is a no-op when the engine holds nothing.
      ReleaseUnsent(req);
      engine_->ReleaseHeldPages(id);
      requests_.erase(it);
      PublishStats();
  }
}

void DecodeMessenger::FreeSlot(Request& req) {
  if (!req.has_slot) return;
  slots_.Release(req.slot);  // its generation moves on: late writes of this use count for nobody
  req.has_slot = false;
}

void DecodeMessenger::Tick() {
  peers_->Tick();
  const TimePoint now = Clock::now();
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
      peers_->Remove(*req->peer, Status::DeadlineExceeded("no answer to a cancel"));
    }
  }
}

void DecodeMessenger::PublishStats() {
  PublishLoads();
  DecodeMessengerStats s = counters_;
  for (const auto& p : peers_->all()) s.peers_ready += p->ready() && !p->retired;
  s.peers_readmitted = peers_->readmissions();
  s.requests_in_flight = static_cast<int>(requests_.size());
  for (const auto& [id, req] : requests_) {
    s.requests_waiting_kv += !req->engine_finished && (req->state == Request::State::kQueued ||
                                                       req->state == Request::State::kInFlight);
  }
  s.slots_in_use = slots_.in_use();
  s.peers = peers_->Statuses();
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
