#include "fabric/immediate_counters.h"

#include <gtest/gtest.h>

namespace pdserve::fabric {
namespace {

struct Recorder {
  int calls = 0;
  Status status;
  uint32_t arrived = 0;
  ImmediateCounters::Callback Callback() {
    return [this](const Status& s, uint32_t n) {
      ++calls;
      status = s;
      arrived = n;
    };
  }
};

void RunAll(std::vector<ImmediateCounters::Fired>& fired) {
  for (auto& f : fired) f.Run();
  fired.clear();
}

TEST(ImmediateCountersTest, FiresOnceWhenCountReached) {
  ImmediateCounters counters(16);
  Recorder r;
  ASSERT_TRUE(counters.Expect(7, 3, Deadline::AfterMs(60000), r.Callback()).ok());
  std::vector<ImmediateCounters::Fired> fired;
  EXPECT_EQ(counters.Arrive(7, true, &fired), ImmediateCounters::Arrival::kCounted);
  EXPECT_EQ(counters.Arrive(7, true, &fired), ImmediateCounters::Arrival::kCounted);
  EXPECT_TRUE(fired.empty());
  EXPECT_EQ(counters.Arrive(7, true, &fired), ImmediateCounters::Arrival::kCounted);
  ASSERT_EQ(fired.size(), 1u);
  RunAll(fired);
  EXPECT_EQ(r.calls, 1);
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(r.arrived, 3u);
  // The expectation is gone: a fourth arrival is remembered, not counted again.
  EXPECT_EQ(counters.Arrive(7, true, &fired), ImmediateCounters::Arrival::kRemembered);
  EXPECT_TRUE(fired.empty());
  EXPECT_EQ(r.calls, 1);
  EXPECT_EQ(counters.EarlyArrivals(7), 1u);
}

TEST(ImmediateCountersTest, ArrivalsBeforeExpectCount) {
  ImmediateCounters counters(16);
  std::vector<ImmediateCounters::Fired> fired;
  for (int i = 0; i < 2; ++i) counters.Arrive(9, true, &fired);
  Recorder r;
  ASSERT_TRUE(counters.Expect(9, 3, Deadline::AfterMs(60000), r.Callback()).ok());
  EXPECT_EQ(counters.EarlyArrivals(9), 0u);
  counters.TakeDue(Clock::now(), &fired);
  EXPECT_TRUE(fired.empty());
  counters.Arrive(9, true, &fired);
  RunAll(fired);
  EXPECT_EQ(r.calls, 1);
  EXPECT_EQ(r.arrived, 3u);
}

TEST(ImmediateCountersTest, AlreadySatisfiedFiresThroughTakeDueKeepingSurplus) {
  ImmediateCounters counters(16);
  std::vector<ImmediateCounters::Fired> fired;
  for (int i = 0; i < 5; ++i) counters.Arrive(4, true, &fired);
  Recorder r;
  ASSERT_TRUE(counters.Expect(4, 3, Deadline::AfterMs(60000), r.Callback()).ok());
  EXPECT_EQ(r.calls, 0);  // never inside Expect
  counters.TakeDue(Clock::now(), &fired);
  RunAll(fired);
  EXPECT_EQ(r.calls, 1);
  EXPECT_EQ(r.arrived, 3u);
  EXPECT_EQ(counters.EarlyArrivals(4), 2u);
}

TEST(ImmediateCountersTest, DeadlineFiresTimeoutWithCount) {
  ImmediateCounters counters(16);
  Recorder r;
  const Deadline deadline = Deadline::AfterMs(5);
  ASSERT_TRUE(counters.Expect(1, 10, deadline, r.Callback()).ok());
  std::vector<ImmediateCounters::Fired> fired;
  counters.Arrive(1, true, &fired);
  EXPECT_EQ(counters.TakeDue(deadline.at() - std::chrono::milliseconds(1), &fired), deadline.at());
  EXPECT_TRUE(fired.empty());
  counters.TakeDue(deadline.at(), &fired);
  RunAll(fired);
  EXPECT_EQ(r.calls, 1);
  EXPECT_EQ(r.status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(r.arrived, 1u);
  counters.TakeDue(deadline.at() + std::chrono::seconds(1), &fired);
  EXPECT_TRUE(fired.empty());
}

TEST(ImmediateCountersTest, RemoveDropsExpectationAndEarlyArrivals) {
  ImmediateCounters counters(16);
  std::vector<ImmediateCounters::Fired> fired;
  counters.Arrive(3, true, &fired);
  Recorder r;
  ASSERT_TRUE(counters.Expect(5, 2, Deadline::AfterMs(1), r.Callback()).ok());
  EXPECT_TRUE(counters.Remove(5));
  EXPECT_TRUE(counters.Remove(3));
  EXPECT_FALSE(counters.Remove(3));
  EXPECT_EQ(counters.EarlyArrivals(3), 0u);
  counters.TakeDue(Clock::now() + std::chrono::seconds(1), &fired);
  EXPECT_TRUE(fired.empty());
  EXPECT_EQ(r.calls, 0);
}

TEST(ImmediateCountersTest, DuplicateExpectIsRejected) {
  ImmediateCounters counters(16);
  ASSERT_TRUE(counters.Expect(2, 1, Deadline::AfterMs(100), nullptr).ok());
  EXPECT_EQ(counters.Expect(2, 1, Deadline::AfterMs(100), nullptr).code(),
            StatusCode::kAlreadyExists);
}

TEST(ImmediateCountersTest, UnrememberedAndBoundedArrivals) {
  ImmediateCounters counters(2);
  std::vector<ImmediateCounters::Fired> fired;
  EXPECT_EQ(counters.Arrive(1, false, &fired), ImmediateCounters::Arrival::kUnmatched);
  EXPECT_EQ(counters.EarlyArrivals(1), 0u);
  EXPECT_EQ(counters.Arrive(1, true, &fired), ImmediateCounters::Arrival::kRemembered);
  EXPECT_EQ(counters.Arrive(2, true, &fired), ImmediateCounters::Arrival::kRemembered);
  EXPECT_EQ(counters.Arrive(3, true, &fired), ImmediateCounters::Arrival::kUnmatched);
  EXPECT_EQ(counters.Arrive(2, true, &fired), ImmediateCounters::Arrival::kRemembered);
  EXPECT_EQ(counters.EarlyArrivals(2), 2u);
}

TEST(ImmediateCountersTest, CancelAllFiresEveryExpectation) {
  ImmediateCounters counters(16);
  Recorder a, b;
  ASSERT_TRUE(counters.Expect(1, 1, Deadline::AfterMs(60000), a.Callback()).ok());
  ASSERT_TRUE(counters.Expect(2, 1, Deadline::AfterMs(60000), b.Callback()).ok());
  std::vector<ImmediateCounters::Fired> fired;
  counters.CancelAll(Status::Cancelled("bye"), &fired);
  RunAll(fired);
  EXPECT_EQ(a.calls + b.calls, 2);
  EXPECT_EQ(a.status.code(), StatusCode::kCancelled);
  EXPECT_EQ(counters.PendingExpectations(), 0u);
}

}  // namespace
}  // namespace pdserve::fabric
