#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <string>

#include <fmt/format.h>

#include "common/check.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "engine/mtp_drafter.h"
#include "engine/spec_sampling.h"
#include "engine/stop_checker.h"

namespace pdserve {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
    case FinishReason::kPrefilled:
      return "prefilled";
  }
  return "unknown";
}

// Bumps the engine's layer counter and tells the step observer.
class Engine::LayerCounter : public LayerObserver {
 public:
  explicit LayerCounter(Engine* engine) : engine_(engine) {}
  void OnLayerDone(int layer) override {
    engine_->layer_progress_.fetch_add(1, std::memory_order_release);
    if (engine_->observer_ != nullptr) {
      engine_->observer_->OnLayerDone(engine_->steps_.load(std::memory_order_relaxed), layer);
    }
  }

 private:
  Engine* engine_;
};

Sequence::Sequence(EngineRequest req, int page_tokens, Sampler s)
    : request(std::move(req)), table(page_tokens), sampler(std::move(s)), draft_table(page_tokens) {
  tokens = request.prompt;
  prompt_len = static_cast<int>(tokens.size());
}
Sequence::~Sequence() = default;

namespace {

// What besides the tokens changes a page's KV (engine/prefix_cache.h).
std::string PrefixCacheSalt(const Transformer& model, const KvLayout& layout) {
  return fmt::format("model={:016x} kv_dtype={} kv_kind={}", model.Fingerprint(),
                     DTypeName(layout.dtype), static_cast<int>(layout.kind));
}

// Rank r's cache layout: rank 0's (the model's) with r's KV heads.
KvLayout RankKvLayout(const Transformer& model, int rank, int num_pages, int page_tokens) {
  KvLayout layout = model.MakeKvLayout(num_pages, page_tokens);
  auto slices = TpSlices::Create(model.config(), rank, model.tp().size);
  PD_CHECK(slices.ok());  // the model was created with this TP size
  layout.num_kv_heads = slices->kv_heads.size();
  return layout;
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<Transformer> model,
                                               const Tokenizer* tokenizer,
                                               const EngineOptions& options,
                                               std::unique_ptr<Drafter> drafter) {
  if (model == nullptr) return Status::InvalidArgument("engine needs a model");
  const bool mtp = drafter == nullptr && model->mtp_kv() && options.num_speculative_tokens > 0;
  if ((drafter != nullptr || mtp) &&
      (options.num_speculative_tokens < 1 ||
       options.num_speculative_tokens > EngineOptions::kMaxSpeculativeTokens)) {
    return Status::InvalidArgument(
        fmt::format("{} speculative tokens: with a drafter, between 1 and {}",
                    options.num_speculative_tokens, EngineOptions::kMaxSpeculativeTokens));
  }
  if (options.page_tokens <= 0 || options.page_tokens > 1024) {
    return Status::InvalidArgument(
        fmt::format("page size {} out of range [1, 1024]", options.page_tokens));
  }
  if (options.scheduler.max_batch_tokens <= 0 || options.scheduler.max_running <= 0) {
    return Status::InvalidArgument("max_batch_tokens and max_running must be positive");
  }
  const int tp = options.tensor_parallel.size;
  if (model->tp().size != tp || model->tp().rank != 0) {
    return Status::InvalidArgument(
        fmt::format("the engine runs TP {} but the model is rank {} of {}", tp, model->tp().rank,
                    model->tp().size));
  }
  int pages = options.num_pages;
  if (pages <= 0) {
    // One page of every rank (each holds its KV heads; replicas hold copies).
    size_t page_bytes = 0;
    for (int r = 0; r < tp; ++r)
      page_bytes += RankKvLayout(*model, r, 1, options.page_tokens).total_bytes();
    pages = static_cast<int>(options.kv_cache_bytes / page_bytes);
  }
  if (pages <= 0) return Status::InvalidArgument("KV cache too small for one page");
  // With the MTP KV layer, a context slot a page for the hidden state a drafter starts from
  // (KvCache::ContextSlot; written by a prefill node, read by a decode node).
  const size_t slot_bytes =
      model->mtp_kv() ? static_cast<size_t>(model->config().hidden_size) * sizeof(float) : 0;
  PD_ASSIGN_OR_RETURN(auto cache,
                      KvCache::Create(model->MakeKvLayout(pages, options.page_tokens), slot_bytes));
  std::unique_ptr<Engine> engine(
      new Engine(std::move(model), tokenizer, std::move(cache), options));
  if (mtp) {
    Engine* raw = engine.get();
    drafter = std::make_unique<MtpDrafter>(
        raw->model_->config().hidden_size, raw->model_->config().vocab_size,
        [raw](std::span<const SequenceChunk> chunks, std::span<const float> hidden_in,
              std::vector<float>* logits, std::vector<float>* hidden_out) {
          return raw->RunMtpPass(chunks, hidden_in, logits, hidden_out);
        });
  }
  if (drafter != nullptr) {
    PD_RETURN_IF_ERROR(drafter->CreateCache(pages, options.page_tokens));
    engine->drafter_ = std::move(drafter);
    engine->spec_.accepted_per_position.assign(options.num_speculative_tokens, 0);
    const PagePool* draft_pool = engine->drafter_->page_pool();
    engine->spec_.draft_pages_total = draft_pool != nullptr ? draft_pool->capacity() : 0;
    MutexLock lock(&engine->mu_);
    engine->stats_.num_speculative_tokens = options.num_speculative_tokens;
    engine->stats_.spec = engine->spec_;
  }
  PD_RETURN_IF_ERROR(engine->StartRankWorkers(pages));
  return engine;
}

Status Engine::StartRankWorkers(int num_pages) {
  const int tp = options_.tensor_parallel.size;
  if (tp == 1) return Status::Ok();
  std::vector<KvCache*> caches;
  for (int r = 1; r < tp; ++r) {
    PD_ASSIGN_OR_RETURN(auto cache,
                        KvCache::Create(RankKvLayout(*model_, r, num_pages, options_.page_tokens)));
    caches.push_back(cache.get());
    rank_caches_.push_back(std::move(cache));
  }
  PD_ASSIGN_OR_RETURN(workers_,
                      RankWorkers::Start(options_.tensor_parallel, caches, model_->Fingerprint()));
  model_->SetTpGroup(workers_->group());
  MutexLock lock(&mu_);
  stats_.tp_size = tp;
  return Status::Ok();
}

Status Engine::RunForward(std::span<const SequenceChunk> chunks) {
  if (workers_ != nullptr) {
    PD_RETURN_IF_ERROR(model_->Validate(chunks, *cache_));
    PD_RETURN_IF_ERROR(workers_->Publish(chunks));
  }
  return model_->Forward(chunks, *cache_, &logits_, layer_counter_.get(),
                         model_->mtp_kv() ? &hidden_ : nullptr);
}

Status Engine::RunMtpPass(std::span<const SequenceChunk> chunks, std::span<const float> hidden_in,
                          std::vector<float>* logits, std::vector<float>* hidden_out) {
  if (workers_ != nullptr) {
    PD_RETURN_IF_ERROR(model_->Validate(chunks, *cache_));
    PD_RETURN_IF_ERROR(workers_->Publish(chunks, StepKind::kMtpDraft, hidden_in));
  }
  return model_->ForwardMtp(chunks, hidden_in, *cache_, logits, hidden_out);
}

int64_t Engine::AddMtpRows(const ScheduledChunk& c, SequenceChunk& chunk) const {
  const Sequence& seq = *c.seq;
  // Only a sequence that drafts, or hands its state on, keeps a hidden state.
  const bool keeps = drafter_ != nullptr || seq.request.kind == RequestKind::kPrefillOnly;
  if (c.start == seq.num_computed && seq.in_decode()) {
    // The pending token, then the drafts: each row's next token is the chunk's next one, valid
    // as far as verification keeps the drafts; which row's state stands is known after it.
    chunk.mtp_tokens = chunk.tokens.subspan(1);
    chunk.hidden_rows = keeps ? static_cast<int>(chunk.tokens.size()) : 0;
    return -1;
  }
  // Prefill: every row but the prefill's last, whose entry the first drafting pass writes.
  const int64_t target = seq.prefill_target();
  const int64_t end = std::min(c.start + c.count, target - 1);
  if (end > c.start) {
    chunk.mtp_tokens = std::span<const int32_t>(seq.tokens).subspan(c.start + 1, end - c.start);
  }
  chunk.hidden_rows = keeps && c.start + c.count == target ? 1 : 0;
  return std::max(end, c.start);
}

void Engine::KeepHidden(Sequence* seq, int64_t row) {
  const size_t hidden = static_cast<size_t>(model_->config().hidden_size);
  const auto at = hidden_.begin() + static_cast<ptrdiff_t>(row * hidden);
  seq->mtp_hidden.assign(at, at + static_cast<ptrdiff_t>(hidden));
}

Engine::Engine(std::unique_ptr<Transformer> model, const Tokenizer* tokenizer,
               std::unique_ptr<KvCache> cache, const EngineOptions& options)
    : model_(std::move(model)),
      tokenizer_(tokenizer),
      cache_(std::move(cache)),
      pool_(cache_->layout().num_pages),
      prefix_cache_(&pool_, options.prefix_caching, PrefixCacheSalt(*model_, cache_->layout()),
                    options.page_tokens, model_->mtp_kv()),
      scheduler_(options.scheduler, &pool_, &prefix_cache_),
      seeds_(options.seed),
      options_(options),
      layer_counter_(std::make_unique<LayerCounter>(this)) {
  scheduler_.set_max_sequence_tokens(std::min<int64_t>(
      model_->config().MaxContext(), static_cast<int64_t>(pool_.capacity()) * options.page_tokens));
  for (int id : model_->config().eos_token_ids) eos_ids_.push_back(id);
  if (tokenizer_ != nullptr) {
    for (int32_t id : tokenizer_->eos_ids()) {
      if (std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) eos_ids_.push_back(id);
    }
  }
  stats_.pages_total = pool_.capacity();
  stats_.page_tokens = options.page_tokens;
}

Engine::~Engine() {
  Stop();
  DrainInbox();
  CancelAll();
}

Status Engine::Submit(EngineRequest request) {
  const ModelConfig& config = model_->config();
  if (!request.on_output) return Status::InvalidArgument("request has no output callback");
  if (request.prompt.empty()) return Status::InvalidArgument("empty prompt");
  if (request.kind == RequestKind::kRemotePrefill && !request.on_pages_allocated) {
    return Status::InvalidArgument("remote-prefill request needs on_pages_allocated");
  }
  PD_RETURN_IF_ERROR(request.params.Validate(config.vocab_size));
  const int64_t context = static_cast<int64_t>(request.prompt.size()) +
                          (request.kind == RequestKind::kPrefillOnly ? 0 : 1);
  if (context > config.MaxContext()) {
    return Status::OutOfRange(fmt::format("prompt of {} tokens exceeds the context of {}",
                                          request.prompt.size(), config.MaxContext()));
  }
  if (context > static_cast<int64_t>(pool_.capacity()) * options_.page_tokens) {
    return Status::OutOfRange(fmt::format("prompt of {} tokens exceeds the KV cache of {} tokens",
                                          request.prompt.size(),
                                          pool_.capacity() * options_.page_tokens));
  }
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= config.vocab_size) {
      return Status::InvalidArgument(
          fmt::format("prompt token {} out of range [0, {})", t, config.vocab_size));
    }
  }
  Sampler sampler(request.params, seeds_);
  auto seq =
      std::make_unique<Sequence>(std::move(request), options_.page_tokens, std::move(sampler));
  seq->stop = std::make_unique<StopChecker>(seq->request.params, eos_ids_);
  if (drafter_ != nullptr && seq->request.kind != RequestKind::kPrefillOnly) {
    seq->spec_tokens = options_.num_speculative_tokens;
  }
  if (tokenizer_ != nullptr) {
    seq->decoder = std::make_unique<IncrementalDecoder>(tokenizer_, /*skip_special=*/true);
  }
  {
    MutexLock lock(&mu_);
    inbox_.push_back({Command::Kind::kSubmit, std::move(seq), {}});
  }
  cv_.NotifyOne();
  return Status::Ok();
}

