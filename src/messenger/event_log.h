// EventLog: a bounded, timestamped record of what the messenger did, so tests and operators can
// see that streaming overlaps the forward pass (DESIGN.md §3.3): when a step was announced,
// when each of its layers finished, when that layer's writes were posted and completed.
// Thread-safe: Record from any thread (engine loop, streamer, progress threads); Snapshot and
// ToJson from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"

namespace pdserve::messenger {

enum class EventKind : uint8_t {
  kStepScheduled,   // the engine announced step `step` (before its forward pass)
  kLayerDone,       // layer `layer` of step `step` finished
  kWritesPosted,    // `count` writes of layer `layer` of step `step` posted for `request`
  kWritesComplete,  // every write of `request` completed locally
  kStepFinished,    // the streamer saw the last layer of step `step` done
  // Decode side (`request` is the transfer id P's events carry too):
  kPrefillSent,  // D sent the PrefillRequest of `request`; `count` prompt tokens
  kKvLanded,     // D counted the last expected write of `request` (`count` writes)
};
const char* EventKindName(EventKind kind);

struct Event {
  TimePoint at;
  EventKind kind;
  uint64_t step = 0;
  int layer = -1;
  uint64_t request = 0;
  int64_t count = 0;
};

class EventLog {
 public:
  explicit EventLog(size_t capacity = 1 << 16) : capacity_(capacity) {}
  void Record(EventKind kind, uint64_t step, int layer = -1, uint64_t request = 0,
              int64_t count = 0);
  std::vector<Event> Snapshot() const;
  // [{"t_us": microseconds since the log was made, "mono_us": CLOCK_MONOTONIC (steady_clock)
  //   in microseconds, comparable between processes of one host, "kind": ..., "step",
  //   "layer", "request", "count"}, ...], oldest first.
  std::string ToJson() const;

 private:
  const size_t capacity_;
  const TimePoint origin_ = Clock::now();
  mutable Mutex mu_;
  std::deque<Event> events_ GUARDED_BY(mu_);
};

}  // namespace pdserve::messenger
