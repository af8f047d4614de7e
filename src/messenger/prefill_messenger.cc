#include "messenger/prefill_messenger.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "common/logging.h"
#include "messenger/immediate.h"
#include "messenger/node_info.h"

namespace pdserve::messenger {

Result<std::unique_ptr<PrefillMessenger>> PrefillMessenger::Create(Engine* engine,
                                                                   MessengerOptions options) {
  if (engine == nullptr) return Status::InvalidArgument("prefill messenger needs an engine");
  std::unique_ptr<PrefillMessenger> m(new PrefillMessenger(engine, std::move(options)));
  PD_RETURN_IF_ERROR(m->Init());
  return m;
}

PrefillMessenger::PrefillMessenger(Engine* engine, MessengerOptions options)
    : engine_(engine), options_(std::move(options)), kv_streaming_(options_.kv_streaming) {}

Status PrefillMessenger::Init() {
  MessengerHandlers handlers;
  handlers.on_message = [this](fabric::PeerId from, uint64_t instance, Message m) {
    Handle(from, instance, std::move(m));
  };
  handlers.on_peer_error = [this](fabric::PeerId peer, const Status& error) {
    DropPeer(peer, error);
  };
  handlers.on_tick = [this] { Tick(); };
  // Every rank's cache is mapped in this process (rank workers hand theirs over); each decode
  // peer gets views of them of its own at its handshake (PeerViews). P's memory is never a
  // write target: no descriptor goes out.
  PD_ASSIGN_OR_RETURN(core_, MessengerCore::Create(engine_, options_, std::move(handlers)));
  const KvLayout& layout = engine_->kv_cache(0).layout();
  std::weak_ptr<ControlLoop> weak_loop = core_->weak_loop();
  streamer_ = std::make_unique<LayerStreamer>(
      &core_->fabric(), layout.page_tokens, layout.num_layers, engine_->tp_size(), &core_->events(),
      [weak_loop, this](const std::shared_ptr<StreamJob>& job) {
        if (auto loop = weak_loop.lock()) {
          loop->Post([this, id = job->engine_id] { CheckJob(id); });
        }
      });
  engine_->SetStepObserver(streamer_.get());
  streamer_->Start();
  core_->Start();
  return Status::Ok();
}

PrefillMessenger::~PrefillMessenger() {
  if (streamer_) streamer_->Stop();
  // Ends every transfer (completions find the loop stopped) before the streamer they call, and
  // before the peers' live views are freed.
  if (core_) core_->Shutdown();
  streamer_.reset();
  peers_.clear();
}

void PrefillMessenger::Handle(fabric::PeerId from, uint64_t instance, Message message) {
  if (auto* hello = std::get_if<Hello>(&message)) return HandleHello(instance, *hello);
  auto peer = peers_.find(from);
  if (peer == peers_.end()) return;  // not (or no longer) a peer: nothing it says counts
  peer->second.last_heard = Clock::now();
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, HelloFinish>) {
          HandleHelloFinish(from, m);
        } else if constexpr (std::is_same_v<T, PrefillRequest>) {
          HandlePrefill(from, std::move(m));
        } else if constexpr (std::is_same_v<T, Cancel>) {
          HandleCancel(from, m);
        } else if constexpr (std::is_same_v<T, Heartbeat>) {
          SendTo(from, Load());
        } else if constexpr (std::is_same_v<T, HandshakeRefused>) {
          DropPeer(from, Status::FailedPrecondition("decode node refused: " + m.reason));
        }
      },
      message);
}

