// Engine: continuous-batching inference over one Transformer and one paged KV cache.
//
// Threading: Submit, Cancel, Admit and ReleaseHeldPages may be called from any thread; they
// post to an inbox. Everything else happens on the loop thread — the caller of Step() /
// RunUntilIdle(), or the thread Start() spawns. Request callbacks run on the loop thread.
//
// Hooks for the KV messenger (DESIGN.md §2), without the engine knowing about it:
//  - deferred admission: RequestKind::kRemotePrefill + Admit(id) (or PrefillLocally(id));
//  - step announcement: StepObserver::OnStepScheduled before each forward pass;
//  - layer progress: layer_progress() counts finished layers (after each attention output
//    projection), monotonically across steps; StepObserver::OnLayerDone also reports it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "engine/drafter.h"
#include "engine/prefix_cache.h"
#include "engine/rank_workers.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "kv/kv_cache.h"
#include "kv/page_pool.h"
#include "model/transformer.h"
#include "tokenizer/tokenizer.h"

namespace pdserve {

struct EngineOptions {
  int num_pages = 0;  // 0 = sized from kv_cache_bytes
  size_t kv_cache_bytes = size_t{256} << 20;
  int page_tokens = 16;
  SchedulerOptions scheduler;
  uint64_t seed = 0;  // process-wide seed source for requests without a seed
  // TP > 1: the model is rank 0 of tensor_parallel.size and the engine starts the other ranks
  // (engine/rank_workers.h). The KV budget (kv_cache_bytes) is the node's, over all ranks.
  TensorParallelOptions tensor_parallel;
  // Speculative decoding (with a Drafter given to Create): tokens drafted per sequence and
  // step, in [1, kMaxSpeculativeTokens].
  int num_speculative_tokens = 0;
  static constexpr int kMaxSpeculativeTokens = 16;
  // Automatic prefix caching (engine/prefix_cache.h).
  bool prefix_caching = true;
};

// Speculative decoding's counters, as vLLM defines them: one draft per verified run of drafted
// tokens; accepted tokens are drafted tokens the target kept (not the token verification adds).
struct SpecDecodeStats {
  int64_t drafts = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position;  // [k]: drafts whose token k was accepted
  double draft_seconds = 0;                    // spent in Drafter::Propose (benchmarks)
  int draft_pages_used = 0;                    // the drafter's cache
  int draft_pages_total = 0;
};

// A chunk as announced to observers: which request, which tokens, which pages hold them.
struct AnnouncedChunk {
  const std::string* request_id;
  int64_t start;
  int64_t count;
  std::span<const PageId> pages;  // the sequence's whole block table
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // Called on the loop thread before the forward pass of a step.
  virtual void OnStepScheduled(uint64_t step, std::span<const AnnouncedChunk> chunks) = 0;
  // Called on the loop thread after layer `layer` of step `step` (attention output projected).
  virtual void OnLayerDone(uint64_t step, int layer) = 0;
};

struct EngineStats {
  int running = 0;
  int waiting = 0;
  int awaiting_kv = 0;
  int pages_used = 0;  // referenced by requests
  int pages_total = 0;
  int page_tokens = 0;      // tokens per KV page (--page-size)
  int pages_cached = 0;     // holding a cached prefix, referenced or not
  int pages_evictable = 0;  // cached and referenced by none: free for the taking
  PrefixCacheStats prefix_cache;
  int64_t preemptions = 0;
  int64_t steps = 0;
  int tp_size = 1;                 // tensor-parallel ranks computing each step
  int num_speculative_tokens = 0;  // 0: no speculative decoding
  SpecDecodeStats spec;
};

class Engine {
 public:
  // The engine owns the model. tokenizer may be null (then stop strings are not supported and
  // outputs carry no text); it must outlive the engine. With a drafter, sequences in decode
  // (kGenerate, and kRemotePrefill once admitted) speculate options.num_speculative_tokens
  // tokens a step: greedy output is the same as without it, sampled output has the same
  // distribution (engine/spec_sampling.h). A model loaded with its MTP KV layer
  // (TransformerOptions::mtp_kv) drafts with its MTP module (engine/mtp_drafter.h) when
  // num_speculative_tokens > 0 and no drafter is given; with 0 (a prefill node) it still writes
  // the module's KV and hands the last prompt position's hidden state to the caller
  // (RequestOutput::mtp_hidden).
  static Result<std::unique_ptr<Engine>> Create(std::unique_ptr<Transformer> model,
                                                const Tokenizer* tokenizer,
                                                const EngineOptions& options,
                                                std::unique_ptr<Drafter> drafter = nullptr);
  ~Engine();  // stops the loop thread; live requests finish with kCancelled
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. Errors (bad params, empty or too long prompt, token out of
  // range, no callback) are returned here and no callback is made. An id that is already live
  // is reported through the callback (kError), as the check happens on the loop thread.
  Status Submit(EngineRequest request) EXCLUDES(mu_);
  // Ends a request with kCancelled and frees its pages — except a kAwaitingKv request's pages
  // (writes may still land in them) and a kPrefillOnly request's (writes posted from them may
  // still read them): those stay held until ReleaseHeldPages, as the caller knows when.
  void Cancel(const std::string& id) EXCLUDES(mu_);
  // kRemotePrefill: the prompt's KV has landed; schedule the request. With the MTP drafter,
  // mtp_hidden is the prefill node's RequestOutput::mtp_hidden (without it, the first step
  // runs without drafts).
  void Admit(const std::string& id, std::vector<float> mtp_hidden = {}) EXCLUDES(mu_);
  // kRemotePrefill waiting for its KV: prefill the prompt here instead, chunked like any other
  // request, into the pages it already holds (no prefill node can serve it). Precondition: no
  // write can still land in those pages. A no-op for a request in any other state.
  void PrefillLocally(const std::string& id) EXCLUDES(mu_);
  // Frees pages a request left allocated (a finished kPrefillOnly request, whatever its
  // finish reason, or a cancelled kRemotePrefill request). A no-op if it holds none.
  void ReleaseHeldPages(const std::string& id) EXCLUDES(mu_);

  // Loop-thread API. Step() drains the inbox and runs at most one forward pass; it returns
  // false when there was nothing to run.
  bool Step() EXCLUDES(mu_);
  // Steps until no request is waiting or running (kAwaitingKv ones do not count).
  void RunUntilIdle() EXCLUDES(mu_);
  // Runs Step() on a background thread until the engine is destroyed or Stop() is called.
  void Start() EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);