void Engine::Cancel(const std::string& id) {
  {
    MutexLock lock(&mu_);
    inbox_.push_back({Command::Kind::kCancel, nullptr, id});
  }
  cv_.NotifyOne();
}

void Engine::Admit(const std::string& id, std::vector<float> mtp_hidden) {
  {
    MutexLock lock(&mu_);
    inbox_.push_back({Command::Kind::kAdmit, nullptr, id, std::move(mtp_hidden)});
  }
  cv_.NotifyOne();
}

void Engine::PrefillLocally(const std::string& id) {
  {
    MutexLock lock(&mu_);
    inbox_.push_back({Command::Kind::kPrefillLocally, nullptr, id});
  }
  cv_.NotifyOne();
}

void Engine::ReleaseHeldPages(const std::string& id) {
  {
    MutexLock lock(&mu_);
    inbox_.push_back({Command::Kind::kRelease, nullptr, id});
  }
  cv_.NotifyOne();
}

void Engine::DrainInbox() {
  std::vector<Command> commands;
  {
    MutexLock lock(&mu_);
    commands.swap(inbox_);
  }
  for (Command& c : commands) Apply(c);
}

void Engine::Apply(Command& cmd) {
  switch (cmd.kind) {
    case Command::Kind::kSubmit: {
      Sequence* seq = cmd.seq.get();
      const std::string& id = seq->request.id;
      if (live_.count(id) != 0 || held_.count(id) != 0) {
        RequestOutput out;
        out.id = id;
        out.finished = true;
        out.finish_reason = FinishReason::kError;
        out.status = Status::AlreadyExists("request id already in use: " + id);
        seq->request.on_output(out);
        return;
      }
      live_.emplace(id, std::move(cmd.seq));
      if (seq->request.kind == RequestKind::kRemotePrefill) {
        remote_pending_.push_back(seq);
      } else {
        scheduler_.AddWaiting(seq);
      }
      return;
    }
    case Command::Kind::kCancel: {
      auto it = live_.find(cmd.id);
      if (it == live_.end()) return;  // already finished: nothing to do
      Sequence* seq = it->second.get();
      RequestOutput out;
      out.id = cmd.id;
      Finish(seq, FinishReason::kCancelled, Status::Cancelled("request cancelled"), std::move(out));
      return;
    }
    case Command::Kind::kAdmit: {
      auto it = live_.find(cmd.id);
      if (it == live_.end() || it->second->state != SequenceState::kAwaitingKv) return;
      Sequence* seq = it->second.get();
      seq->num_computed = seq->prompt_len - 1;  // the last prompt token runs as a decode step
      // The prefill node wrote the MTP entries of [0, n-2) (position n-2's needs token n-1: the
      // first drafting pass writes it); this node's cached pages are final already.
      seq->mtp_final = std::max<int64_t>(seq->table.sealed_tokens(), seq->prompt_len - 2);
      if (cmd.mtp_hidden.size() == static_cast<size_t>(model_->config().hidden_size)) {
        seq->mtp_hidden = std::move(cmd.mtp_hidden);
      }
      scheduler_.AddRunning(seq);
      return;
    }
    case Command::Kind::kPrefillLocally: {
      auto it = live_.find(cmd.id);
      if (it == live_.end() || it->second->state != SequenceState::kAwaitingKv) return;
      Sequence* seq = it->second.get();
      // An ordinary request from now on: its pages are no write target any more, so a
      // preemption may free them like any other's.
      seq->request.kind = RequestKind::kGenerate;
      // Pages shared from the prefix cache hold their KV already (and must not be written).
      seq->num_computed = seq->table.sealed_tokens();
      seq->mtp_final = seq->num_computed;
      scheduler_.AddWaiting(seq);
      return;
    }
    case Command::Kind::kRelease: {
      auto it = held_.find(cmd.id);
      if (it == held_.end()) return;
      it->second->table.Release(pool_);
      held_.erase(it);
      return;
    }
  }
}

