// Admission by estimated KV wait (docs/messenger.md, "Admission"): a prefill node measures its
// prefill rate (PrefillRateMeter) and reports it with its queued tokens (LoadReport); the
// decode node estimates how long a new prompt's KV would take from the least loaded prefill
// peer and, when that misses the request's deadline, prefills the prompt itself (if it has
// room) or refuses it at once with 503 and a Retry-After from the estimate (DecideAdmission).
//
// Plain value types and pure functions, except PrefillRateMeter (thread-compatible).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"

namespace pdserve::messenger {

// What a decode node does with a request whose estimated KV wait exceeds its deadline.
enum class AdmissionPolicy : uint8_t {
  kOff,     // nothing: the request waits for its KV and may expire at the deadline
  kRefuse,  // 503 with Retry-After, at once
  kLocal,   // prefilled by the decode node when it has room, else as kRefuse
};

// A prefill node's prefill rate: prompt tokens finished per second of busy time (time with at
// least one prefill outstanding), smoothed exponentially over about `window_s` seconds of busy
// time. Busy time of jobs that never finish (cancelled, failed) counts without their tokens:
// the rate errs low, the estimates long. 0 until the first prefill finishes.
class PrefillRateMeter {
 public:
  explicit PrefillRateMeter(double window_s = 5.0) : window_s_(window_s) {}
  // Call at every change of the outstanding work, with `finished_tokens` prompt tokens whose
  // prefill has just finished (0 for an arrival or a cancel) and whether work is outstanding
  // from `now` on.
  void Observe(TimePoint now, int64_t finished_tokens, bool busy_after);
  double tokens_per_second() const;

 private:
  const double window_s_;
  bool busy_ = false;
  TimePoint last_{};
  double pending_busy_s_ = 0;  // busy time since the last finished prefill
  double tokens_ = 0;          // decayed sums
  double busy_s_ = 0;
};

// One prefill peer as the decode node sees it when a request arrives.
struct PeerLoad {
  std::string name;
  // Prompt tokens queued there: its last report plus what this node sent since (or, if more,
  // what this node has in flight there).
  int64_t queued_tokens = 0;
  double tokens_per_second = 0;  // its reported rate; 0: not measured yet
};

struct AdmissionInput {
  AdmissionPolicy policy = AdmissionPolicy::kLocal;
  int64_t prompt_tokens = 0;
  double deadline_s = 0;  // how long the request's KV may take (--prefill-timeout-ms)
  // The ready peers the request may use (its X-Prefill-Peer alone, if it names one).
  std::vector<PeerLoad> peers;
  // Tokens admitted for a prefill peer by this node and not yet sent (waiting for pages).
  int64_t unsent_tokens = 0;
  // Whether the request may be prefilled here (no X-Prefill-Peer), and this node's room:
  // prompt tokens it prefills itself for admission now, its bound, and whether its free pages
  // hold the prompt.
  bool may_prefill_here = true;
  int64_t local_tokens = 0;
  int64_t local_max_tokens = 0;
  bool pages_free = true;
};

struct AdmissionDecision {
  enum class Action : uint8_t { kRemote, kLocal, kRefuse } action = Action::kRemote;
  double estimate_s = 0;  // the least loaded peer's estimated KV wait (0: none measured)
  int retry_after_s = 0;  // kRefuse: when the queue will have drained enough, at this rate
  std::string reason;     // kLocal, kRefuse: why, naming the peer and the figures
};

// Estimated KV wait on a peer: (queued + unsent + prompt) / rate. The request is sent to a
// peer when the smallest estimate is within the deadline, when no peer has measured its rate
// yet, when there is no ready peer (the messenger's own paths decide then) or with kOff.
AdmissionDecision DecideAdmission(const AdmissionInput& input);

}  // namespace pdserve::messenger