void PrefillMessenger::HandleHello(uint64_t instance, const Hello& hello) {
  Result<fabric::TransferEngineAddress> address =
      fabric::TransferEngineAddress::Parse(hello.reply_address);
  if (!address.ok() || address->instance != instance) {
    PD_LOG_WARN("hello with a bad reply address from instance {:x}", instance);
    return;
  }
  // A repeated Hello starts the handshake over. Before the handshake finished (D retrying
  // an unanswered Hello) nothing was given to the peer: its state is dropped but the fabric
  // peer kept, and AddPeer returns its id. After it, D has removed this node (it stalled, or
  // the link was cut) and begins a new epoch: the old one is removed like a dead peer — its
  // jobs stopped, views revoked — and the peer added anew. A Hello from a peer already
  // removed here arrives as from a stranger, and is a new epoch too.
  for (auto it = peers_.begin(); it != peers_.end(); ++it) {
    if (it->second.instance == instance) {
      const bool handshaken = it->second.ready;
      DropPeer(it->first,
               Status::Cancelled(handshaken ? "the decode peer began a new epoch"
                                            : "the decode peer said hello again"),
               /*remove=*/handshaken);
      break;
    }
  }
  Result<fabric::PeerId> peer = core_->fabric().AddPeer(*address);
  Result<Nonce> nonce = MakeNonce();
  if (!peer.ok() || !nonce.ok()) {
    PD_LOG_WARN("cannot answer hello from {:x}: {}", instance,
                (!peer.ok() ? peer.status() : nonce.status()).ToString());
    return;
  }
  DecodePeer& p = peers_[*peer];
  p = DecodePeer{};
  p.instance = instance;
  p.incarnation = hello.incarnation;
  p.own_nonce = *nonce;
  p.peer_nonce = hello.nonce;
  p.last_heard = Clock::now();
  SendTo(*peer, HelloAck{.incarnation = core_->incarnation(),
                         .nonce = p.own_nonce,
                         .hello_nonce = p.peer_nonce,
                         .proof = MakeClusterProof(options_.cluster_key, p.own_nonce, p.peer_nonce,
                                                   core_->incarnation()),
                         .node = core_->local()});
}

void PrefillMessenger::HandleHelloFinish(fabric::PeerId from, const HelloFinish& finish) {
  DecodePeer& p = peers_[from];
  if (p.ready) return;
  Status s = VerifyClusterProof(options_.cluster_key, p.own_nonce, p.peer_nonce,
                                core_->incarnation(), p.incarnation, finish.proof);
  if (s.ok()) s = CheckPeerCompatible(core_->local(), finish.node);
  // One descriptor per decode rank (DecodeMessage guarantees the count): each rank's region
  // is the target of the writes the plan routes to that rank.
  auto dst = std::make_shared<std::vector<fabric::MemoryDescriptor>>();
  for (size_t r = 0; s.ok() && r < finish.node.rank_memory.size(); ++r) {
    Result<fabric::MemoryDescriptor> d =
        fabric::MemoryDescriptor::Parse(finish.node.rank_memory[r]);
    if (!d.ok()) {
      s = d.status().WithContext(fmt::format("decode rank {} memory descriptor", r));
    } else {
      dst->push_back(std::move(d).value());
    }
  }
  Result<TransferPlan> plan = TransferPlan::Create(core_->local().kv, finish.node.kv);
  if (s.ok() && !plan.ok()) s = plan.status();
  // Every write to the peer reads through views of its own, revoked when it is dropped.
  if (s.ok()) s = p.views.Open(*engine_, core_->fabric());
  if (s.ok()) p.src = std::make_shared<const std::vector<fabric::RegionId>>(p.views.regions());
  if (!s.ok()) {
    PD_LOG_WARN("handshake with decode peer {:x} refused: {}", p.instance, s.ToString());
    SendTo(from, HandshakeRefused{s.message()});
    DropPeer(from, s);
    return;
  }
  p.dst = std::move(dst);
  p.plan = std::make_shared<const TransferPlan>(std::move(plan).value());
  p.ready = true;
  if (removed_instances_.erase(p.instance) != 0) {
    ++counters_.peers_readmitted;
    PD_LOG_INFO("decode peer {:x} (incarnation {:x}) taken back", p.instance, p.incarnation);
  } else {
    PD_LOG_INFO("decode peer {:x} (incarnation {:x}) connected", p.instance, p.incarnation);
  }
  // Also the handshake's confirmation: D sends no PrefillRequest before it (messages are not
  // ordered, so a request must not overtake HelloFinish).
  SendTo(from, Load());
  PublishStats();
}

