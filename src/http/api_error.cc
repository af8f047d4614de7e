#include "http/api_error.h"

#include <nlohmann/json.hpp>

namespace pdserve::server {

std::string ApiError::ToJson() const {
  nlohmann::json e = {{"message", message}, {"type", type}, {"code", code}};
  e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  nlohmann::json j = {{"error", std::move(e)}};
  // Messages may quote client bytes: replace invalid UTF-8 rather than throw.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiError BadRequest(std::string message, std::string param, std::string code) {
  return ApiError{400, "invalid_request_error", std::move(code), std::move(message),
                  std::move(param)};
}

ApiError ApiErrorFromStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      return BadRequest(status.message());
    case StatusCode::kOutOfRange:
      return ApiError{413, "invalid_request_error", "context_length_exceeded", status.message(),
                      ""};
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable:
      return ApiError{503, "service_unavailable_error", "server_overloaded", status.message(), ""};
    case StatusCode::kDeadlineExceeded:
      return ApiError{504, "timeout_error", "timeout", status.message(), ""};
    case StatusCode::kCancelled:
      return ApiError{503, "service_unavailable_error", "cancelled", status.message(), ""};
    default:
      return ApiError{500, "internal_error", "internal_error", status.ToString(), ""};
  }
}

}  // namespace pdserve::server
