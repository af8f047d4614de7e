#include "http/sse.h"

namespace pdserve::http {

std::string SseEvent(std::string_view json) {
  std::string event = "data: ";
  event.append(json).append("\n\n");
  return event;
}

std::string SseError(const ApiError& error) { return SseEvent(error.ToJson()); }

}  // namespace pdserve::http
