#include "messenger/admission.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace pdserve::messenger {

void PrefillRateMeter::Observe(TimePoint now, int64_t finished_tokens, bool busy_after) {
  if (busy_ && last_ != TimePoint{}) {
    pending_busy_s_ += std::chrono::duration<double>(now - last_).count();
  }
  last_ = now;
  busy_ = busy_after;
  if (finished_tokens <= 0) return;
  // Folded at each finished prefill: the tokens and the busy time they took, the older sums
  // decayed by the busy time that passed since.
  const double decay = std::exp(-pending_busy_s_ / window_s_);
  tokens_ = tokens_ * decay + static_cast<double>(finished_tokens);
  busy_s_ = busy_s_ * decay + pending_busy_s_;
  pending_busy_s_ = 0;
}

double PrefillRateMeter::tokens_per_second() const {
  // A prefill that finished at the instant it arrived (a whole prefix-cache hit) took no
  // measurable time: no rate from it alone.
  return busy_s_ > 1e-6 ? tokens_ / busy_s_ : 0.0;
}

AdmissionDecision DecideAdmission(const AdmissionInput& in) {
  AdmissionDecision d;
  if (in.policy == AdmissionPolicy::kOff || in.peers.empty()) return d;
  const PeerLoad* best = nullptr;
  double best_wait = std::numeric_limits<double>::infinity();
  for (const PeerLoad& p : in.peers) {
    // A peer that has not measured its rate yet is given the benefit of the doubt: no
    // estimate, no refusal.
    if (p.tokens_per_second <= 0) return d;
    const double wait = static_cast<double>(p.queued_tokens + in.unsent_tokens + in.prompt_tokens) /
                        p.tokens_per_second;
    if (wait < best_wait) {
      best_wait = wait;
      best = &p;
    }
  }
  d.estimate_s = best_wait;
  if (best_wait <= in.deadline_s) return d;
  const std::string why = fmt::format(
      "prefill peer {} would take about {:.1f} s for this prompt ({} tokens queued there, {} "
      "unsent, {} in this prompt, at {:.0f} tokens/s): more than the {:.1f} s deadline",
      best->name, best_wait, best->queued_tokens, in.unsent_tokens, in.prompt_tokens,
      best->tokens_per_second, in.deadline_s);
  if (in.policy == AdmissionPolicy::kLocal && in.may_prefill_here && in.pages_free &&
      in.local_tokens + in.prompt_tokens <= in.local_max_tokens) {
    d.action = AdmissionDecision::Action::kLocal;
    d.reason = why + "; prefilled here";
    return d;
  }
  // At this rate the queue ahead shrinks enough for the request to fit after
  // (estimate - deadline) seconds, if nothing else arrives.
  d.action = AdmissionDecision::Action::kRefuse;
  d.retry_after_s = std::max(1, static_cast<int>(std::ceil(best_wait - in.deadline_s)));
  d.reason = why;
  if (in.policy == AdmissionPolicy::kLocal) {
    d.reason += !in.may_prefill_here ? "; it names its prefill peer"
                : !in.pages_free     ? "; this node's free KV pages do not hold it"
                                     : fmt::format(
                                           "; this node's own prefills would exceed its bound "
                                               "({} tokens in progress + {} > {})",
                                           in.local_tokens, in.prompt_tokens, in.local_max_tokens);
  }
  return d;
}

}  // namespace pdserve::messenger