  void SetStepObserver(StepObserver* observer) { observer_ = observer; }  // before Start
  uint64_t layer_progress() const { return layer_progress_.load(std::memory_order_acquire); }
  EngineStats stats() const EXCLUDES(mu_);
  const Transformer& model() const { return *model_; }
  // Rank 0's cache layout (every rank has the same pages; each holds its own KV heads).
  const KvLayout& kv_layout() const { return cache_->layout(); }
  KvCache& kv_cache() { return *cache_; }
  // Tensor parallelism: one KV cache per rank, all mapped in this process (rank r holds the
  // heads KvShardLayout::ForTensorParallel(kv_heads, tp_size()) gives it). 1 without TP.
  int tp_size() const { return 1 + static_cast<int>(rank_caches_.size()); }
  KvCache& kv_cache(int rank);  // precondition: 0 <= rank < tp_size()
  const PagePool& page_pool() const { return pool_; }
  const PrefixCache& prefix_cache() const { return prefix_cache_; }
  const Drafter* drafter() const { return drafter_.get(); }  // null without speculation

 private:
  class LayerCounter;
  struct Command {
    enum class Kind : uint8_t { kSubmit, kCancel, kAdmit, kPrefillLocally, kRelease } kind;
    std::unique_ptr<Sequence> seq;  // kSubmit
    std::string id;
    std::vector<float> mtp_hidden = {};  // kAdmit
  };
  Engine(std::unique_ptr<Transformer> model, const Tokenizer* tokenizer,
         std::unique_ptr<KvCache> cache, const EngineOptions& options);
  // TP > 1: creates ranks 1.. caches and starts their workers.
  Status StartRankWorkers(int num_pages) EXCLUDES(mu_);
  // Validates the step and hands it to the rank workers (a no-op without TP), then runs rank
  // 0's forward pass.
  Status RunForward(std::span<const SequenceChunk> chunks);
  // One MTP drafting pass (MtpDrafter::RunPass) on every rank.
  Status RunMtpPass(std::span<const SequenceChunk> chunks, std::span<const float> hidden_in,
                    std::vector<float>* logits, std::vector<float>* hidden_out);
  // With the MTP KV layer: the chunk's MTP entries (the rows whose next token is known) and the
  // hidden rows its sequence keeps (SequenceChunk::mtp_tokens, hidden_rows). Returns, for a
  // prefill chunk, where its final entries end (Sequence::mtp_final once the pass ran); -1 for
  // a decode chunk, whose entries verification decides.
  int64_t AddMtpRows(const ScheduledChunk& c, SequenceChunk& chunk) const;
  // Keeps hidden row `row` of the last forward pass as the sequence's mtp_hidden.
  void KeepHidden(Sequence* seq, int64_t row);
  void DrainInbox() EXCLUDES(mu_);
  void Apply(Command& cmd);
  void TryAllocateRemote();
  // Asks the drafter for the plan's speculative chunks and turns them into verification
  // chunks (the pending token, then the drafts).
  void Draft(std::span<ScheduledChunk> plan);
  // Samples, checks stops and emits outputs for the chunks that produced logits; verifies
  // drafted tokens and rolls back what was rejected.
  void ProcessLogits(std::span<const ScheduledChunk> plan, const std::vector<float>& logits);
  // Appends one sampled token to the sequence and to `out`, with its text; returns why the
  // sequence ends with it (kNone: it goes on), the text then flushed where due.
  FinishReason Emit(Sequence* seq, SampleResult sample, RequestOutput& out);
  void Finish(Sequence* seq, FinishReason reason, Status status, RequestOutput out);
  void FinishPrefillOnly(Sequence* seq);
  void Fail(Sequence* seq, Status status);
  void CancelAll();
  // Publishes a snapshot of the loop-thread state for stats() (any thread).
  void PublishStats() EXCLUDES(mu_);