void PrefillMessenger::HandlePrefill(fabric::PeerId from, PrefillRequest request) {
  DecodePeer& p = peers_[from];
  const std::string engine_id = fmt::format("pd-{:x}-{}", p.instance, request.transfer_id);
  PD_LOG_DEBUG("prefill request {} from {:x}: {} tokens", request.transfer_id, p.instance,
               request.token_ids.size());
  auto refuse = [&](const std::string& why) {
    PD_LOG_WARN("prefill request {} refused: {}", request.transfer_id, why);
    SendTo(from, WriteFailed{request.transfer_id, why});
    ++counters_.requests_failed;
  };
  if (!p.ready) return refuse("prefill request before the handshake finished");
  if (jobs_.count(engine_id) != 0) return refuse("transfer id already in flight");
  // Every rank of both sides has the same page size (TransferPlan::Create checked), but each
  // may have its own page count: a destination page must exist in every decode rank's cache.
  const KvLayout& layout = p.plan->source().ranks[0];
  const int64_t tokens = static_cast<int64_t>(request.token_ids.size());
  // D's cached pages and the destination pages together cover the tokens, and at least one
  // page is left to write.
  if (static_cast<size_t>(layout.PagesForTokens(tokens)) !=
      request.cached_pages + request.destination_pages.size()) {
    return refuse(fmt::format("{} tokens need {} pages, got {} cached and {} destination pages",
                              tokens, layout.PagesForTokens(tokens), request.cached_pages,
                              request.destination_pages.size()));
  }
  PageId dst_pages = std::numeric_limits<PageId>::max();
  for (const KvLayout& rank : p.plan->destination().ranks) {
    dst_pages = std::min(dst_pages, rank.num_pages);
  }
  for (PageId page : request.destination_pages) {
    if (page >= dst_pages) {
      return refuse(
          fmt::format("destination page {} outside the decode cache ({} pages)", page, dst_pages));
    }
  }
  std::optional<ContextBuffer> context;
  if (request.context_buffer.has_value()) {
    // The hidden state of the last prefilled position (n-2), into D's slot of the page holding
    // it: the last destination page, which D holds alone (its prefix cache hit stops before it).
    Result<ContextBuffer> parsed = ParseContextBuffer(*request.context_buffer);
    if (!parsed.ok()) return refuse(parsed.status().message());
    const size_t own = engine_->kv_cache(0).slot_bytes();
    const KvLayout& dst0 = p.plan->destination().ranks[0];
    if (own == 0 || parsed->bytes != own) {
      return refuse(fmt::format(
          "a context buffer of {} bytes asked; this node writes {} (--speculative mtp on both)",
          parsed->bytes, own));
    }
    if (request.destination_pages.empty() ||
        parsed->offset !=
            dst0.total_bytes() + static_cast<uint64_t>(request.destination_pages.back()) * own) {
      return refuse(fmt::format(
          "context buffer at offset {} is not the last destination page's slot", parsed->offset));
    }
    context = *parsed;
  }
  auto job = std::make_shared<StreamJob>();
  job->engine_id = engine_id;
  job->transfer_id = request.transfer_id;
  job->peer_instance = p.instance;
  job->peer = from;
  job->src = p.src;
  job->dst = p.dst;
  job->plan = p.plan;
  job->seed = request.replica_seed;
  job->immediate =
      EncodeImmediate({.slot = request.transfer_slot, .generation = request.generation});
  job->num_tokens = tokens;
  job->streaming = kv_streaming_.load();
  job->first_page = static_cast<int>(request.cached_pages);
  job->dst_pages = std::move(request.destination_pages);
  job->deadline = Deadline::AfterMs(request.deadline_ms);

  EngineRequest er;
  er.id = engine_id;
  er.prompt = std::move(request.token_ids);
  er.kind = RequestKind::kPrefillOnly;
  er.params.max_tokens = 1;  // never sampled; Validate wants a sane value
  er.on_output = [weak_loop = core_->weak_loop(), this, engine_id](const RequestOutput& out) {
    if (!out.finished) return;
    if (auto loop = weak_loop.lock()) {
      loop->Post([this, engine_id, out] { OnEngineOutput(engine_id, out); });
    }
  };
  streamer_->Add(job);  // before Submit: the first step may be announced at once
  JobState& new_state = jobs_[engine_id];
  new_state.job = job;
  new_state.num_tokens = tokens;
  new_state.context = context;
  if (Status s = engine_->Submit(std::move(er)); !s.ok()) {
    JobState& state = jobs_[engine_id];
    state.engine_finished = true;
    FailJob(state, s);
    CheckJob(engine_id);
    return;
  }
  ++counters_.requests_total;
  counters_.outstanding_prefill_tokens += tokens;
  rate_.Observe(Clock::now(), 0, /*busy_after=*/true);
  PublishStats();
}

