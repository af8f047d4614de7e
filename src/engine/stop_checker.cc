#include "engine/stop_checker.h"

#include <algorithm>

#include "common/check.h"

namespace pdserve {
namespace {

// fallback[i] = length of the longest proper prefix of pattern[0..i] that is also its suffix.
std::vector<int> KmpFallback(std::string_view pattern) {
  std::vector<int> fallback(pattern.size(), 0);
  int k = 0;
  for (size_t i = 1; i < pattern.size(); ++i) {
    while (k > 0 && pattern[i] != pattern[k]) k = fallback[k - 1];
    if (pattern[i] == pattern[k]) ++k;
    fallback[i] = k;
  }
  return fallback;
}

}  // namespace

StopChecker::StopChecker(const SamplingParams& params, std::span<const int32_t> eos_ids)
    : max_tokens_(params.max_tokens), stop_tokens_(params.stop_token_ids) {
  if (!params.ignore_eos) stop_tokens_.insert(stop_tokens_.end(), eos_ids.begin(), eos_ids.end());
  for (const std::string& s : params.stop) {
    PD_CHECK_MSG(!s.empty(), "stop strings are validated non-empty");
    matchers_.push_back({s, KmpFallback(s), 0});
  }
}

bool StopChecker::IsStopToken(int32_t token) const {
  return std::find(stop_tokens_.begin(), stop_tokens_.end(), token) != stop_tokens_.end();
}

size_t StopChecker::AppendAndMatch(std::string_view s) {
  for (char c : s) {
    text_.push_back(c);
    // Of the stop strings that complete at this byte, the longest starts first.
    size_t match_start = std::string::npos;
    for (Matcher& m : matchers_) {
      while (m.matched > 0 && m.pattern[m.matched] != c) m.matched = m.fallback[m.matched - 1];
      if (m.pattern[m.matched] == c) ++m.matched;
      if (m.matched == static_cast<int>(m.pattern.size())) {
        match_start = std::min(match_start, text_.size() - m.pattern.size());
        m.matched = m.fallback[m.matched - 1];
      }
    }
    if (match_start != std::string::npos) return match_start;
  }
  return std::string::npos;
}

std::string StopChecker::TakeUntil(size_t end) {
  PD_CHECK(end >= emitted_ && end <= text_.size());
  std::string out = text_.substr(emitted_, end - emitted_);
  emitted_ = end;
  return out;
}

StopDecision StopChecker::Stop(FinishReason reason, std::string emit) {
  reason_ = reason;
  return {true, reason, std::move(emit)};
}

StopDecision StopChecker::Update(int32_t token, std::string_view new_text) {
  if (stopped() || flushed_) return {stopped(), reason_, ""};
  ++num_tokens_;
  if (IsStopToken(token)) {
    // The stop token's own text is not output, but what was held back is real text now.
    return Stop(FinishReason::kStop, TakeUntil(text_.size()));
  }
  const size_t stop_at = AppendAndMatch(new_text);
  if (stop_at != std::string::npos) {
    // Held-back text always covers a stop string's beginning, so stop_at >= emitted_.
    std::string emit = TakeUntil(stop_at);
    text_.resize(stop_at);
    return Stop(FinishReason::kStop, std::move(emit));
  }
  if (num_tokens_ >= max_tokens_) return Stop(FinishReason::kLength, TakeUntil(text_.size()));

  // Hold back the longest tail that is still the beginning of some stop string.
  int held = 0;
  for (const Matcher& m : matchers_) held = std::max(held, m.matched);
  return {false, FinishReason::kNone, TakeUntil(text_.size() - held)};
}

std::string StopChecker::Flush(std::string_view tail) {
  if (flushed_ || reason_ == FinishReason::kStop) return "";
  flushed_ = true;
  const size_t stop_at = AppendAndMatch(tail);
  if (stop_at != std::string::npos) text_.resize(stop_at);
  return TakeUntil(text_.size());
}

}  // namespace pdserve
