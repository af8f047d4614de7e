// Server-sent-events framing of OpenAI streams: one "data: <json>\n\n" event per chunk, an
// error event in the ApiError shape, and the closing "data: [DONE]\n\n". Pure functions; safe
// from any thread.
#pragma once

#include <string>
#include <string_view>

#include "http/api_error.h"

namespace pdserve::http {

inline constexpr char kSseContentType[] = "text/event-stream";
inline constexpr char kSseDone[] = "data: [DONE]\n\n";

// "data: <json>\n\n". `json` is one line (compact JSON), so it needs no further framing.
std::string SseEvent(std::string_view json);
// The event that reports an error inside a stream already answered 200.
std::string SseError(const ApiError& error);

}  // namespace pdserve::http