void PrefillMessenger::HandleCancel(fabric::PeerId from, const Cancel& cancel) {
  const std::string engine_id =
      fmt::format("pd-{:x}-{}", peers_[from].instance, cancel.transfer_id);
  auto it = jobs_.find(engine_id);
  if (it == jobs_.end()) {
    // Already done (every write completed): nothing can land.
    SendTo(from, CancelAck{cancel.transfer_id});
    return;
  }
  JobState& state = it->second;
  state.cancelled = true;
  streamer_->StopJob(state.job);
  if (!state.engine_finished) engine_->Cancel(engine_id);
  ++counters_.requests_cancelled;
  CheckJob(engine_id);
}

void PrefillMessenger::OnEngineOutput(const std::string& engine_id, const RequestOutput& out) {
  auto it = jobs_.find(engine_id);
  if (it == jobs_.end()) return;
  JobState& state = it->second;
  state.engine_finished = true;
  counters_.outstanding_prefill_tokens -= state.num_tokens;
  rate_.Observe(Clock::now(), out.finish_reason == FinishReason::kPrefilled ? state.num_tokens : 0,
                counters_.outstanding_prefill_tokens > 0);
  counters_.prefill_tokens_per_second = rate_.tokens_per_second();
  // Every decode peer learns of the shorter queue now, not at its next heartbeat: its
  // admission estimates use it (docs/messenger.md, "Admission").
  const LoadReport load = Load();
  for (const auto& [peer, p] : peers_) {
    if (p.ready) SendTo(peer, load);
  }
  if (out.finish_reason != FinishReason::kPrefilled && !state.cancelled) {
    FailJob(state, out.status.ok() ? Status::Internal(fmt::format(
                                         "prefill ended: {}", FinishReasonName(out.finish_reason)))
                                   : out.status);
  } else if (out.finish_reason == FinishReason::kPrefilled && state.context.has_value() &&
             !state.cancelled && !state.peer_gone && !state.job->write_failed.load()) {
    if (Status s = WriteContext(state, out); !s.ok()) FailJob(state, s);
  }
  CheckJob(engine_id);
}