void Engine::TryAllocateRemote() {
  // FIFO: a request that cannot get its pages blocks the ones behind it.
  size_t done = 0;
  for (; done < remote_pending_.size(); ++done) {
    Sequence* seq = remote_pending_[done];
    // The cached pages of its longest cached prefix (of [0, prompt - 1), the positions a
    // prefill node would fill): only the rest is asked for.
    const PrefixCache::Hit hit = prefix_cache_.Acquire(seq);
    if (!seq->table.EnsureCapacity(pool_, seq->prompt_len).ok()) {
      prefix_cache_.Return(seq, hit);
      break;
    }
    prefix_cache_.CountAdmission(seq, hit);
    seq->state = SequenceState::kAwaitingKv;
    const std::span<const PageId> pages = seq->table.pages();
    seq->request.on_pages_allocated(std::vector<PageId>(pages.begin(), pages.end()),
                                    seq->table.sealed_pages());
  }
  remote_pending_.erase(remote_pending_.begin(), remote_pending_.begin() + done);
}

bool Engine::Step() {
  DrainInbox();
  TryAllocateRemote();
  std::vector<ScheduledChunk> plan = scheduler_.Schedule();
  if (drafter_ != nullptr) {
    // A sequence that waits (preempted) holds no draft pages: it is recomputed anyway.
    for (Sequence* s : scheduler_.waiting()) {
      if (!s->draft_table.pages().empty()) drafter_->Release(*s);
    }
  }
  if (plan.empty()) {
    PublishStats();
    return false;
  }
  const uint64_t step = steps_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (drafter_ != nullptr) Draft(plan);
  std::vector<SequenceChunk> chunks;
  chunks.reserve(plan.size());
  hidden_at_.assign(plan.size(), -1);
  std::vector<int64_t> mtp_final_at(plan.size(), -1);
  int64_t hidden_rows = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const ScheduledChunk& c = plan[i];
    const std::span<const int32_t> tokens =
        c.logit_rows > 1 ? std::span<const int32_t>(c.seq->verify)
                         : std::span<const int32_t>(c.seq->tokens).subspan(c.start, c.count);
    SequenceChunk& chunk = chunks.emplace_back(SequenceChunk{.tokens = tokens,
                                                             .start = c.start,
                                                             .pages = c.seq->table.pages(),
                                                             .want_logits = c.want_logits,
                                                             .logit_rows = c.logit_rows});
    if (model_->mtp_kv()) mtp_final_at[i] = AddMtpRows(c, chunk);
    if (chunk.hidden_rows > 0) {
      hidden_at_[i] = hidden_rows;
      hidden_rows += chunk.hidden_rows;
    }
  }
  if (observer_ != nullptr) {
    std::vector<AnnouncedChunk> announced;
    announced.reserve(plan.size());
    for (const ScheduledChunk& c : plan) {
      announced.push_back({&c.seq->request.id, c.start, c.count, c.seq->table.pages()});
    }
    observer_->OnStepScheduled(step, announced);
  }
  Status s = RunForward(chunks);
  if (!s.ok()) {
    // Validation failed for the batch: fail every request in it rather than loop forever.
    PD_LOG_ERROR("forward pass failed: {}", s.ToString());
    for (const ScheduledChunk& c : plan) Fail(c.seq, s);
    return true;
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    const ScheduledChunk& c = plan[i];
    // A prefill's last row is where the drafts start (a decode chunk's row: ProcessLogits).
    if (hidden_at_[i] >= 0 && !c.want_logits) KeepHidden(c.seq, hidden_at_[i]);
    // A prefill chunk's MTP entries are final (the true next tokens); a verification's, once
    // verified (ProcessLogits).
    if (mtp_final_at[i] >= 0 && c.start <= c.seq->mtp_final) {
      c.seq->mtp_final = std::max(c.seq->mtp_final, mtp_final_at[i]);
    }
    c.seq->num_computed += c.count;
  }
  // Prefill-only chunks never want logits. Finish them before ProcessLogits, which may finish
  // (and free) other sequences of the plan, after which no plan entry may be dereferenced.
  for (const ScheduledChunk& c : plan) {
    Sequence* seq = c.seq;
    if (seq->state == SequenceState::kRunning && seq->request.kind == RequestKind::kPrefillOnly &&
        seq->num_computed == seq->prompt_len) {
      FinishPrefillOnly(seq);
    }
  }
  ProcessLogits(plan, logits_);
  for (Sequence* seq : scheduler_.running()) prefix_cache_.Seal(seq);
  PublishStats();
  return true;
}

