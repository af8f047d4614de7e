// ApiError: an error answer in the OpenAI shape ({"error": {"message", "type", "code",
// "param"}}) with its HTTP status, built only through the named constructors below so that one
// kind of error has one status, type and code wherever node or router raises it; and
// ApiResult<T>, a value or an ApiError. Plain values; thread-compatible. No HTTP dependency,
// so request parsing that returns these can be fuzzed alone.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "common/status.h"

namespace pdserve::http {

struct ApiError {
  int http_status = 500;
  std::string type;     // OpenAI error type ("invalid_request_error", ...)
  std::string code;     // machine-readable reason
  std::string message;  // for humans; names the field at fault
  std::string param;    // the offending field, if one
  // With retry_later(): the Retry-After header's seconds (a refusal that knows when the
  // node will have room says so; else 1).
  int retry_after_s = 1;

  // 400 invalid_request_error; `code` says which rule the request broke ("invalid_json",
  // "invalid_type", "missing_required", "unsupported_value", "invalid_value").
  static ApiError InvalidRequest(std::string message, std::string param = "",
                                 std::string code = "invalid_value");
  // 401 invalid_api_key.
  static ApiError Unauthorized();
  // 401 invalid_cluster_proof: an /internal/ request without a valid cluster proof
  // (http/cluster_auth.h); 403 internal_disabled: this process has no cluster key.
  static ApiError ClusterProofRejected(std::string message);
  static ApiError InternalDisabled(std::string message);
  // 404 not_found: no such route.
  static ApiError NotFound(std::string_view method, std::string_view path);
  // 404 model_not_found on param "model".
  static ApiError ModelNotFound(std::string_view model);
  // 405 method_not_allowed.
  static ApiError MethodNotAllowed();
  // 413 payload_too_large: the body exceeds the server's limit.
  static ApiError PayloadTooLarge();
  // 400 context_length_exceeded: the prompt does not fit the model (400, as OpenAI and vLLM
  // answer it: SDKs raise BadRequestError with the code).
  static ApiError ContextLengthExceeded(std::string message, std::string param = "");
  // 408 request_timeout: the request head did not arrive within the server's header timeout
  // (or, as `message` says, its body within the read timeout).
  static ApiError RequestTimeout(std::string message = "the request head did not arrive in time");
  // 400 malformed_request: a request whose head or chunked body breaks HTTP/1.1's syntax or
  // frames its body ambiguously (http/request_framing.h); `problem` names the fault.
  static ApiError MalformedRequest(std::string_view problem);
  // 415 unsupported_media_type: a body whose Content-Type or Content-Encoding the route does
  // not take; the message says what it takes.
  static ApiError UnsupportedMediaType(std::string message);
  // 414 uri_too_long.
  static ApiError UriTooLong();
  // 431 request_header_fields_too_large: a header line over the server's limit.
  static ApiError HeaderTooLarge();
  // 429 rate_limit_error (sent with Retry-After).
  static ApiError RateLimited(std::string message);
  // 503 server_overloaded: too much queued work (sent with Retry-After).
  static ApiError Overloaded(std::string message);
  // 503 with a reason code: "loading", "shutting_down", "cancelled", "no_healthy_node" (sent
  // with Retry-After).
  static ApiError Unavailable(std::string message, std::string code);
  // 504 timeout_error: "timeout" (no output in time) or "upstream_timeout" (router).
  static ApiError Timeout(std::string message, std::string code = "timeout");
  // 502 server_error: the router's node failed ("upstream_unreachable", "upstream_broken").
  static ApiError BadGateway(std::string message, std::string code);
  // 500 internal_error: a bug; the message says what (never an exception's text: that is for
  // the log).
  static ApiError Internal(std::string message);
  // Another 4xx/5xx status with no more specific constructor (httplib's own parse errors).
  static ApiError ForHttpStatus(int http_status);
  // Maps an engine/model Status to what a client should see: InvalidArgument -> 400,
  // OutOfRange -> 400 context_length_exceeded, ResourceExhausted -> 503 server_overloaded,
  // Unavailable -> 503 service_unavailable (e.g. a lost prefill peer or tensor-parallel rank),
  // DeadlineExceeded -> 504, Cancelled -> 503 "cancelled", anything else -> 500. An
  // Unavailable status whose message ends as common/retry_after.h's WithRetryAfter writes it
  // answers with that Retry-After.
  static ApiError FromStatus(const Status& status);

  // Whether a client should retry after a pause (429, 503): answers carry Retry-After.
  bool retry_later() const { return http_status == 429 || http_status == 503; }
  // {"error": {"message", "type", "code", "param"}} (param null when empty). Messages may
  // quote client bytes: invalid UTF-8 is replaced, never thrown on.
  std::string ToJson() const;
};

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

}  // namespace pdserve::http