Status PrefillMessenger::WriteContext(JobState& state, const RequestOutput& out) {
  const ContextBuffer& to = *state.context;
  if (out.mtp_hidden.size() * sizeof(float) != to.bytes || out.held_pages.empty()) {
    return Status::Internal(fmt::format("the prefill left {} bytes of context for a buffer of {}",
                                        out.mtp_hidden.size() * sizeof(float), to.bytes));
  }
  // Staged in this node's slot of the page holding the last prefilled position (held until the
  // job is quiescent), which is in the memory its views of the cache register. That page is
  // the request's alone: its prefix cache hit stops before it, and it is not sealed before the
  // pages are released (its last position's MTP entry is never final here).
  KvCache& cache = engine_->kv_cache(0);
  const int page_tokens = cache.layout().page_tokens;
  const size_t index = static_cast<size_t>((state.num_tokens - 1) / page_tokens);
  if (state.num_tokens < 1 || index >= out.held_pages.size()) {
    return Status::Internal(fmt::format("the prefill of {} tokens left {} pages", state.num_tokens,
                                        out.held_pages.size()));
  }
  const PageId page = out.held_pages[index];
  std::memcpy(cache.ContextSlot(page), out.mtp_hidden.data(), to.bytes);
  const std::shared_ptr<StreamJob>& job = state.job;
  std::weak_ptr<ControlLoop> weak_loop = core_->weak_loop();
  fabric::Completion done{.callback = [this, weak_loop, id = job->engine_id](const Status& s) {
    if (auto loop = weak_loop.lock()) loop->Post([this, id, s] { OnContextWritten(id, s); });
  }};
  PD_RETURN_IF_ERROR(
      core_->fabric().PostWrite(fabric::SingleWrite{.src_region = (*job->src)[0],
                                                    .src_offset = cache.ContextSlotOffset(page),
                                                    .peer = job->peer,
                                                    .dst = &(*job->dst)[0],
                                                    .dst_offset = to.offset,
                                                    .length = to.bytes,
                                                    .immediate = job->immediate,
                                                    .deadline = job->deadline},
                                std::move(done)));
  state.context_pending = true;
  return Status::Ok();
}

void PrefillMessenger::OnContextWritten(const std::string& engine_id, const Status& status) {
  auto it = jobs_.find(engine_id);
  if (it == jobs_.end()) return;
  JobState& state = it->second;
  state.context_pending = false;
  if (!status.ok() && !state.cancelled && !state.peer_gone) {
    FailJob(state, status.WithContext("writing the context buffer"));
  }
  CheckJob(engine_id);
}

void PrefillMessenger::FailJob(JobState& state, const Status& why) {
  streamer_->StopJob(state.job);
  {
    MutexLock lock(&state.job->error_mu);
    if (state.job->first_error.ok()) state.job->first_error = why;
  }
  state.job->write_failed.store(true);
  if (!state.engine_finished) engine_->Cancel(state.job->engine_id);
}

void PrefillMessenger::CheckJob(const std::string& engine_id) {
  auto it = jobs_.find(engine_id);
  if (it == jobs_.end()) return;
  JobState& state = it->second;
  const std::shared_ptr<StreamJob>& job = state.job;
  if (job->write_failed.load() && !state.failure_reported) {
    state.failure_reported = true;
    Status error;
    {
      MutexLock lock(&job->error_mu);
      error = job->first_error;
    }
    streamer_->StopJob(job);
    if (!state.engine_finished) engine_->Cancel(engine_id);
    if (!state.cancelled && !state.peer_gone) {
      // At once: D need not wait for its deadline.
      SendTo(job->peer, WriteFailed{job->transfer_id, error.ToString()});
      ++counters_.requests_failed;
    }
  }
  const LayerStreamer::JobProgress progress = streamer_->Progress(*job);
  const bool all_streamed = progress.pages_streamed == static_cast<int>(job->dst_pages.size());
  const bool quiescent = state.engine_finished && (progress.stopped || all_streamed) &&
                         job->writes_completed.load() == progress.writes_posted &&
                         !state.context_pending;
  if (!quiescent) return;
  PD_LOG_DEBUG("prefill request {} done: {} writes", job->transfer_id, progress.writes_posted);
  // Nothing of this request is in flight any more: its source pages may be reused. The engine
  // holds a prefill-only request's pages however it ended (cancelled or failed mid-prefill
  // too), so this is the only place P's pages are freed (a no-op if none were allocated).
  engine_->ReleaseHeldPages(engine_id);
  core_->events().Record(EventKind::kWritesComplete, 0, -1, job->transfer_id,
                         progress.writes_posted);
  if (state.cancelled && !state.peer_gone) SendTo(job->peer, CancelAck{job->transfer_id});
  streamer_->Remove(job);
  jobs_.erase(it);
  PublishStats();
}

