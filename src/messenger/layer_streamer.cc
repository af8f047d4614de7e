#include "messenger/layer_streamer.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/logging.h"
#include "messenger/paged_writes.h"

namespace pdserve::messenger {

LayerStreamer::LayerStreamer(fabric::TransferEngine* fabric, int page_tokens, int num_layers,
                             int source_ranks, EventLog* events,
                             std::function<void(const std::shared_ptr<StreamJob>&)> on_job_changed)
    : fabric_(fabric),
      page_tokens_(page_tokens),
      num_layers_(num_layers),
      events_(events),
      on_job_changed_(std::move(on_job_changed)),
      rank_writes_sent_(static_cast<size_t>(source_ranks)),
      rank_bytes_sent_(static_cast<size_t>(source_ranks)) {}

std::vector<int64_t> LayerStreamer::writes_sent_by_rank() const {
  std::vector<int64_t> out;
  for (const auto& n : rank_writes_sent_) out.push_back(n.load(std::memory_order_relaxed));
  return out;
}

std::vector<int64_t> LayerStreamer::bytes_sent_by_rank() const {
  std::vector<int64_t> out;
  for (const auto& n : rank_bytes_sent_) out.push_back(n.load(std::memory_order_relaxed));
  return out;
}

LayerStreamer::~LayerStreamer() { Stop(); }

void LayerStreamer::Start() {
  thread_ = std::thread([this] { Run(); });
}

void LayerStreamer::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void LayerStreamer::Add(const std::shared_ptr<StreamJob>& job) {
  MutexLock lock(&mu_);
  jobs_[job->engine_id] = job;
}

int64_t LayerStreamer::Remove(const std::shared_ptr<StreamJob>& job) {
  MutexLock lock(&mu_);
  job->stopped = true;
  auto it = jobs_.find(job->engine_id);
  if (it != jobs_.end() && it->second == job) jobs_.erase(it);
  return job->writes_posted;
}

void LayerStreamer::StopJob(const std::shared_ptr<StreamJob>& job) {
  MutexLock lock(&mu_);
  job->stopped = true;
}

LayerStreamer::JobProgress LayerStreamer::Progress(const StreamJob& job) const {
  MutexLock lock(&mu_);
  return {job.pages_streamed, job.writes_posted, job.stopped};
}

void LayerStreamer::OnStepScheduled(uint64_t step, std::span<const AnnouncedChunk> chunks) {
  StepPlan plan;
  plan.step = step;
  {
    MutexLock lock(&mu_);
    for (const AnnouncedChunk& c : chunks) {
      auto it = jobs_.find(*c.request_id);
      if (it == jobs_.end() || it->second->stopped) continue;
      StreamJob& job = *it->second;
      const int64_t end = c.start + c.count;
      // Without streaming nothing is final before the last chunk.
      const int total_pages = job.first_page + static_cast<int>(job.dst_pages.size());
      const int final_pages = end >= job.num_tokens ? total_pages
                              : job.streaming       ? static_cast<int>(end / page_tokens_)
                                                    : job.first_page + job.pages_announced;
      Segment seg{it->second, {}};
      // Pages before first_page are the decode node's own: never written. A chunk that ends
      // before them (this node recomputes what its cache lacks) announces nothing.
      for (int i = job.first_page + job.pages_announced; i < final_pages; ++i) {
        if (i >= static_cast<int>(c.pages.size())) break;  // cannot happen: pages cover the chunk
        seg.pages.push_back({c.pages[i], job.dst_pages[i - job.first_page]});
      }
      job.pages_announced = std::max(job.pages_announced, final_pages - job.first_page);
      if (seg.pages.empty()) continue;
      plan.hold_to_end |= !job.streaming;
      plan.segments.push_back(std::move(seg));
    }
    if (!plan.segments.empty()) plans_.push_back(std::move(plan));
  }
  events_->Record(EventKind::kStepScheduled, step);
}

void LayerStreamer::OnLayerDone(uint64_t step, int layer) {
  {
    MutexLock lock(&mu_);
    done_step_ = step;
    done_layer_ = layer;
  }
  events_->Record(EventKind::kLayerDone, step, layer);
  cv_.NotifyOne();
}

int LayerStreamer::LastDoneLayer(uint64_t step) const {
  if (done_step_ > step) return num_layers_ - 1;
  if (done_step_ == step) return done_layer_;
  return -1;
}

void LayerStreamer::Run() {
  std::vector<std::shared_ptr<StreamJob>> finished;
  while (PostReadyLayers(&finished)) {
    for (const auto& job : finished) on_job_changed_(job);
    finished.clear();
  }
}

int LayerStreamer::PostableLayer(const StepPlan& plan) const {
  const int done = LastDoneLayer(plan.step);
  return plan.hold_to_end && done < num_layers_ - 1 ? -1 : done;
}

bool LayerStreamer::LayerReady() const {
  return !plans_.empty() && PostableLayer(plans_.front()) >= plans_.front().next_layer;
}

bool LayerStreamer::PostReadyLayers(std::vector<std::shared_ptr<StreamJob>>* finished) {
  MutexLock lock(&mu_);
  // The timeout only bounds a missed notification; OnLayerDone wakes the thread.
  const TimePoint deadline = Clock::now() + std::chrono::milliseconds(50);
  while (!stop_ && !LayerReady()) {
    if (cv_.WaitUntil(&mu_, deadline) == std::cv_status::timeout) break;
  }
  while (!stop_ && !plans_.empty()) {
    StepPlan& plan = plans_.front();
    const int done = PostableLayer(plan);
    for (; plan.next_layer <= done; ++plan.next_layer) PostLayer(plan, plan.next_layer);
    if (plan.next_layer < num_layers_) break;
    for (Segment& seg : plan.segments) {
      seg.job->pages_streamed += static_cast<int>(seg.pages.size());
      finished->push_back(seg.job);
    }
    events_->Record(EventKind::kStepFinished, plan.step);
    plans_.pop_front();
    return true;  // the caller tells the finished jobs, then comes back for the next plan
  }
  return !stop_;
}

void LayerStreamer::PostLayer(StepPlan& plan, int layer) {
  for (Segment& seg : plan.segments) {
    const std::shared_ptr<StreamJob>& job = seg.job;
    if (job->stopped) continue;
    scratch_.clear();
    Status s = job->plan->AppendLayerWrites(seg.pages, layer, job->seed, &scratch_);
    int64_t posted = 0;
    if (s.ok()) s = PostSegmentWrites(seg, &posted);
    if (posted > 0) {
      events_->Record(EventKind::kWritesPosted, plan.step, layer, job->transfer_id, posted);
    }
    if (!s.ok()) {
      PD_LOG_WARN("transfer {}: posting a KV write failed: {}", job->transfer_id, s.ToString());
      job->stopped = true;
      {
        MutexLock error_lock(&job->error_mu);
        if (job->first_error.ok()) job->first_error = s;
      }
      job->write_failed.store(true);
      // on_job_changed_ only posts to the control loop; safe under mu_.
      on_job_changed_(job);
    }
  }
}

Status LayerStreamer::PostSegmentWrites(const Segment& seg, int64_t* posted) {
  const std::shared_ptr<StreamJob>& job = seg.job;
  // One post and one completion per column for the layer's pages instead of one per page;
  // the fabric still delivers the immediate with every page, which is what D counts.
  PD_ASSIGN_OR_RETURN(std::vector<PagedColumn> columns,
                      GroupPagedWrites(*job->plan, seg.pages, scratch_));
  const size_t n = seg.pages.size();
  src_pages_.clear();
  dst_pages_.clear();
  for (const PagePair& p : seg.pages) {
    src_pages_.push_back(static_cast<uint32_t>(p.src));
    dst_pages_.push_back(static_cast<uint32_t>(p.dst));
  }
  for (const PagedColumn& c : columns) {
    // The plan's ranks index this node's regions and the peer's descriptors, both checked
    // against the plan's sides at the handshake; a mismatch here is a bug, not a peer's fault.
    if (static_cast<size_t>(c.src_rank) >= job->src->size() ||
        static_cast<size_t>(c.dst_rank) >= job->dst->size()) {
      return Status::Internal(fmt::format(
          "write from rank {} to rank {}, but {} source regions and {} destination descriptors",
          c.src_rank, c.dst_rank, job->src->size(), job->dst->size()));
    }
    fabric::PagedWrite write{.src_region = (*job->src)[c.src_rank],
                             .src_offset = c.src_base,
                             .src_stride = c.src_stride,
                             .src_pages = src_pages_,
                             .peer = job->peer,
                             .dst = &(*job->dst)[c.dst_rank],
                             .dst_offset = c.dst_base,
                             .dst_stride = c.dst_stride,
                             .dst_pages = dst_pages_,
                             .length = c.length,
                             .immediate = job->immediate,
                             .deadline = job->deadline};
    const auto writes = static_cast<int64_t>(n);
    job->writes_posted += writes;
    Status s = fabric_->PostPagedWrite(
        write,
        fabric::Completion{
            .callback = [this, job, src_rank = c.src_rank, writes, bytes = c.length * n](
                            const Status& st) { OnWriteDone(job, src_rank, writes, bytes, st); },
            .counter = nullptr});
    if (!s.ok()) {
      job->writes_posted -= writes;
      return s;
    }
    *posted += writes;
  }
  return Status::Ok();
}

void LayerStreamer::OnWriteDone(const std::shared_ptr<StreamJob>& job, int src_rank, int64_t writes,
                                uint64_t bytes, const Status& status) {
  if (status.ok()) {
    writes_sent_.fetch_add(writes, std::memory_order_relaxed);
    bytes_sent_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    // A plan's source ranks are this node's (checked when the write was posted).
    if (static_cast<size_t>(src_rank) < rank_writes_sent_.size()) {
      rank_writes_sent_[src_rank].fetch_add(writes, std::memory_order_relaxed);
      rank_bytes_sent_[src_rank].fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    }
  } else {
    {
      MutexLock error_lock(&job->error_mu);
      if (job->first_error.ok()) job->first_error = status;
    }
    job->write_failed.store(true);
  }
  job->writes_completed.fetch_add(writes, std::memory_order_acq_rel);
  on_job_changed_(job);
}

}  // namespace pdserve::messenger
