// How an Unavailable Status says when to retry: a refusal that knows (the decode node's
// admission, docs/messenger.md "Admission") ends its message with WithRetryAfter's suffix, and
// the HTTP layer (http::ApiError::FromStatus) turns it into the answer's Retry-After header.
// The Status type itself carries no payload: the suffix is the one place this is spelled.
// Pure functions; any thread.
#pragma once

#include <charconv>
#include <string>
#include <string_view>

#include "common/status.h"

namespace pdserve {

inline constexpr std::string_view kRetryAfterPrefix = " (retry after ";
inline constexpr std::string_view kRetryAfterSuffix = " s)";

// `status` (Unavailable) with "(retry after N s)" appended; N at least 1.
inline Status WithRetryAfter(const Status& status, int seconds) {
  return Status(status.code(), status.message() + std::string(kRetryAfterPrefix) +
                                   std::to_string(seconds < 1 ? 1 : seconds) +
                                   std::string(kRetryAfterSuffix));
}

// The N of a message ending with WithRetryAfter's suffix, else 0.
inline int RetryAfterSeconds(std::string_view message) {
  if (!message.ends_with(kRetryAfterSuffix)) return 0;
  message.remove_suffix(kRetryAfterSuffix.size());
  const size_t at = message.rfind(kRetryAfterPrefix);
  if (at == std::string_view::npos) return 0;
  const std::string_view digits = message.substr(at + kRetryAfterPrefix.size());
  int n = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc() || end != digits.data() + digits.size() || n < 1) return 0;
  return n;
}

}  // namespace pdserve
