#include "server/request_drain.h"

#include <algorithm>
#include <utility>

namespace pdserve::server {
namespace {

// Handlers wake at least this often to notice shutdown and idle deadlines.
constexpr auto kPollSlice = std::chrono::milliseconds(50);

double SecondsBetween(TimePoint from, TimePoint to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

void LiveRequests::Add(const std::string& id) {
  MutexLock lock(&mu_);
  ids_.insert(id);
  waiting_.fetch_add(1);
}

void LiveRequests::Remove(const std::string& id, bool still_waiting) {
  if (still_waiting) waiting_.fetch_sub(1);
  MutexLock lock(&mu_);
  ids_.erase(id);
}

std::vector<std::string> LiveRequests::Ids() const {
  MutexLock lock(&mu_);
  return {ids_.begin(), ids_.end()};
}

RequestDrain::RequestDrain(const DrainContext& node, std::string id)
    : node_(node), id_(std::move(id)) {
  node_.live->Add(id_);
}

RequestDrain::~RequestDrain() {
  if (submitted_ && !finished_) node_.engine->Cancel(id_);
  node_.live->Remove(id_, /*still_waiting=*/!first_output_);
}

Status RequestDrain::Submit(EngineRequest request,
                            const std::function<Status(EngineRequest)>& via) {
  request.id = id_;
  // The callback runs on the engine thread: it only queues. The channel is shared, so a late
  // callback after this drain is gone is harmless.
  request.on_output = [channel = channel_](const RequestOutput& out) { channel->Push(out); };
  PD_RETURN_IF_ERROR(via ? via(std::move(request)) : node_.engine->Submit(std::move(request)));
  submitted_ = true;
  idle_ = Deadline::After(node_.idle_timeout);
  return Status::Ok();
}

RequestDrain::Step RequestDrain::Next(std::vector<RequestOutput>* outputs) {
  const Deadline slice(std::min(idle_.at(), Clock::now() + kPollSlice));
  if (!channel_->Wait(outputs, slice)) {
    // A request that slipped past Stop()'s sweep is cancelled here (Cancel is idempotent).
    if (node_.stopping->load()) node_.engine->Cancel(id_);
    return idle_.Passed() ? Step::kTimedOut : Step::kNothingYet;
  }
  idle_ = Deadline::After(node_.idle_timeout);
  for (const RequestOutput& out : *outputs) {
    Record(out);
    if (!out.tokens.empty() && !first_output_) {
      first_output_ = true;
      node_.live->FirstOutput();
    }
    if (out.finished) finished_ = true;
  }
  return Step::kOutputs;
}

void RequestDrain::Record(const RequestOutput& out) {
  ServerMetrics& metrics = *node_.metrics;
  const TimePoint now = Clock::now();
  const int n = static_cast<int>(out.tokens.size());
  if (n > 0) {
    if (!first_output_) {
      metrics.ObserveTimeToFirstToken(SecondsBetween(arrival_, now));
      metrics.AddPromptTokens(out.prompt_tokens);
      // Tokens that arrive together with the first had no gap between them.
      for (int i = 1; i < n; ++i) metrics.ObserveInterTokenLatency(0.0);
    } else {
      const double gap = SecondsBetween(last_token_, now) / n;
      for (int i = 0; i < n; ++i) metrics.ObserveInterTokenLatency(gap);
    }
    metrics.AddGenerationTokens(n);
    last_token_ = now;
  }
  if (out.finished) {
    metrics.ObserveE2eLatency(SecondsBetween(arrival_, now));
    if (out.finish_reason == FinishReason::kStop || out.finish_reason == FinishReason::kLength) {
      metrics.RequestSucceeded(FinishReasonName(out.finish_reason));
    }
  }
}

std::optional<http::ApiError> FinishError(const RequestOutput& out) {
  if (out.finish_reason == FinishReason::kError) return http::ApiError::FromStatus(out.status);
  if (out.finish_reason == FinishReason::kCancelled) {
    return http::ApiError::Unavailable("the request was cancelled (server stopping)", "cancelled");
  }
  return std::nullopt;
}

http::ApiError IdleTimeoutError() {
  return http::ApiError::Timeout("no output within the request timeout");
}

}  // namespace pdserve::server