KvCache& Engine::kv_cache(int rank) {
  PD_CHECK(rank >= 0 && rank < tp_size());
  return rank == 0 ? *cache_ : *rank_caches_[rank - 1];
}

void Engine::PublishStats() {
  int awaiting_kv = 0;
  for (const auto& [id, seq] : live_) awaiting_kv += seq->state == SequenceState::kAwaitingKv;
  MutexLock lock(&mu_);
  stats_.running = static_cast<int>(scheduler_.running().size());
  stats_.waiting = static_cast<int>(scheduler_.waiting().size() + remote_pending_.size());
  stats_.awaiting_kv = awaiting_kv;
  stats_.pages_used = pool_.used();
  stats_.pages_cached = pool_.cached_pages();
  stats_.pages_evictable = pool_.evictable_pages();
  stats_.prefix_cache = prefix_cache_.stats();
  stats_.preemptions = scheduler_.preemptions();
  stats_.steps = static_cast<int64_t>(steps_.load(std::memory_order_relaxed));
  if (drafter_ != nullptr) {
    const PagePool* draft_pool = drafter_->page_pool();
    spec_.draft_pages_used = draft_pool != nullptr ? draft_pool->used() : 0;
    stats_.spec = spec_;
  }
}

void Engine::Draft(std::span<ScheduledChunk> plan) {
  std::vector<DraftWish> wishes;
  for (const ScheduledChunk& c : plan) {
    if (c.speculative > 0) wishes.push_back({c.seq, c.speculative});
  }
  if (wishes.empty()) return;
  const auto start = std::chrono::steady_clock::now();
  if (Status s = drafter_->Propose(wishes); !s.ok()) {
    PD_LOG_ERROR("drafting failed, the step decodes without drafts: {}", s.ToString());
  }
  spec_.draft_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (ScheduledChunk& c : plan) {
    if (c.speculative <= 0 || c.seq->drafts.empty()) continue;
    Sequence& seq = *c.seq;
    seq.verify.assign(1, seq.tokens.back());
    seq.verify.insert(seq.verify.end(), seq.drafts.begin(), seq.drafts.end());
    c.count = static_cast<int64_t>(seq.verify.size());
    c.logit_rows = static_cast<int>(seq.verify.size());
  }
}

