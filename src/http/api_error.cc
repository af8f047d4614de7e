#include "http/api_error.h"

#include <nlohmann/json.hpp>

#include "common/retry_after.h"

namespace pdserve::http {
namespace {

constexpr char kInvalidRequest[] = "invalid_request_error";

ApiError Make(int http_status, std::string type, std::string code, std::string message,
              std::string param = "") {
  return ApiError{http_status,        std::move(type),  std::move(code),
                  std::move(message), std::move(param), 1};
}

}  // namespace

ApiError ApiError::InvalidRequest(std::string message, std::string param, std::string code) {
  return Make(400, kInvalidRequest, std::move(code), std::move(message), std::move(param));
}

ApiError ApiError::Unauthorized() {
  return Make(401, kInvalidRequest, "invalid_api_key",
              "missing or invalid API key (Authorization: Bearer <key>)");
}

ApiError ApiError::ClusterProofRejected(std::string message) {
  return Make(401, kInvalidRequest, "invalid_cluster_proof", std::move(message));
}

ApiError ApiError::InternalDisabled(std::string message) {
  return Make(403, kInvalidRequest, "internal_disabled", std::move(message));
}

ApiError ApiError::NotFound(std::string_view method, std::string_view path) {
  std::string message = "no route ";
  message.append(method).append(" ").append(path);
  return Make(404, kInvalidRequest, "not_found", std::move(message));
}

ApiError ApiError::ModelNotFound(std::string_view model) {
  std::string message = "The model '";
  message.append(model).append("' does not exist");
  return Make(404, kInvalidRequest, "model_not_found", std::move(message), "model");
}

ApiError ApiError::MethodNotAllowed() {
  return Make(405, kInvalidRequest, "method_not_allowed", "method not allowed");
}

ApiError ApiError::PayloadTooLarge() {
  return Make(413, kInvalidRequest, "payload_too_large", "request body too large");
}

ApiError ApiError::ContextLengthExceeded(std::string message, std::string param) {
  return Make(400, kInvalidRequest, "context_length_exceeded", std::move(message),
              std::move(param));
}

ApiError ApiError::UriTooLong() {
  return Make(414, kInvalidRequest, "uri_too_long", "request URI too long");
}

ApiError ApiError::RequestTimeout(std::string message) {
  return Make(408, kInvalidRequest, "request_timeout", std::move(message));
}

ApiError ApiError::MalformedRequest(std::string_view problem) {
  std::string message = "malformed request: ";
  message.append(problem);
  return Make(400, kInvalidRequest, "malformed_request", std::move(message));
}

ApiError ApiError::UnsupportedMediaType(std::string message) {
  return Make(415, kInvalidRequest, "unsupported_media_type", std::move(message));
}

ApiError ApiError::HeaderTooLarge() {
  return Make(431, kInvalidRequest, "request_header_fields_too_large",
              "a request header is too large");
}

ApiError ApiError::RateLimited(std::string message) {
  return Make(429, "rate_limit_error", "rate_limit_exceeded", std::move(message));
}

ApiError ApiError::Overloaded(std::string message) {
  return Unavailable(std::move(message), "server_overloaded");
}

ApiError ApiError::Unavailable(std::string message, std::string code) {
  return Make(503, "service_unavailable_error", std::move(code), std::move(message));
}

ApiError ApiError::Timeout(std::string message, std::string code) {
  return Make(504, "timeout_error", std::move(code), std::move(message));
}

ApiError ApiError::BadGateway(std::string message, std::string code) {
  return Make(502, "server_error", std::move(code), std::move(message));
}

ApiError ApiError::Internal(std::string message) {
  return Make(500, "internal_error", "internal_error", std::move(message));
}

ApiError ApiError::ForHttpStatus(int http_status) {
  switch (http_status) {
    case 405:
      return MethodNotAllowed();
    case 413:
      return PayloadTooLarge();
    case 414:
      return UriTooLong();
    case 431:
      return HeaderTooLarge();
    default:
      if (http_status >= 500) {
        ApiError e = Internal("internal error");
        e.http_status = http_status;
        return e;
      }
      return Make(http_status, kInvalidRequest, "bad_request", "bad request");
  }
}

ApiError ApiError::FromStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      return InvalidRequest(status.message());
    case StatusCode::kOutOfRange:
      return ContextLengthExceeded(status.message());
    case StatusCode::kResourceExhausted:
      return Overloaded(status.message());
    case StatusCode::kUnavailable: {
      ApiError e = Unavailable(status.message(), "service_unavailable");
      if (const int s = RetryAfterSeconds(status.message()); s > 0) e.retry_after_s = s;
      return e;
    }
    case StatusCode::kDeadlineExceeded:
      return Timeout(status.message());
    case StatusCode::kCancelled:
      return Unavailable(status.message(), "cancelled");
    default:
      return Internal(status.ToString());
  }
}

std::string ApiError::ToJson() const {
  nlohmann::json e = {{"message", message}, {"type", type}, {"code", code}};
  e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  const nlohmann::json j = {{"error", std::move(e)}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace pdserve::http
