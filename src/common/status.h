// Status and Result<T>: the one error convention at module boundaries.
//
// A Status is a code plus a human-readable message. kInProgress is the explicit
// "not finished yet" answer of asynchronous polls; it is not an error and not ok().
// Values are immutable after construction and safe to copy across threads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace pdserve {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,  // bad input from outside: request, file, flag
  kNotFound,         // file, tensor, request id, peer
  kAlreadyExists,
  kOutOfRange,
  kResourceExhausted,   // page pool full, queue full
  kFailedPrecondition,  // called in the wrong state
  kUnavailable,         // peer gone, endpoint down; retrying elsewhere may help
  kDeadlineExceeded,    // a wait passed its deadline
  kCancelled,
  kInProgress,     // asynchronous operation not finished; poll again
  kDataLoss,       // truncated or corrupt data
  kIoError,        // operating-system error
  kProtocolError,  // malformed or unexpected protocol message
  kUnimplemented,
  kPermissionDenied,  // the peer does not share our secret (or we lack its)
  kInternal,          // a bug: an invariant did not hold
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status FailedPrecondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status DeadlineExceeded(std::string m) {
    return {StatusCode::kDeadlineExceeded, std::move(m)};
  }
  static Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
  static Status InProgress() { return {StatusCode::kInProgress, "in progress"}; }
  static Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
  static Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  // An IoError whose message ends with strerror(err).
  static Status FromErrno(std::string context, int err);
  static Status ProtocolError(std::string m) { return {StatusCode::kProtocolError, std::move(m)}; }
  static Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
  static Status PermissionDenied(std::string m) {
    return {StatusCode::kPermissionDenied, std::move(m)};
  }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  bool in_progress() const { return code_ == StatusCode::kInProgress; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message" or "OK".
  std::string ToString() const;

  // Returns a copy whose message is prefixed with "context: ".
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : data_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(data_).ok()) {
      data_ = Status::Internal("Result constructed from an ok Status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(data_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(data_);
  }
  // Precondition: ok().
  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace pdserve

#define PD_STATUS_CONCAT_INNER(a, b) a##b
#define PD_STATUS_CONCAT(a, b) PD_STATUS_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not ok.
#define PD_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    ::pdserve::Status pd_status_tmp_ = (expr);       \
    if (!pd_status_tmp_.ok()) return pd_status_tmp_; \
  } while (0)

// `PD_ASSIGN_OR_RETURN(auto x, Foo());` declares x from Foo()'s value or returns its Status.
#define PD_ASSIGN_OR_RETURN(lhs, expr) \
  PD_ASSIGN_OR_RETURN_IMPL(PD_STATUS_CONCAT(pd_result_, __LINE__), lhs, expr)
#define PD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