  std::unique_ptr<Transformer> model_;
  const Tokenizer* tokenizer_;
  std::unique_ptr<KvCache> cache_;                     // rank 0's
  std::vector<std::unique_ptr<KvCache>> rank_caches_;  // ranks 1.. (TP > 1)
  std::unique_ptr<RankWorkers> workers_;               // after the caches: stops first
  std::unique_ptr<Drafter> drafter_;                   // null without speculation
  PagePool pool_;
  PrefixCache prefix_cache_;
  Scheduler scheduler_;
  SeedSource seeds_;
  EngineOptions options_;
  std::vector<int32_t> eos_ids_;
  StepObserver* observer_ = nullptr;
  std::unique_ptr<LayerCounter> layer_counter_;
  std::atomic<uint64_t> layer_progress_{0};
  std::atomic<uint64_t> steps_{0};

  // Loop-thread state.
  std::map<std::string, std::unique_ptr<Sequence>> live_;  // every unfinished request
  std::map<std::string, std::unique_ptr<Sequence>> held_;  // finished, pages still held
  std::vector<Sequence*> remote_pending_;                  // kRemotePrefill waiting for pages
  std::vector<float> logits_;
  std::vector<float> hidden_;       // the forward pass's hidden rows (MTP KV layer)
  std::vector<int64_t> hidden_at_;  // per plan entry: its first row in hidden_, or -1
  SpecDecodeStats spec_;
  std::vector<float> verify_scratch_;

  mutable Mutex mu_;
  CondVar cv_;
  std::vector<Command> inbox_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  EngineStats stats_ GUARDED_BY(mu_);  // a snapshot published after each step
  std::thread loop_;
};

}  // namespace pdserve