FinishReason Engine::Emit(Sequence* seq, SampleResult sample, RequestOutput& out) {
  seq->tokens.push_back(sample.token);
  std::string piece;
  if (seq->decoder != nullptr) piece = seq->decoder->Append(sample.token);
  StopDecision decision = seq->stop->Update(sample.token, piece);
  out.tokens.push_back(sample.token);
  out.samples.push_back(std::move(sample));
  out.text += decision.emit;
  FinishReason reason = decision.stop ? decision.reason : FinishReason::kNone;
  // No room for the new token's position in the model's context or in the whole cache.
  const int64_t room = std::min<int64_t>(
      model_->config().MaxContext(), static_cast<int64_t>(pool_.capacity()) * options_.page_tokens);
  if (reason == FinishReason::kNone && seq->num_tokens() > room) reason = FinishReason::kLength;
  if (reason != FinishReason::kNone && (!decision.stop || reason == FinishReason::kLength)) {
    if (seq->decoder != nullptr) out.text += seq->stop->Flush(seq->decoder->Flush());
  }
  return reason;
}

void Engine::ProcessLogits(std::span<const ScheduledChunk> plan, const std::vector<float>& logits) {
  const int vocab = model_->config().vocab_size;
  size_t row = 0;
  for (const ScheduledChunk& c : plan) {
    if (!c.want_logits) continue;
    Sequence* seq = c.seq;
    const size_t first_row = row;
    row += c.logit_rows;
    if (seq->state != SequenceState::kRunning) continue;
    // Row r holds the target's logits after the chunk's token r: draft r is kept, and the next
    // row looked at, while verification accepts it (engine/spec_sampling.h); the first
    // rejected, or the row after the last draft, gives the target's own token.
    const int drafted = c.logit_rows - 1;
    const int64_t before = seq->num_tokens();
    RequestOutput out;
    out.id = seq->request.id;
    FinishReason reason = FinishReason::kNone;
    int accepted = 0;
    for (int r = 0; r <= drafted; ++r) {
      std::span<const float> row_logits(&logits[(first_row + r) * vocab], vocab);
      VerifiedToken verified = VerifyRow(*seq, row_logits, r, drafted, verify_scratch_);
      reason = Emit(seq, std::move(verified.sample), out);
      if (!verified.accepted) break;
      ++accepted;
      ++spec_.accepted_per_position[r];
      if (reason != FinishReason::kNone) break;
    }
    if (const int64_t at = hidden_at_[&c - plan.data()]; at >= 0) KeepHidden(seq, at + accepted);
    // With the MTP layer, the entries of the pending token and the accepted drafts before the
    // last were written with the true next token; the last kept row's (with a rejected draft,
    // or none) waits for the next drafting pass 1. Only where the final run reaches (pass 1
    // made c.start - 1's final).
    if (model_->mtp_kv() && c.start <= seq->mtp_final) {
      seq->mtp_final = std::max(seq->mtp_final, c.start + accepted);
    }
    if (drafted > 0) {
      ++spec_.drafts;
      spec_.draft_tokens += drafted;
      spec_.accepted_tokens += accepted;
    }
    if (reason != FinishReason::kNone) {
      Finish(seq, reason, Status::Ok(), std::move(out));
      continue;
    }
    if (drafted > 0) {
      // The rejected drafts' KV stays in the pages but past the sequence's length, where no
      // attention reads it and the next steps overwrite it; whole pages past it go back.
      seq->num_computed = before + accepted;
      seq->table.Truncate(pool_, seq->num_tokens());
      drafter_->Rollback(*seq, seq->num_computed);
      seq->drafts.clear();
    }
    out.prompt_tokens = seq->prompt_len;
    out.completion_tokens = seq->completion_tokens();
    seq->request.on_output(out);
  }
}

