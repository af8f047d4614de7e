// LayerStreamer: the prefill side's layer-by-layer KV streaming (DESIGN.md §3.3). It is the
// engine's StepObserver: before each forward pass it learns which chunks run and decides which
// pages become final in that step (a page is final when all its token slots are written, or at
// the request's last chunk); as layers finish, its own thread posts those pages' writes of each
// finished layer, with the request's immediate, through the TransferPlan. A job with streaming
// off (the benchmark's baseline) is posted whole only after its last forward pass ended.
//
// Threads: OnStepScheduled / OnLayerDone run on the engine loop thread and only record and
// notify. The streamer thread posts writes. Write completions run on fabric progress threads
// and only touch atomics, then call `on_job_changed` (which must not block; the prefill
// messenger posts to its control loop). Add/Stop/PostedWrites may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "engine/engine.h"
#include "fabric/transfer_engine.h"
#include "kv/transfer_plan.h"
#include "messenger/event_log.h"

namespace pdserve::messenger {

// One PrefillRequest being served. Fields above the line are fixed at creation.
struct StreamJob {
  std::string engine_id;
  uint64_t transfer_id = 0;
  uint64_t peer_instance = 0;
  fabric::PeerId peer = fabric::kUnknownPeer;
  // This node's cache regions the writes read, one per source rank of `plan` (rank order).
  std::shared_ptr<const std::vector<fabric::RegionId>> src;
  // The decode node's cache regions, one per destination rank of `plan` (rank order).
  std::shared_ptr<const std::vector<fabric::MemoryDescriptor>> dst;
  std::shared_ptr<const TransferPlan> plan;
  uint64_t seed = 0;
  uint32_t immediate = 0;
  int64_t num_tokens = 0;  // tokens prefilled here: the prompt's [0, n-1)
  // Off: every page waits for the last chunk's forward pass to end, then all layers are posted.
  bool streaming = true;
  // The decode node holds the prompt's first `first_page` pages already (its prefix cache):
  // page first_page + i goes to dst_pages[i].
  int first_page = 0;
  std::vector<PageId> dst_pages;
  Deadline deadline = Deadline::Never();
  // ---- Streamer state, guarded by LayerStreamer::mu_.
  int pages_announced = 0;  // destination pages handed to a step plan
  int pages_streamed = 0;   // destination pages whose every layer has been posted
  int64_t writes_posted = 0;
  bool stopped = false;  // cancelled or failed: post nothing more
  // ---- Set from completions (any thread).
  std::atomic<int64_t> writes_completed{0};
  std::atomic<bool> write_failed{false};
  Mutex error_mu;
  Status first_error GUARDED_BY(error_mu);
};

class LayerStreamer : public StepObserver {
 public:
  // A job's plan source rank r reads the job's region src[r]; this node has `source_ranks`
  // ranks (its TP size), which the per-rank counters count.
  LayerStreamer(fabric::TransferEngine* fabric, int page_tokens, int num_layers, int source_ranks,
                EventLog* events,
                std::function<void(const std::shared_ptr<StreamJob>&)> on_job_changed);
  ~LayerStreamer() override;  // Stop()
  void Start();
  void Stop();

  void Add(const std::shared_ptr<StreamJob>& job);
  // Stops posting for the job and forgets it. Returns the writes posted so far.
  int64_t Remove(const std::shared_ptr<StreamJob>& job);
  // Stops posting for the job (it stays known until Remove).
  void StopJob(const std::shared_ptr<StreamJob>& job);
  // Snapshot of the streamer-guarded counters.
  struct JobProgress {
    int pages_streamed = 0;
    int64_t writes_posted = 0;
    bool stopped = false;
  };
  JobProgress Progress(const StreamJob& job) const;
  // Writes (and their bytes) that completed successfully, over the streamer's life.
  int64_t writes_sent() const { return writes_sent_.load(std::memory_order_relaxed); }
  int64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  // The same by the source rank whose cache each write read ([source_ranks]): with replicated KV
  // (an MLA latent, fewer KV heads than ranks) which rank sends is the plan's per-request choice.
  std::vector<int64_t> writes_sent_by_rank() const;
  std::vector<int64_t> bytes_sent_by_rank() const;

  void OnStepScheduled(uint64_t step, std::span<const AnnouncedChunk> chunks) override;
  void OnLayerDone(uint64_t step, int layer) override;

 private:
  struct Segment {
    std::shared_ptr<StreamJob> job;
    std::vector<PagePair> pages;
  };
  struct StepPlan {
    uint64_t step = 0;
    std::vector<Segment> segments;
    int next_layer = 0;
    bool hold_to_end = false;  // a segment's job does not stream: post after the last layer
  };
  void Run() EXCLUDES(mu_);
  // Waits (briefly) for a layer to post, posts every ready layer, and hands back the jobs of a
  // step plan that finished, to be told outside the lock. False once stopped.
  bool PostReadyLayers(std::vector<std::shared_ptr<StreamJob>>* finished) EXCLUDES(mu_);
  // True if the oldest step plan has a layer done but not yet posted.
  bool LayerReady() const REQUIRES(mu_);
  // Highest layer of `step` known done (-1: none).
  int LastDoneLayer(uint64_t step) const REQUIRES(mu_);
  // Highest layer of `plan` that may be posted now (-1: none).
  int PostableLayer(const StepPlan& plan) const REQUIRES(mu_);
  // Posts layer `layer` of every segment of `plan`.
  void PostLayer(StepPlan& plan, int layer) REQUIRES(mu_);
  // Posts scratch_ (the writes of one layer of `seg`'s pages) as paged writes, each column
  // (GroupPagedWrites) from its source rank's region to its destination rank's descriptor;
  // adds the writes posted to *posted.
  Status PostSegmentWrites(const Segment& seg, int64_t* posted) REQUIRES(mu_);
  // A paged write of `writes` pages (`bytes` in all) from source rank `src_rank` completed.
  void OnWriteDone(const std::shared_ptr<StreamJob>& job, int src_rank, int64_t writes,
                   uint64_t bytes, const Status& status);

  fabric::TransferEngine* const fabric_;
  const int page_tokens_;
  const int num_layers_;
  EventLog* const events_;
  const std::function<void(const std::shared_ptr<StreamJob>&)> on_job_changed_;

  mutable Mutex mu_;
  CondVar cv_;
  std::map<std::string, std::shared_ptr<StreamJob>> jobs_ GUARDED_BY(mu_);  // by engine id
  std::deque<StepPlan> plans_ GUARDED_BY(mu_);
  uint64_t done_step_ GUARDED_BY(mu_) = 0;
  int done_layer_ GUARDED_BY(mu_) = -1;
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<KvWrite> scratch_ GUARDED_BY(mu_);  // streamer thread
  std::vector<uint32_t> src_pages_ GUARDED_BY(mu_);
  std::vector<uint32_t> dst_pages_ GUARDED_BY(mu_);
  std::atomic<int64_t> writes_sent_{0};
  std::atomic<int64_t> bytes_sent_{0};
  std::vector<std::atomic<int64_t>> rank_writes_sent_;  // [source_ranks]
  std::vector<std::atomic<int64_t>> rank_bytes_sent_;
  std::thread thread_;
};

}  // namespace pdserve::messenger
