// Monotonic clock and deadlines. Every wait in pdserve has a Deadline.
// Plain values: safe to copy between threads.
#pragma once

#include <chrono>
#include <cstdint>

namespace pdserve {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;
using Duration = Clock::duration;

class Deadline {
 public:
  static Deadline After(Duration d) { return Deadline(Clock::now() + d); }
  static Deadline AfterMs(int64_t ms) { return After(std::chrono::milliseconds(ms)); }
  // A deadline that never passes; only for waits that another mechanism bounds.
  static Deadline Never() { return Deadline(TimePoint::max()); }
  explicit Deadline(TimePoint at) : at_(at) {}

  TimePoint at() const { return at_; }
  bool Passed() const { return Clock::now() >= at_; }
  Duration Remaining() const {
    auto now = Clock::now();
    return now >= at_ ? Duration::zero() : at_ - now;
  }

 private:
  TimePoint at_;
};

inline double SecondsSince(TimePoint t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace pdserve