void Engine::Finish(Sequence* seq, FinishReason reason, Status status, RequestOutput out) {
  out.finished = true;
  out.finish_reason = reason;
  out.status = std::move(status);
  out.prompt_tokens = seq->prompt_len;
  out.completion_tokens = seq->completion_tokens();
  scheduler_.Remove(seq);
  std::erase(remote_pending_, seq);
  prefix_cache_.Seal(seq);
  if (drafter_ != nullptr) drafter_->Release(*seq);
  const std::string id = seq->request.id;
  auto node = live_.extract(id);
  // Writes may still land in a kAwaitingKv request's pages, and a prefill-only request's
  // pages may still be read by writes its caller posted: hold them until the caller says so.
  const bool hold = seq->state == SequenceState::kAwaitingKv ||
                    (seq->request.kind == RequestKind::kPrefillOnly && !seq->table.pages().empty());
  if (hold) {
    seq->state = SequenceState::kFinished;
    const std::span<const PageId> pages = seq->table.pages();
    if (seq->request.kind == RequestKind::kPrefillOnly)
      out.held_pages.assign(pages.begin(), pages.end());
    held_.insert(std::move(node));
  } else {
    seq->state = SequenceState::kFinished;
    seq->table.Release(pool_);
  }
  seq->request.on_output(out);
}