void PrefillMessenger::DropPeer(fabric::PeerId peer, const Status& why, bool remove) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;
  PD_LOG_WARN("decode peer {:x} removed: {}", it->second.instance, why.ToString());
  std::vector<std::string> ids;
  for (auto& [id, state] : jobs_) {
    if (state.job->peer != peer) continue;
    state.peer_gone = true;
    streamer_->StopJob(state.job);
    if (!state.engine_finished) engine_->Cancel(id);
    ids.push_back(id);
  }
  // Ends the peer's unfinished writes (their completions run before this returns; the
  // provider may still be sending them).
  if (Status s = remove ? core_->fabric().RemovePeer(peer) : Status::Ok(); !s.ok()) {
    PD_LOG_WARN("removing decode peer: {}", s.ToString());
  }
  if (remove && it->second.ready) {
    // Remembered to count its return (a re-admission); bounded, as instances are random.
    if (removed_instances_.size() >= kRemovedInstancesKept) removed_instances_.clear();
    removed_instances_.insert(it->second.instance);
  }
  // From here on whatever of them is still sent reads throwaway memory: the pages may go.
  // (Not removed — D said hello again before any request — nothing is in flight to it.)
  core_->RetireViews(it->second.views, remove, fmt::format("{:x}", it->second.instance));
  peers_.erase(it);
  for (const std::string& id : ids) CheckJob(id);
  PublishStats();
}

void PrefillMessenger::Tick() {
  const TimePoint now = Clock::now();
  std::vector<fabric::PeerId> silent;
  for (const auto& [id, p] : peers_) {
    if (now - p.last_heard > options_.peer_timeout) silent.push_back(id);
  }
  for (fabric::PeerId id : silent) {
    DropPeer(id, Status::DeadlineExceeded("no heartbeat from the decode peer"));
  }
  std::vector<std::string> late;
  for (auto& [id, state] : jobs_) {
    if (!state.job->write_failed.load() && state.job->deadline.Passed()) late.push_back(id);
  }
  for (const std::string& id : late) {
    ++counters_.requests_expired;
    FailJob(jobs_[id], Status::DeadlineExceeded("prefill request passed its deadline"));
    CheckJob(id);
  }
}

void PrefillMessenger::SendTo(fabric::PeerId peer, const Message& message) {
  core_->Send(peer, message);
}

LoadReport PrefillMessenger::Load() const {
  return LoadReport{
      .outstanding_prefill_tokens =
          static_cast<uint64_t>(std::max<int64_t>(0, counters_.outstanding_prefill_tokens)),
      .prefill_rate_milli = static_cast<uint64_t>(std::min<double>(
          static_cast<double>(kMaxPrefillRateMilli), rate_.tokens_per_second() * 1000.0))};
}

void PrefillMessenger::PublishStats() {
  PrefillMessengerStats s = counters_;
  s.peers_ready = 0;
  for (const auto& [id, p] : peers_) s.peers_ready += p.ready;
  s.requests_in_flight = static_cast<int>(jobs_.size());
  MutexLock lock(&stats_mu_);
  stats_ = s;
}

PrefillMessengerStats PrefillMessenger::stats() const {
  PrefillMessengerStats s;
  {
    MutexLock lock(&stats_mu_);
    s = stats_;
  }
  // Live, from the completions: these move between control-loop publications.
  s.writes_sent = streamer_->writes_sent();
  s.bytes_sent = streamer_->bytes_sent();
  s.writes_sent_by_rank = streamer_->writes_sent_by_rank();
  s.bytes_sent_by_rank = streamer_->bytes_sent_by_rank();
  return s;
}

}  // namespace pdserve::messenger
