#include "fabric/fi_handles.h"

#include <cstring>

#include <fmt/format.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include "common/logging.h"

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

Result<EnabledEndpoint> OpenEnabledEndpoint(fid_domain* domain, fi_info* info, fid_av* av,
                                            fid_cq* cq) {
  constexpr int kAttempts = 4;
  for (int attempt = 1;; ++attempt) {
    fid_ep* raw = nullptr;
    long rc = fi_endpoint(domain, info, &raw, nullptr);
    if (rc != 0) return FabricError("fi_endpoint", rc);
    EnabledEndpoint out{FidPtr<fid_ep>(raw), {}};
    if ((rc = fi_ep_bind(raw, &av->fid, 0)) != 0) return FabricError("fi_ep_bind(av)", rc);
    if ((rc = fi_ep_bind(raw, &cq->fid, FI_TRANSMIT | FI_RECV)) != 0) {
      return FabricError("fi_ep_bind(cq)", rc);
    }
    char name[1024];
    size_t name_len = sizeof(name);
    rc = fi_enable(raw);
    if (rc == -FI_EBUSY && attempt < kAttempts) {
      if (fi_getname(&raw->fid, name, &name_len) != 0) name_len = 0;
      PD_LOG_WARN(
          "fabric: endpoint name {} was held by a stale region (a killed process with "
          "this pid?); opening another endpoint",
          std::string_view(name, strnlen(name, name_len)));
      continue;
    }
    if (rc != 0) return FabricError("fi_enable", rc);
    name_len = sizeof(name);
    if ((rc = fi_getname(&raw->fid, name, &name_len)) != 0) return FabricError("fi_getname", rc);
    out.name.assign(name, name_len);
    return out;
  }
}

}  // namespace pdserve::fabric
