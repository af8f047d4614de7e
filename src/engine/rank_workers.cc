#include "engine/rank_workers.h"

#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "common/byte_codec.h"
#include "common/check.h"
#include "common/logging.h"

namespace pdserve {

namespace {

// Per chunk: start (u64), token count (u32), page count (u32), logit rows (u8: 0 = none, at
// most the token count).
constexpr size_t kChunkHeaderBytes = 8 + 4 + 4 + 1;

struct ChunkHeader {
  int64_t start = 0;
  uint32_t tokens = 0;
  uint32_t pages = 0;
  uint8_t logit_rows = 0;
};

Status ReadStep(ByteReader& r, DecodedStep* step) {
  uint32_t n = 0;
  PD_RETURN_IF_ERROR(
      r.Count("chunk count", std::numeric_limits<uint32_t>::max(), kChunkHeaderBytes, &n));
  std::vector<ChunkHeader> headers(n);
  uint64_t tokens = 0, pages = 0;
  for (ChunkHeader& h : headers) {
    uint64_t start = 0;
    PD_RETURN_IF_ERROR(r.U64("chunk start", &start));
    PD_RETURN_IF_ERROR(r.U32("chunk tokens", &h.tokens));
    PD_RETURN_IF_ERROR(r.U32("chunk pages", &h.pages));
    PD_RETURN_IF_ERROR(r.U8("chunk logit rows", &h.logit_rows));
    if (h.logit_rows > h.tokens) {
      return Status::ProtocolError(
          fmt::format("{} logit rows in a chunk of {} tokens", h.logit_rows, h.tokens));
    }
    h.start = static_cast<int64_t>(start);
    tokens += h.tokens;
    pages += h.pages;
  }
  // Checked before anything is allocated: lying counts cost nothing.
  if ((tokens + pages) * 4 != r.remaining()) {
    return Status::ProtocolError(
        fmt::format("{} tokens and {} pages do not fill {} bytes", tokens, pages, r.remaining()));
  }
  step->tokens.resize(tokens);
  step->pages.resize(pages);
  step->chunks.reserve(n);
  std::span<int32_t> all_tokens(step->tokens), all_pages(step->pages);
  for (const ChunkHeader& h : headers) {
    std::span<int32_t> chunk_tokens = all_tokens.first(h.tokens);
    std::span<PageId> chunk_pages = all_pages.first(h.pages);
    PD_RETURN_IF_ERROR(r.NonNegativeI32s("chunk token ids", chunk_tokens));
    PD_RETURN_IF_ERROR(r.NonNegativeI32s("chunk page ids", chunk_pages));
    step->chunks.push_back({.tokens = chunk_tokens,
                            .start = h.start,
                            .pages = chunk_pages,
                            .want_logits = h.logit_rows > 0,
                            .logit_rows = std::max<int>(h.logit_rows, 1)});
    all_tokens = all_tokens.subspan(h.tokens);
    all_pages = all_pages.subspan(h.pages);
  }
  return Status::Ok();
}

}  // namespace

std::string EncodeStep(std::span<const SequenceChunk> chunks) {
  ByteWriter w;
  w.U32(static_cast<uint32_t>(chunks.size()));
  for (const SequenceChunk& c : chunks) {
    w.U64(static_cast<uint64_t>(c.start));
    w.U32(static_cast<uint32_t>(c.tokens.size()));
    w.U32(static_cast<uint32_t>(c.pages.size()));
    PD_CHECK(c.logit_rows >= 1 && c.logit_rows <= 255);  // the engine drafts at most 16
    w.U8(c.want_logits ? static_cast<uint8_t>(c.logit_rows) : 0);
  }
  for (const SequenceChunk& c : chunks) {
    w.I32s(c.tokens);
    w.I32s(c.pages);
  }
  return w.Take();
}

Result<DecodedStep> DecodeStep(std::string_view bytes) {
  ByteReader r(bytes);
  DecodedStep step;
  if (Status s = ReadStep(r, &step); !s.ok()) return s.WithContext("step message");
  return step;
}

Result<std::unique_ptr<RankWorkers>> RankWorkers::Start(const TensorParallelOptions& options,
                                                        std::span<KvCache* const> caches,
                                                        uint64_t fingerprint) {
  if (options.size < 2 || static_cast<int>(caches.size()) != options.size - 1 ||
      !options.worker_argv) {
    return Status::InvalidArgument(fmt::format(
        "rank workers: TP {} needs {} worker caches and a worker command (got {} caches)",
        options.size, options.size - 1, caches.size()));
  }
  ShmTpGroupOptions group_options;
  group_options.size = options.size;
  group_options.deadline = options.collective_timeout;
  PD_ASSIGN_OR_RETURN(auto group, ShmTpGroup::Create(group_options));
  // From here an error fails the group, so that the destructor of `w` kills the workers
  // already started after the short grace.
  std::unique_ptr<RankWorkers> w(new RankWorkers(options, std::move(group)));
  for (int rank = 1; rank < options.size; ++rank) {
    KvCache* cache = caches[rank - 1];
    SubprocessOptions spawn;
    spawn.argv = options.worker_argv(rank, w->group_->fd(), cache->fd());
    spawn.env = options.worker_env;
    spawn.inherit_fds = {w->group_->fd(), cache->fd()};
    spawn.kill_with_parent = true;
    // Ctrl-C on a terminal signals the whole process group: the node stops, then shuts its
    // workers down in order; workers that died first would look like rank failures. From the
    // first instruction; rank-worker ignores them again itself (cli/rank_worker.cc says why).
    spawn.ignored_signals = {SIGINT, SIGTERM};
    Result<Subprocess> child = Subprocess::Spawn(spawn);
    if (!child.ok()) {
      Status s = child.status().WithContext(fmt::format("starting tensor-parallel rank {}", rank));
      w->group_->Fail(s.message());
      return s;
    }
    PD_LOG_INFO("tensor parallel: rank {} of {} is pid {}", rank, options.size, child->pid());
    w->workers_.push_back(std::move(*child));
  }
  PD_RETURN_IF_ERROR(w->AwaitLoaded(fingerprint));
  w->watcher_ = std::thread([raw = w.get()] { raw->Watch(); });
  return w;
}

RankWorkers::RankWorkers(const TensorParallelOptions& options, std::unique_ptr<ShmTpGroup> group)
    : options_(options), group_(std::move(group)) {}

RankWorkers::~RankWorkers() {
  stop_.store(true);
  if (watcher_.joinable()) watcher_.join();
  group_->Shutdown();
  StopWorkers(group_->failed() ? kFailureGrace : kShutdownGrace);
}

Status RankWorkers::Publish(std::span<const SequenceChunk> chunks) {
  return group_->Publish(EncodeStep(chunks));
}

Status RankWorkers::AwaitLoaded(uint64_t fingerprint) {
  // In slices, so that a worker that dies loading is reported at once.
  const Deadline deadline = Deadline::After(options_.start_timeout);
  for (;;) {
    Status ready = group_->WaitReady(
        Deadline(std::min(deadline.at(), Clock::now() + std::chrono::milliseconds(200))),
        fingerprint);
    if (ready.ok()) return Status::Ok();
    FailOnWorkerExit(" while loading");
    if (Status failed = group_->FailedStatus(); !failed.ok()) return failed;
    if (ready.code() != StatusCode::kDeadlineExceeded) {  // a rank loaded another model
      group_->Fail(ready.message());
      return ready;
    }
    if (deadline.Passed()) {
      Status late = Status::DeadlineExceeded(fmt::format(
          "tensor-parallel workers did not load within {:.0f} s: {}",
          std::chrono::duration<double>(options_.start_timeout).count(), ready.message()));
      group_->Fail(late.message());
      return late;
    }
  }
}

void RankWorkers::FailOnWorkerExit(std::string_view when) {
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (auto exit = workers_[i].TryWait(); exit.has_value()) {
      group_->Fail(
          fmt::format("rank {} (pid {}) {}{}", i + 1, workers_[i].pid(), exit->ToString(), when));
    }
  }
}