void Engine::FinishPrefillOnly(Sequence* seq) {
  RequestOutput out;
  out.id = seq->request.id;
  out.finished = true;
  out.finish_reason = FinishReason::kPrefilled;
  out.prompt_tokens = seq->prompt_len;
  const std::span<const PageId> pages = seq->table.pages();
  out.held_pages.assign(pages.begin(), pages.end());
  out.mtp_hidden = std::move(seq->mtp_hidden);
  scheduler_.Remove(seq);
  prefix_cache_.Seal(seq);
  seq->state = SequenceState::kFinished;
  held_.insert(live_.extract(seq->request.id));
  seq->request.on_output(out);
}

void Engine::Fail(Sequence* seq, Status status) {
  RequestOutput out;
  out.id = seq->request.id;
  Finish(seq, FinishReason::kError, std::move(status), std::move(out));
}

void Engine::CancelAll() {
  while (!live_.empty()) {
    Sequence* seq = live_.begin()->second.get();
    RequestOutput out;
    out.id = seq->request.id;
    Finish(seq, FinishReason::kCancelled, Status::Cancelled("engine shut down"), std::move(out));
  }
  for (auto& [id, seq] : held_) seq->table.Release(pool_);
  held_.clear();
}

void Engine::RunUntilIdle() {
  while (true) {
    DrainInbox();
    if (scheduler_.idle() && remote_pending_.empty()) return;
    if (!Step()) return;  // nothing runnable (e.g. waiting for pages that never free)
  }
}

void Engine::Start() {
  loop_ = std::thread([this] {
    while (true) {
      {
        MutexLock lock(&mu_);
        if (stop_) return;
      }
      if (!Step()) {
        MutexLock lock(&mu_);
        // Woken by new commands; the timeout bounds how long an idle loop can miss a stop.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
        while (!stop_ && inbox_.empty()) {
          if (cv_.WaitUntil(&mu_, deadline) == std::cv_status::timeout) break;
        }
      }
    }
  });
}

void Engine::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (loop_.joinable()) loop_.join();
}

EngineStats Engine::stats() const {
  MutexLock lock(&mu_);
  EngineStats s = stats_;
  return s;
}

}  // namespace pdserve
