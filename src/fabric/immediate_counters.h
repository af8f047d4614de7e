// Receiver-side counters of 32-bit immediates: "tell me once `count` writes carrying `imm`
// have landed, or when `deadline` passes". Pure bookkeeping, no fabric: the engine feeds
// arrivals in and runs the callbacks this class hands back.
//
// Semantics:
//  - An arrival with no expectation is remembered (up to a bound on distinct values) and is
//    taken by a later Expect for the same value. Each arrival is counted by one expectation.
//  - An expectation fires exactly once: when its count is reached (Ok), when its deadline
//    passes (DeadlineExceeded), or never if removed first. Surplus early arrivals stay
//    remembered for the next expectation of that value.
//
// Thread-safe: every method may be called from any thread. Callbacks are never run under the
// internal lock; the methods return them as `Fired` records for the caller to run.
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"

namespace pdserve::fabric {

class ImmediateCounters {
 public:
  // `status` is Ok or DeadlineExceeded (or Cancelled at engine shutdown); `arrived` is the
  // number of arrivals counted for this expectation when it fired.
  using Callback = std::function<void(const Status& status, uint32_t arrived)>;
  struct Fired {
    Callback callback;
    Status status;
    uint32_t arrived = 0;
    void Run() {
      if (callback) callback(status, arrived);
    }
  };
  enum class Arrival : uint8_t {
    kCounted,     // an expectation took it (it may have fired: see `fired`)
    kRemembered,  // no expectation; remembered for a later one
    kUnmatched,   // no expectation and remember == false (or the bound is reached)
  };

  explicit ImmediateCounters(size_t max_early_values) : max_early_values_(max_early_values) {}
  ImmediateCounters(const ImmediateCounters&) = delete;
  ImmediateCounters& operator=(const ImmediateCounters&) = delete;

  // Registers an expectation. AlreadyExists if one is registered for `imm`. If early arrivals
  // already reach `count` (or count is 0) it is ready at once and comes out of the next
  // TakeDue. Never runs `callback` itself.
  Status Expect(uint32_t imm, uint32_t count, Deadline deadline, Callback callback);

  // Records one arrival of `imm`. When it completes an expectation, that expectation is moved
  // into *fired. With remember == false an arrival nobody expects is not recorded.
  Arrival Arrive(uint32_t imm, bool remember, std::vector<Fired>* fired);

  // Removes the expectation and the early arrivals of `imm` without running any callback.
  // Returns whether there was anything to remove.
  bool Remove(uint32_t imm);

  // Moves into *fired every expectation that became ready in Expect or whose deadline is at
  // or before `now`. Returns the earliest remaining deadline (TimePoint::max() if none).
  TimePoint TakeDue(TimePoint now, std::vector<Fired>* fired);

  // Moves every expectation into *fired with `status` (engine shutdown).
  void CancelAll(const Status& status, std::vector<Fired>* fired);

  // Early arrivals currently remembered for `imm` (tests and diagnostics).
  uint32_t EarlyArrivals(uint32_t imm) const;
  size_t PendingExpectations() const;

 private:
  struct Expectation {
    uint32_t count = 0;
    uint32_t arrived = 0;
    Deadline deadline = Deadline::Never();
    Callback callback;
  };

  mutable Mutex mu_;
  const size_t max_early_values_;
  std::unordered_map<uint32_t, Expectation> expectations_ GUARDED_BY(mu_);
  std::unordered_map<uint32_t, uint32_t> early_ GUARDED_BY(mu_);
  std::vector<Fired> ready_ GUARDED_BY(mu_);
};

}  // namespace pdserve::fabric