void RankWorkers::Watch() {
  while (!stop_.load()) {
    FailOnWorkerExit("");
    if (group_->failed()) {
      // The first reason, whoever gave it: a worker's exit is often a consequence (a rank
      // that timed out in a collective fails the group; the others then leave).
      if (options_.on_failure) options_.on_failure(group_->FailedStatus());
      StopWorkers(kFailureGrace);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void RankWorkers::StopWorkers(Duration grace) {
  const Deadline deadline = Deadline::After(grace);
  for (size_t i = 0; i < workers_.size(); ++i) {
    Subprocess& worker = workers_[i];
    if (!worker.running() || worker.WaitFor(deadline).ok()) continue;
    PD_LOG_WARN(
        "tensor-parallel rank {} (pid {}) still running {:.1f} s after the group {}: "
        "killing it",
        i + 1, worker.pid(), std::chrono::duration<double>(grace).count(),
        group_->failed() ? "failed" : "shut down");
    worker.Kill();
  }
}

Status RunRankWorker(Transformer& model, KvCache& cache, ShmTpGroup& group) {
  PD_RETURN_IF_ERROR(group.MarkReady(model.Fingerprint()));
  std::vector<float> logits;
  for (;;) {
    Result<std::string> message = group.Receive();
    if (!message.ok()) {
      return message.status().code() == StatusCode::kCancelled ? Status::Ok() : message.status();
    }
    Result<DecodedStep> step = DecodeStep(*message);
    Status s = step.ok() ? model.Forward(step->chunks, cache, &logits) : step.status();
    if (!s.ok()) {
      const std::string why = fmt::format("rank {}: {}", group.rank(), s.ToString());
      group.Fail(why);
      return Status::Internal(why);
    }
  }
}

}  // namespace pdserve
