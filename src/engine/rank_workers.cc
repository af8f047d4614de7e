#include "engine/rank_workers.h"

#include <signal.h>

#include <cstring>

#include <fmt/format.h>

#include "common/logging.h"

namespace pdserve {

namespace {

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Reads POD values off the front of `bytes`; false once it runs short.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  bool Get(T* v) {
    if (bytes_.size() < sizeof(T)) return false;
    std::memcpy(v, bytes_.data(), sizeof(T));
    bytes_.remove_prefix(sizeof(T));
    return true;
  }
  template <typename T>
  bool GetArray(T* out, size_t n) {
    if (bytes_.size() / sizeof(T) < n) return false;
    std::memcpy(out, bytes_.data(), n * sizeof(T));
    bytes_.remove_prefix(n * sizeof(T));
    return true;
  }
  bool empty() const { return bytes_.empty(); }

 private:
  std::string_view bytes_;
};

struct ChunkHeader {
  int64_t start;
  uint32_t tokens;
  uint32_t pages;
  uint32_t want_logits;
};

}  // namespace

std::string EncodeStep(std::span<const SequenceChunk> chunks) {
  std::string out;
  Put(&out, static_cast<uint32_t>(chunks.size()));
  for (const SequenceChunk& c : chunks) {
    Put(&out, ChunkHeader{c.start, static_cast<uint32_t>(c.tokens.size()),
                          static_cast<uint32_t>(c.pages.size()), c.want_logits ? 1u : 0u});
  }
  for (const SequenceChunk& c : chunks) {
    out.append(reinterpret_cast<const char*>(c.tokens.data()), c.tokens.size_bytes());
    out.append(reinterpret_cast<const char*>(c.pages.data()), c.pages.size_bytes());
  }
  return out;
}

Result<DecodedStep> DecodeStep(std::string_view bytes) {
  Reader r(bytes);
  uint32_t n = 0;
  if (!r.Get(&n) || n > bytes.size() / sizeof(ChunkHeader)) {
    return Status::InvalidArgument("step message: bad chunk count");
  }
  std::vector<ChunkHeader> headers(n);
  if (!r.GetArray(headers.data(), n)) return Status::InvalidArgument("step message: truncated");
  size_t tokens = 0, pages = 0;
  for (const ChunkHeader& h : headers) {
    tokens += h.tokens;
    pages += h.pages;
  }
  if (tokens + pages > bytes.size() / sizeof(int32_t)) {
    return Status::InvalidArgument("step message: counts exceed its size");
  }
  DecodedStep step;
  step.tokens.resize(tokens);
  step.pages.resize(pages);
  size_t t = 0, p = 0;
  for (const ChunkHeader& h : headers) {
    if (!r.GetArray(&step.tokens[t], h.tokens) || !r.GetArray(&step.pages[p], h.pages)) {
      return Status::InvalidArgument("step message: truncated");
    }
    step.chunks.push_back({.tokens = std::span<const int32_t>(&step.tokens[t], h.tokens),
                           .start = h.start,
                           .pages = std::span<const PageId>(&step.pages[p], h.pages),
                           .want_logits = h.want_logits != 0});
    t += h.tokens;
    p += h.pages;
  }
  if (!r.empty()) return Status::InvalidArgument("step message: trailing bytes");
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
