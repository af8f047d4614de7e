#include "messenger/event_log.h"

#include <fmt/format.h>

namespace pdserve::messenger {

const char* EventKindName(EventKind kind) {
  switch (kind) {
    case EventKind::kStepScheduled:
      return "step_scheduled";
    case EventKind::kLayerDone:
      return "layer_done";
    case EventKind::kWritesPosted:
      return "writes_posted";
    case EventKind::kWritesComplete:
      return "writes_complete";
    case EventKind::kStepFinished:
      return "step_finished";
    case EventKind::kPrefillSent:
      return "prefill_sent";
    case EventKind::kKvLanded:
      return "kv_landed";
  }
  return "unknown";
}

void EventLog::Record(EventKind kind, uint64_t step, int layer, uint64_t request, int64_t count) {
  MutexLock lock(&mu_);
  if (events_.size() >= capacity_) events_.pop_front();
  events_.push_back(Event{Clock::now(), kind, step, layer, request, count});
}

std::vector<Event> EventLog::Snapshot() const {
  MutexLock lock(&mu_);
  return {events_.begin(), events_.end()};
}

std::string EventLog::ToJson() const {
  std::string out = "[";
  for (const Event& e : Snapshot()) {
    if (out.size() > 1) out += ",";
    using std::chrono::microseconds;
    const auto us = std::chrono::duration_cast<microseconds>(e.at - origin_).count();
    const auto mono = std::chrono::duration_cast<microseconds>(e.at.time_since_epoch()).count();
    out += fmt::format(
        R"({{"t_us":{},"mono_us":{},"kind":"{}","step":{},"layer":{},"request":{},"count":{}}})",
        us, mono, EventKindName(e.kind), e.step, e.layer, e.request, e.count);
  }
  return out + "]";
}

}  // namespace pdserve::messenger
