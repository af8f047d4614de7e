// ApiError: an error answer in the OpenAI shape ({"error": {"message", "type", "code"}}) with
// its HTTP status, and ApiResult<T>, a value or an ApiError. Plain values; thread-compatible.
// No HTTP dependency, so request parsing that returns these can be fuzzed alone.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "common/status.h"

namespace pdserve::server {

struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";  // OpenAI error type
  std::string code;                            // machine-readable reason
  std::string message;                         // for humans; names the field at fault
  std::string param;                           // the offending field, if one

  // {"error": {"message", "type", "code", "param"}} (param null when empty).
  std::string ToJson() const;
};

// 400 invalid_request_error, code "invalid_value" unless given.
ApiError BadRequest(std::string message, std::string param = "",
                    std::string code = "invalid_value");
// Maps an engine/model Status to the error a client should see (InvalidArgument -> 400,
// OutOfRange -> 413, ResourceExhausted/Unavailable -> 503, DeadlineExceeded -> 504,
// anything else -> 500).
ApiError ApiErrorFromStatus(const Status& status);

template <typename T>
class ApiResult {
 public:
  ApiResult(T value) : data_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  ApiResult(ApiError error) : data_(std::move(error)) {}  // NOLINT(google-explicit-constructor)
  bool ok() const { return std::holds_alternative<T>(data_); }
  // Preconditions: ok() for value(), !ok() for error().
  T& value() { return std::get<T>(data_); }
  const ApiError& error() const { return std::get<ApiError>(data_); }

 private:
  std::variant<T, ApiError> data_;
};

}  // namespace pdserve::server
