#include "common/status.h"

#include <cstring>

namespace pdserve {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kCancelled:
      return "CANCELLED";
    case StatusCode::kInProgress:
      return "IN_PROGRESS";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kIoError:
      return "IO_ERROR";
    case StatusCode::kProtocolError:
      return "PROTOCOL_ERROR";
    case StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case StatusCode::kInternal:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

Status Status::FromErrno(std::string context, int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (possibly not buf).
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return Status(StatusCode::kIoError, std::move(context) + ": " + msg);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

}  // namespace pdserve
