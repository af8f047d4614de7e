// Admission's parts alone (messenger/admission.h): the prefill rate a prefill node reports,
// the decode node's decision from its peers' loads, and the Retry-After a refusal carries to
// the HTTP answer (common/retry_after.h). The whole path over real processes is in
// admission_disagg_test.cc.
#include "messenger/admission.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/retry_after.h"

namespace pdserve::messenger {
namespace {

TimePoint At(double seconds) {
  return TimePoint{} +
         std::chrono::duration_cast<Duration>(std::chrono::duration<double>(seconds)) +
         std::chrono::hours(1);
}

TEST(PrefillRateMeterTest, TokensOverBusyTimeIdleTimeExcluded) {
  PrefillRateMeter meter(/*window_s=*/5.0);
  EXPECT_EQ(meter.tokens_per_second(), 0.0);  // nothing finished yet
  meter.Observe(At(0), 0, /*busy_after=*/true);
  EXPECT_EQ(meter.tokens_per_second(), 0.0);
  meter.Observe(At(2), 1000, /*busy_after=*/false);  // 1000 tokens in 2 s
  EXPECT_NEAR(meter.tokens_per_second(), 500.0, 1e-9);
  // 10 s idle, then 300 tokens in 1 s: the idle time counts for nothing, the older figure
  // decays by one second of busy time in five.
  meter.Observe(At(12), 0, true);
  meter.Observe(At(13), 300, false);
  const double d = std::exp(-1.0 / 5.0);
  EXPECT_NEAR(meter.tokens_per_second(), (1000 * d + 300) / (2 * d + 1), 1e-9);
}

TEST(PrefillRateMeterTest, OverlappingPrefillsAndCancelsErrLow) {
  PrefillRateMeter meter(5.0);
  // Two prompts arrive together and finish 1 s and 2 s later: 600 tokens in 2 busy seconds.
  meter.Observe(At(0), 0, true);
  meter.Observe(At(0), 0, true);
  meter.Observe(At(1), 200, true);
  meter.Observe(At(2), 400, false);
  const double two = meter.tokens_per_second();
  EXPECT_GT(two, 290.0);
  EXPECT_LT(two, 310.0);
  // A cancelled prefill's busy second counts, its tokens do not: the rate only goes down.
  meter.Observe(At(3), 0, true);
  meter.Observe(At(4), 0, false);  // cancelled
  meter.Observe(At(5), 0, true);
  meter.Observe(At(6), 300, false);
  EXPECT_LT(meter.tokens_per_second(), two);
}

AdmissionInput Busy(AdmissionPolicy policy) {
  // 9000 tokens queued at 100 tokens/s: 99 s for a 900-token prompt, against 60 s.
  return {.policy = policy,
          .prompt_tokens = 900,
          .deadline_s = 60,
          .peers = {{.name = "p", .queued_tokens = 9000, .tokens_per_second = 100}},
          .unsent_tokens = 0,
          .may_prefill_here = true,
          .local_tokens = 0,
          .local_max_tokens = 4096,
          .pages_free = true};
}

TEST(AdmissionTest, WithinTheDeadlineGoesToThePeer) {
  AdmissionInput in = Busy(AdmissionPolicy::kRefuse);
  in.peers[0].queued_tokens = 4000;  // (4000 + 900) / 100 = 49 s
  const AdmissionDecision d = DecideAdmission(in);
  EXPECT_EQ(d.action, AdmissionDecision::Action::kRemote);
  EXPECT_NEAR(d.estimate_s, 49.0, 1e-9);
  in.unsent_tokens = 2000;  // admitted, not yet sent: 69 s
  EXPECT_EQ(DecideAdmission(in).action, AdmissionDecision::Action::kRefuse);
}

TEST(AdmissionTest, RefusalSaysWhenTheQueueWillHaveRoom) {
  const AdmissionDecision d = DecideAdmission(Busy(AdmissionPolicy::kRefuse));
  EXPECT_EQ(d.action, AdmissionDecision::Action::kRefuse);
  EXPECT_NEAR(d.estimate_s, 99.0, 1e-9);
  EXPECT_EQ(d.retry_after_s, 39);  // 99 - 60
  EXPECT_NE(d.reason.find("prefill peer p would take about 99.0 s"), std::string::npos) << d.reason;
}

TEST(AdmissionTest, LocalWhileThereIsRoomElseRefused) {
  AdmissionInput in = Busy(AdmissionPolicy::kLocal);
  EXPECT_EQ(DecideAdmission(in).action, AdmissionDecision::Action::kLocal);
  in.local_tokens = 4096 - 900;  // exactly at the bound with this prompt
  EXPECT_EQ(DecideAdmission(in).action, AdmissionDecision::Action::kLocal);
  in.local_tokens += 1;
  AdmissionDecision d = DecideAdmission(in);
  EXPECT_EQ(d.action, AdmissionDecision::Action::kRefuse);
  EXPECT_NE(d.reason.find("(3197 tokens in progress + 900 > 4096)"), std::string::npos) << d.reason;
  in = Busy(AdmissionPolicy::kLocal);
  in.pages_free = false;
  EXPECT_EQ(DecideAdmission(in).action, AdmissionDecision::Action::kRefuse);
  in = Busy(AdmissionPolicy::kLocal);
  in.may_prefill_here = false;  // X-Prefill-Peer
  EXPECT_EQ(DecideAdmission(in).action, AdmissionDecision::Action::kRefuse);
}

TEST(AdmissionTest, LeastLoadedPeerUnmeasuredPeerOrOffAdmits) {
  AdmissionInput in = Busy(AdmissionPolicy::kRefuse);
  in.peers.push_back({.name = "q", .queued_tokens = 100, .tokens_per_second = 50});  // 20 s
  AdmissionDecision d = DecideAdmission(in);
  EXPECT_EQ(d.action, AdmissionDecision::Action::kRemote);
  EXPECT_NEAR(d.estimate_s, 20.0, 1e-9);
  in = Busy(AdmissionPolicy::kRefuse);
  in.peers[0].tokens_per_second = 0;  // not measured yet: no estimate, no refusal
  EXPECT_EQ(DecideAdmission(in).action, AdmissionDecision::Action::kRemote);
  EXPECT_EQ(DecideAdmission(Busy(AdmissionPolicy::kOff)).action,
            AdmissionDecision::Action::kRemote);
  in = Busy(AdmissionPolicy::kRefuse);
  in.peers.clear();  // no ready peer: the messenger's own paths decide
  EXPECT_EQ(DecideAdmission(in).action, AdmissionDecision::Action::kRemote);
}

TEST(RetryAfterTest, SuffixRoundTripsAndNothingElseParses) {
  const Status s = WithRetryAfter(Status::Unavailable("admission: busy"), 39);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "admission: busy (retry after 39 s)");
  EXPECT_EQ(RetryAfterSeconds(s.message()), 39);
  EXPECT_EQ(RetryAfterSeconds(WithRetryAfter(Status::Unavailable("x"), 0).message()), 1);
  for (const char* m : {"busy", "(retry after s)", "(retry after -3 s)", "(retry after 3x s)",
                        "retry after 3 s)", "(retry after 3 s) later"}) {
    EXPECT_EQ(RetryAfterSeconds(m), 0) << m;
  }
}

}  // namespace
}  // namespace pdserve::messenger
