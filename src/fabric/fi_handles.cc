#include "fabric/fi_handles.h"

#include <fmt/format.h>
#include <rdma/fi_errno.h>

namespace pdserve::fabric {

Status FabricError(std::string_view what, long ret) {
  const int err = static_cast<int>(ret < 0 ? -ret : ret);
  std::string message = fmt::format("{} failed: {} ({})", what, fi_strerror(err), err);
  switch (err) {
    case FI_ENODATA:
    case FI_ENOSYS:
    case FI_EOPNOTSUPP:
      return Status::Unimplemented(std::move(message));
    case FI_EINVAL:
      return Status::InvalidArgument(std::move(message));
    case FI_ENOMEM:
    case FI_ENOSPC:
      return Status::ResourceExhausted(std::move(message));
    case FI_ETIMEDOUT:
      return Status::DeadlineExceeded(std::move(message));
    case FI_ECANCELED:
      return Status::Cancelled(std::move(message));
    default:
      return Status::Unavailable(std::move(message));
  }
}

}  // namespace pdserve::fabric
