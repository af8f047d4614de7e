// Tensor-parallel rank workers (DESIGN.md §1). With TP N a node computes rank 0 in its own
// process (the engine's Transformer, on the loop thread) and ranks 1..N-1 in worker processes
// (`pdserve rank-worker`, exec'd: OpenMP is not fork-safe). The node creates every rank's KV
// cache (memfd) and one shared-memory group (engine/shm_tp_group.h); a worker inherits its
// cache and the group by fd, so the node's main process maps all ranks' caches and one
// messenger registers them all with the fabric. Before each forward pass the leader publishes
// the step's chunks; then all ranks run Forward together, gathering through the group.
//
// RankWorkers is the leader's side: Start/Publish/group on the engine's loop thread (Start on
// a thread that outlives the workers: they die with it, PR_SET_PDEATHSIG); a watcher thread of
// its own reaps the workers and reports one that exits. RunRankWorker is the worker's loop.
//
// Failures (docs/architecture.md, "Rank failures"): a worker that exits, or a rank that waits
// in a collective longer than collective_timeout, fails the group. The watcher then reports the
// group's first failure reason through on_failure, once, and kills the workers still running
// after kFailureGrace. Workers start with SIGINT and SIGTERM ignored: a Ctrl-C reaching the whole
// process group stops the node, which then shuts its workers down in order.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "engine/shm_tp_group.h"
#include "kv/kv_cache.h"
#include "model/transformer.h"

namespace pdserve {

enum class StepKind : uint8_t { kForward = 0, kMtpDraft = 1 };

struct TensorParallelOptions {
  int size = 1;  // ranks; 1 = no workers
  // argv of rank `rank`'s worker, which inherits the group's region as `group_fd` and its KV
  // cache as `kv_fd` (numbers valid in the worker).
  std::function<std::vector<std::string>(int rank, int group_fd, int kv_fd)> worker_argv;
  std::vector<std::pair<std::string, std::string>> worker_env;
  Duration start_timeout = std::chrono::seconds(300);       // a worker loads its weights
  Duration collective_timeout = std::chrono::seconds(120);  // longest wait inside a forward pass
  // Called once, from the watcher thread, when a worker exits or the group fails, with the
  // group's first failure reason (e.g. "rank 1 (pid 123) killed by signal 9", or which rank
  // timed out waiting for which): from then on the node computes nothing (every forward pass
  // fails at once).
  std::function<void(const Status&)> on_failure;
};

class RankWorkers {
 public:
  // How long workers may take to leave on their own once the group failed (each sees the
  // failure at its next wait) before they are killed; and after an orderly Shutdown.
  static constexpr Duration kFailureGrace = std::chrono::milliseconds(500);
  static constexpr Duration kShutdownGrace = std::chrono::seconds(5);

  // Starts ranks 1..size-1; caches[r - 1] is rank r's cache. Returns once every worker has
  // loaded with `fingerprint` (Transformer::Fingerprint); a worker that exits or disagrees
  // first, or start_timeout, is an error naming it (the workers are then gone too).
  static Result<std::unique_ptr<RankWorkers>> Start(const TensorParallelOptions& options,
                                                    std::span<KvCache* const> caches,
                                                    uint64_t fingerprint);
  // Asks the workers to exit (Shutdown), waits kShutdownGrace (kFailureGrace once the group
  // failed), then kills those still running.
  ~RankWorkers();
  RankWorkers(const RankWorkers&) = delete;
  RankWorkers& operator=(const RankWorkers&) = delete;

  TpGroup* group() { return group_.get(); }
  // Hands a step's chunks to every worker, before the leader's own pass over them (an MTP
  // drafting pass carries its rows' hidden states).
  Status Publish(std::span<const SequenceChunk> chunks, StepKind kind = StepKind::kForward,
                 std::span<const float> hidden = {});

 private:
  RankWorkers(const TensorParallelOptions& options, std::unique_ptr<ShmTpGroup> group);
  // Start's wait for every worker to load; on an error the group has failed with it.
  Status AwaitLoaded(uint64_t fingerprint);
  void Watch();
  // Fails the group if a worker has exited, naming it and how, then `when` (the group keeps
  // its first reason).
  void FailOnWorkerExit(std::string_view when);
  // Waits up to `grace` for the workers to exit, then kills (and reaps) those still running.
  void StopWorkers(Duration grace);

  TensorParallelOptions options_;
  std::unique_ptr<ShmTpGroup> group_;
  std::vector<Subprocess> workers_;  // rank r at r - 1; the watcher thread's once it runs
  std::atomic<bool> stop_{false};
  std::thread watcher_;
};

// A step's chunks as bytes of the one codec (common/byte_codec.h), and back. The decoded chunks
// point into the DecodedStep. A step is a forward pass (Transformer::Forward) or an MTP drafting
// pass (Transformer::ForwardMtp, with its rows' hidden states).
std::string EncodeStep(std::span<const SequenceChunk> chunks, StepKind kind = StepKind::kForward,
                       std::span<const float> hidden = {});
struct DecodedStep {
  StepKind kind = StepKind::kForward;
  std::vector<int32_t> tokens;  // each chunk's tokens, then its MTP tokens
  std::vector<PageId> pages;
  std::vector<float> hidden;  // kMtpDraft: [rows][hidden_size]
  std::vector<SequenceChunk> chunks;
};
// Errors (ProtocolError): truncated or inconsistent bytes, a negative token or page id.
Result<DecodedStep> DecodeStep(std::string_view bytes);

// A worker's life after loading: MarkReady(fingerprint), then the leader's steps, each run
// through model.Forward (or ForwardMtp) on `cache`, until the leader shuts the group down (Ok) or
// the group fails (its status). A step this rank cannot run fails the group, so no rank waits for
// it.
Status RunRankWorker(Transformer& model, KvCache& cache, ShmTpGroup& group);

}  // namespace pdserve
