#include "engine/rank_workers.h"

#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "common/byte_codec.h"
#include "common/check.h"
#include "common/logging.h"

namespace pdserve {

namespace {

// A message: its kind (u8: StepKind), the chunk count (u32), per chunk a header — start (u64),
// token count (u32), page count (u32), logit rows (u8: 0 = none, at most the token count), MTP
// entries (u32, at most the token count), hidden rows (u32, at most the token count) — then per
// chunk its tokens, pages and MTP tokens (i32 each), then for an MTP pass its rows' hidden
// states (f32 in the host's order: the leader and its workers share one machine).
constexpr size_t kChunkHeaderBytes = 8 + 4 + 4 + 1 + 4 + 4;

struct ChunkHeader {
  int64_t start = 0;
  uint32_t tokens = 0;
  uint32_t pages = 0;
  uint8_t logit_rows = 0;
  uint32_t mtp_tokens = 0;
  uint32_t hidden_rows = 0;
};

Status ReadStep(ByteReader& r, DecodedStep* step) {
  uint8_t kind = 0;
  PD_RETURN_IF_ERROR(r.U8("step kind", &kind));
  if (kind > static_cast<uint8_t>(StepKind::kMtpDraft)) {
    return Status::ProtocolError(fmt::format("unknown step kind {}", kind));
  }
  step->kind = static_cast<StepKind>(kind);
  uint32_t n = 0;
  PD_RETURN_IF_ERROR(
      r.Count("chunk count", std::numeric_limits<uint32_t>::max(), kChunkHeaderBytes, &n));
  std::vector<ChunkHeader> headers(n);
  uint64_t tokens = 0, pages = 0, mtp_tokens = 0;
  for (ChunkHeader& h : headers) {
    uint64_t start = 0;
    PD_RETURN_IF_ERROR(r.U64("chunk start", &start));
    PD_RETURN_IF_ERROR(r.U32("chunk tokens", &h.tokens));
    PD_RETURN_IF_ERROR(r.U32("chunk pages", &h.pages));
    PD_RETURN_IF_ERROR(r.U8("chunk logit rows", &h.logit_rows));
    PD_RETURN_IF_ERROR(r.U32("chunk MTP entries", &h.mtp_tokens));
    PD_RETURN_IF_ERROR(r.U32("chunk hidden rows", &h.hidden_rows));
    if (h.logit_rows > h.tokens || h.mtp_tokens > h.tokens || h.hidden_rows > h.tokens) {
      return Status::ProtocolError(
          fmt::format("{} logit rows, {} MTP entries or {} hidden rows in a chunk of {} tokens",
                      h.logit_rows, h.mtp_tokens, h.hidden_rows, h.tokens));
    }
    h.start = static_cast<int64_t>(start);
    tokens += h.tokens;
    pages += h.pages;
    mtp_tokens += h.mtp_tokens;
  }
  // Checked before anything is allocated: lying counts cost nothing. An MTP pass carries its
  // rows' hidden states after the ids, whole rows of the one width.
  const uint64_t ids = (tokens + pages + mtp_tokens) * 4;
  const uint64_t floats = r.remaining() - std::min<uint64_t>(ids, r.remaining());
  if (ids > r.remaining() || floats % 4 != 0 ||
      (floats > 0 &&
       (step->kind != StepKind::kMtpDraft || tokens == 0 || (floats / 4) % tokens != 0))) {
    return Status::ProtocolError(
        fmt::format("{} tokens, {} pages and {} MTP tokens do not fill {} bytes", tokens, pages,
                    mtp_tokens, r.remaining()));
  }
  step->tokens.resize(tokens + mtp_tokens);
  step->pages.resize(pages);
  step->chunks.reserve(n);
  std::span<int32_t> all_tokens(step->tokens), all_pages(step->pages);
  for (const ChunkHeader& h : headers) {
    std::span<int32_t> chunk_tokens = all_tokens.first(h.tokens);
    std::span<PageId> chunk_pages = all_pages.first(h.pages);
    std::span<int32_t> chunk_mtp = all_tokens.subspan(h.tokens, h.mtp_tokens);
    PD_RETURN_IF_ERROR(r.NonNegativeI32s("chunk token ids", chunk_tokens));
    PD_RETURN_IF_ERROR(r.NonNegativeI32s("chunk page ids", chunk_pages));
    PD_RETURN_IF_ERROR(r.NonNegativeI32s("chunk MTP token ids", chunk_mtp));
    step->chunks.push_back({.tokens = chunk_tokens,
                            .start = h.start,
                            .pages = chunk_pages,
                            .want_logits = h.logit_rows > 0,
                            .logit_rows = std::max<int>(h.logit_rows, 1),
                            .mtp_tokens = chunk_mtp,
                            .hidden_rows = static_cast<int>(h.hidden_rows)});
    all_tokens = all_tokens.subspan(h.tokens + h.mtp_tokens);
    all_pages = all_pages.subspan(h.pages);
  }
  std::string_view raw;
  PD_RETURN_IF_ERROR(r.Raw("MTP hidden states", floats, &raw));
  step->hidden.resize(floats / 4);
  if (!raw.empty()) std::memcpy(step->hidden.data(), raw.data(), raw.size());
  return Status::Ok();
}

}  // namespace

std::string EncodeStep(std::span<const SequenceChunk> chunks, StepKind kind,
                       std::span<const float> hidden) {
  PD_CHECK(kind == StepKind::kMtpDraft || hidden.empty());
  ByteWriter w;
  w.U8(static_cast<uint8_t>(kind));
  w.U32(static_cast<uint32_t>(chunks.size()));
  for (const SequenceChunk& c : chunks) {
    w.U64(static_cast<uint64_t>(c.start));
    w.U32(static_cast<uint32_t>(c.tokens.size()));
    w.U32(static_cast<uint32_t>(c.pages.size()));
    PD_CHECK(c.logit_rows >= 1 && c.logit_rows <= 255);  // the engine drafts at most 16
    w.U8(c.want_logits ? static_cast<uint8_t>(c.logit_rows) : 0);
    w.U32(static_cast<uint32_t>(c.mtp_tokens.size()));
    w.U32(static_cast<uint32_t>(c.hidden_rows));
  }
  for (const SequenceChunk& c : chunks) {
    w.I32s(c.tokens);
    w.I32s(c.pages);
    w.I32s(c.mtp_tokens);
  }
  w.Raw(std::string_view(reinterpret_cast<const char*>(hidden.data()), hidden.size_bytes()));
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

Status RankWorkers::Publish(std::span<const SequenceChunk> chunks, StepKind kind,
                            std::span<const float> hidden) {
  return group_->Publish(EncodeStep(chunks, kind, hidden));
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
  std::vector<float> logits, hidden;
  for (;;) {
    Result<std::string> message = group.Receive();
    if (!message.ok()) {
      return message.status().code() == StatusCode::kCancelled ? Status::Ok() : message.status();
    }
    Result<DecodedStep> step = DecodeStep(*message);
    Status s = !step.ok() ? step.status()
               : step->kind == StepKind::kMtpDraft
                   ? model.ForwardMtp(step->chunks, step->hidden, cache, &logits, &hidden)
                   : model.Forward(step->chunks, cache, &logits);
    if (!s.ok()) {
      const std::string why = fmt::format("rank {}: {}", group.rank(), s.ToString());
      group.Fail(why);
      return Status::Internal(why);
    }
  }
}

}  // namespace pdserve
