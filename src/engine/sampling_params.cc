#include "engine/sampling_params.h"

#include <cmath>
#include <string_view>

#include <fmt/format.h>

namespace pdserve {
namespace {

// True if `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
// Stop strings must be: they are matched against decoded text, which is always valid UTF-8,
// and a malformed one could make the streaming hold-back split a character.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int j = 1; j < len; ++j) {
      const auto cc = static_cast<unsigned char>(s[i + j]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

}  // namespace

Status SamplingParams::Validate(int vocab_size) const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return Status::InvalidArgument(
        fmt::format("temperature must be a finite number >= 0 (0 = greedy), got {}", temperature));
  }
  if (top_k < -1) {
    return Status::InvalidArgument(
        fmt::format("top_k must be -1 or 0 (off) or >= 1, got {}", top_k));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return Status::InvalidArgument(fmt::format("top_p must be in (0, 1], got {}", top_p));
  }
  if (max_tokens < 1) {
    return Status::InvalidArgument(fmt::format("max_tokens must be >= 1, got {}", max_tokens));
  }
  if (logprobs < 0 || logprobs > kMaxLogprobs) {
    return Status::InvalidArgument(
        fmt::format("logprobs must be in [0, {}], got {}", kMaxLogprobs, logprobs));
  }
  if (logprobs > vocab_size) {
    return Status::InvalidArgument(
        fmt::format("logprobs ({}) exceeds the vocabulary size ({})", logprobs, vocab_size));
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) {
      return Status::InvalidArgument(fmt::format("stop[{}] is an empty string", i));
    }
    if (!IsValidUtf8(stop[i])) {
      return Status::InvalidArgument(fmt::format("stop[{}] is not valid UTF-8", i));
    }
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    const int32_t id = stop_token_ids[i];
    if (id < 0 || id >= vocab_size) {
      return Status::InvalidArgument(fmt::format(
          "stop_token_ids[{}] = {} is outside the vocabulary [0, {})", i, id, vocab_size));
    }
  }
  return Status::Ok();
}

}  // namespace pdserve
